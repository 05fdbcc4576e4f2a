"""The durable alert outbox: SQLite in ``state_dir``, written before anything else.

Why SQLite and not paho's queue: alerts matter most while the link is down, and an outage
can outlast the process (``kill -9``, OOM, a power cut on a factory floor). paho's
in-memory queue dies with the process; a row committed here survives it.

- WAL journal with ``synchronous=FULL``: :meth:`Outbox.add` returns only after the row is
  on disk, so an alert the agent acknowledged (log line, ``alert test`` reply) is never
  lost to a crash or a reboot.
- Order: ``seq`` is an ``AUTOINCREMENT`` key, never reused, so :meth:`Outbox.oldest` is
  the order alerts were raised in, across restarts. A row is deleted only once the broker
  acknowledged it (PUBACK), so delivery is at-least-once.
- Bounds: at most ``max_count`` rows (the oldest go first) and none older than
  ``max_age`` seconds. The age is measured on the wall clock, the one clock that survives
  a reboot (the monotonic clock restarts at boot). Rows of kind ``alerts.dropped`` (the one
  alert that reports drops) are exempt, so the report of a loss is never itself lost.
- A corrupt database file is moved aside (``*.corrupt-<time>``) and a new one started, with
  an error in the log: an unreadable outbox must not stop the agent from watching.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DROPPED_KIND = "alerts.dropped"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    id      TEXT NOT NULL UNIQUE,
    kind    TEXT NOT NULL,
    raised  REAL NOT NULL,
    payload BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


class OutboxError(Exception):
    """The outbox database cannot be used (the message names the file)."""


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    id: str
    kind: str
    raised: float
    """Wall-clock seconds since the epoch when the alert was raised."""
    payload: bytes


class Outbox:
    def __init__(self, path: str | Path, *, max_count: int, max_age: float,
                 wall: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.max_count, self.max_age = max_count, max_age
        self.wall = wall
        self.existed = self.path.exists()
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as err:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(wall())}")
            log.error("alert outbox %s is unreadable (%s); moved aside to %s, starting empty",
                      self.path, err, aside)
            try:
                self.path.rename(aside)
                for suffix in ("-wal", "-shm"):
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
                self._db = self._open()
            except (OSError, sqlite3.DatabaseError) as again:
                raise OutboxError(f"cannot use the alert outbox {self.path}: {again}") from again
        except OSError as err:
            raise OutboxError(f"cannot open the alert outbox {self.path}: {err}") from err

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.DatabaseError(f"cannot switch to WAL (journal_mode={mode})")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def close(self) -> None:
        self._db.close()

    # --- writing ------------------------------------------------------------------------

    def add(self, alert_id: str, kind: str, raised: float, payload: bytes) -> int:
        """Store one alert durably; return how many old alerts the count bound dropped."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("INSERT INTO outbox (id, kind, raised, payload) VALUES (?, ?, ?, ?)",
                       (alert_id, kind, raised, payload))
            dropped = self._enforce_count()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return dropped

    def _enforce_count(self) -> int:
        count = self._db.execute("SELECT COUNT(*) FROM outbox WHERE kind != ?",
                                 (DROPPED_KIND,)).fetchone()[0]
        excess = int(count) - self.max_count
        if excess <= 0:
            return 0
        self._db.execute("DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE "
                         "kind != ? ORDER BY seq LIMIT ?)", (DROPPED_KIND, excess))
        return excess

    def prune(self) -> int:
        """Drop alerts older than ``max_age``; return how many."""
        cur = self._db.execute("DELETE FROM outbox WHERE raised < ? AND kind != ?",
                               (self.wall() - self.max_age, DROPPED_KIND))
        return int(cur.rowcount)

    def delete(self, seq: int) -> None:
        """The broker acknowledged this alert."""
        self._db.execute("DELETE FROM outbox WHERE seq = ?", (seq,))

    def replace(self, seq: int, payload: bytes) -> bool:
        """Update an undelivered alert in place (the running ``alerts.dropped`` count)."""
        cur = self._db.execute("UPDATE outbox SET payload = ? WHERE seq = ?", (payload, seq))
        return cur.rowcount == 1

    # --- reading ------------------------------------------------------------------------

    def oldest(self) -> Entry | None:
        row = self._db.execute("SELECT seq, id, kind, raised, payload FROM outbox "
                               "ORDER BY seq LIMIT 1").fetchone()
        return Entry(row[0], row[1], row[2], row[3], bytes(row[4])) if row else None

    def latest(self, kind: str) -> Entry | None:
        row = self._db.execute("SELECT seq, id, kind, raised, payload FROM outbox "
                               "WHERE kind = ? ORDER BY seq DESC LIMIT 1", (kind,)).fetchone()
        return Entry(row[0], row[1], row[2], row[3], bytes(row[4])) if row else None

    def entries(self) -> list[Entry]:
        rows = self._db.execute("SELECT seq, id, kind, raised, payload FROM outbox "
                                "ORDER BY seq").fetchall()
        return [Entry(r[0], r[1], r[2], r[3], bytes(r[4])) for r in rows]

    def depth(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    # --- small durable facts (open problems, counters) ----------------------------------

    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO "
                         "UPDATE SET value = excluded.value", (key, value))
