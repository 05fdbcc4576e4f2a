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
- Faults are told apart (:func:`classify`): only a *corrupt* file ("file is not a
  database", "malformed") is moved aside (``*.corrupt-<time>``) and a new one started; the
  alerts it held are counted as dropped when they can be counted. A state directory that
  is not writable (``permission``, ``read_only``), a ``locked`` database, a ``disk_full``
  filesystem or an ``io_error`` leave the file alone: alerts are then held in a bounded
  memory queue (:mod:`~edgeheal.agent.alerts.outbox_memory`), delivered from there if the
  broker is reachable, and written to the database as soon as a retry (every
  :data:`RETRY_EVERY` seconds) succeeds. :attr:`Outbox.fault` says which fault is in
  force (``/status``, metrics); the outbox never raises for one, so raising an alert can
  never crash a check loop. A file of a newer format (``PRAGMA user_version``, a downgrade)
  is the fault ``newer_format``: held in memory the same way, and the file is never opened
  for writing, moved aside or counted (:attr:`Outbox.newer`). Rows of the wrong types,
  ``seq_exhausted`` and the format: ``outbox_file``.

The queue is here, the file in ``outbox_file``, what memory holds meanwhile in
``outbox_memory``, the fault classes in ``outbox_faults``; an :class:`Outbox` blocks on
fsync, so the agent runs it off its loop (``offloop``).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from edgeheal.agent.alerts import outbox_file as db_file
from edgeheal.agent.alerts.outbox_faults import FAULTS, classify
from edgeheal.agent.alerts.outbox_file import Entry, OutboxError
from edgeheal.agent.alerts.outbox_memory import MEMORY_MAX, MemoryQueue
from edgeheal.base.statefile import Newer, NewerFormat, Reset

log = logging.getLogger("edgeheal.alerts.outbox")  # the name operators grep for

DROPPED_KIND = "alerts.dropped"

RETRY_EVERY = 5.0
"""Seconds between attempts to write the memory queue to a faulty database."""

__all__ = ["DROPPED_KIND", "FAULTS", "RETRY_EVERY", "Entry", "Outbox", "OutboxError",
           "classify"]


class Outbox:
    """The outbox: SQLite when it can be written, a bounded memory queue when it cannot.

    Entries held in memory (:class:`~edgeheal.agent.alerts.outbox_memory.MemoryQueue`)
    have negative ``seq`` numbers; they follow the database's rows and move into it, in
    order, when it works again.
    """

    def __init__(self, path: str | Path, *, max_count: int, max_age: float,
                 wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic,
                 memory_max: int = MEMORY_MAX) -> None:
        self.path = Path(path)
        self.max_count, self.max_age = max_count, max_age
        self.wall, self.clock = wall, clock
        self.memory_max = max(1, min(memory_max, max_count))
        self._memory = MemoryQueue(self.memory_max, exempt=DROPPED_KIND)
        self.fault: str | None = None
        """None while the database is usable; else one of :data:`FAULTS`."""
        self.fault_message = ""
        self.moved_aside: Path | None = None
        self._db: sqlite3.Connection | None = None
        self._db_depth = 0
        self._last_retry = -1e18
        self._drops: dict[str, int] = {}
        self.lost_unknown = False  # a corrupt file moved aside, its alerts not countable
        self.resets: list[Reset] = []
        self.newer: Newer | None = None
        """The file is of a newer format (a downgrade): never written while this is set."""
        try:
            self.existed = self.path.exists()
        except OSError:
            self.existed = True
        self._connect()

    # --- faults ---------------------------------------------------------------------------

    def _connect(self) -> bool:
        try:
            self._db = db_file.open_db(self.path)
            bad, aside = db_file.set_aside_bad_rows(self._db, self.path, self.wall())
        except NewerFormat as err:
            self._close_db()
            if self.fault != "newer_format":
                log.error("alert outbox %s; alerts are kept in memory (at most %d)",
                          err.newer.describe(), self.memory_max)
            self.newer = err.newer
            self.fault, self.fault_message = "newer_format", str(err)
            self._last_retry = self.clock()
            return False
        except (sqlite3.Error, OSError) as err:
            self._close_db()
            return self._fail(err, "opening")
        self.newer = None  # (a newer file an operator moved aside meanwhile)
        if aside is not None:  # rows of the wrong types: said (agent.state_reset), counted
            self.resets.append(aside)
            self._drops["outbox_corrupt"] = self._drops.get("outbox_corrupt", 0) + bad
        self._db_depth = self._count()
        return True

    def _close_db(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None

    def _fail(self, err: BaseException, doing: str) -> bool:
        """Note a fault; a corrupt file is moved aside and a new one started. Returns True
        if the database is usable again."""
        fault = classify(err, self.path.parent)
        if fault == "disk_full" and db_file.seq_exhausted(self._db):
            fault, err = "seq_exhausted", OutboxError(db_file.SEQ_EXHAUSTED)
        if fault == "corrupt":
            return self._move_aside(err)
        if self.fault != fault:
            log.error("alert outbox %s cannot be written (%s while %s: %s); alerts are kept "
                      "in memory (at most %d) and written when it works again", self.path,
                      fault, doing, err, self.memory_max)
        self.fault, self.fault_message = fault, f"{doing}: {err}"
        self._last_retry = self.clock()
        return False

    def _move_aside(self, err: BaseException) -> bool:
        self._close_db()
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(self.wall())}")
        try:
            self.path.rename(aside)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        except OSError as again:
            self.fault, self.fault_message = "corrupt", f"{err}; cannot move it aside: {again}"
            log.error("alert outbox %s is corrupt (%s) and cannot be moved aside (%s); "
                      "alerts are kept in memory", self.path, err, again.strerror or again)
            return False
        lost = db_file.count_rows(aside)
        if lost is None:
            lost, self.lost_unknown = self._db_depth, self._db_depth == 0
        log.error("alert outbox %s is corrupt (%s); moved aside to %s and started a new one; "
                  "%s undelivered alert(s) in it are lost", self.path, err, aside,
                  "an unknown number of" if self.lost_unknown else lost)
        self.moved_aside = aside
        if lost:
            self._drops["outbox_corrupt"] = self._drops.get("outbox_corrupt", 0) + lost
        self._memory.acked.clear()
        self._db_depth = 0
        self.fault = None
        try:
            self._db = db_file.open_db(self.path)
        except (sqlite3.Error, OSError) as again:
            self._db = None
            return self._fail(again, "starting a new database")
        return self._flush()

    def _ok(self) -> None:
        if self.fault is not None:
            log.warning("alert outbox %s works again (was %s)", self.path, self.fault)
        self.fault, self.fault_message = None, ""

    def retry(self, *, force: bool = False) -> bool:
        """Try to write what memory holds (at most every :data:`RETRY_EVERY` seconds unless
        ``force``); True when nothing is left in memory."""
        if self.fault is None and self._memory.holds_nothing:
            return True
        if not force and self.clock() - self._last_retry < RETRY_EVERY:
            return False
        self._last_retry = self.clock()
        if self._db is None and not self._connect():
            return False
        return self._flush()

    def _flush(self) -> bool:
        db, memory = self._db, self._memory
        if db is None:
            return False
        try:
            if self.fault == "seq_exhausted":
                db_file.restart_seq_if_empty(db)
            db.execute("BEGIN IMMEDIATE")
            moved = []
            for entry in memory.entries:
                cur = db.execute("INSERT INTO outbox (id, kind, raised, payload) VALUES "
                                 "(?, ?, ?, ?) ON CONFLICT(id) DO NOTHING",
                                 (entry.id, entry.kind, entry.raised, entry.payload))
                if cur.lastrowid and cur.rowcount == 1:
                    moved.append((entry.seq, int(cur.lastrowid)))
            for seq in memory.acked:
                db.execute("DELETE FROM outbox WHERE seq = ?", (seq,))
            for key, value in memory.meta.items():
                db_file.put_meta(db, key, value)
            db_file.put_meta(db, "written", repr(self.wall()))  # proves the file is writable
            db.execute("COMMIT")
        except (sqlite3.Error, OSError) as err:
            db_file.rollback(db)
            return self._fail(err, "writing the memory queue")
        written = len(memory.entries)
        memory.written(moved)
        self._db_depth = self._count()
        if written:
            log.warning("alert outbox %s: wrote %d alert(s) held in memory", self.path, written)
        self._ok()
        return True

    def take_drops(self) -> dict[str, int]:
        """Alerts dropped since the last call, by cause (``memory_queue``,
        ``outbox_corrupt``); the count bound's drops are :meth:`add`'s return value."""
        drops, self._drops = self._drops, {}
        return drops

    @property
    def memory_depth(self) -> int:
        return len(self._memory.entries)

    def close(self) -> int:
        """Write what memory holds if possible, close; returns alerts lost with memory."""
        self.retry(force=True)
        held = self._memory.entries
        lost = self._memory.lost()
        if held:
            log.error("alert outbox %s: %d alert(s) held in memory could not be written "
                      "(%s) and are lost with this process", self.path, len(held),
                      self.fault)
        self._close_db()
        return lost

    # --- writing ------------------------------------------------------------------------

    def add(self, alert_id: str, kind: str, raised: float, payload: bytes) -> int:
        """Store one alert (durably if the database works, else in memory); return how many
        old alerts the count bound dropped. Never raises for a database fault."""
        if self._memory.entries or self.fault is not None:
            self.retry()
        db = self._db
        if db is not None and not self._memory.entries:
            try:
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO outbox (id, kind, raised, payload) VALUES "
                           "(?, ?, ?, ?)", (alert_id, kind, raised, payload))
                dropped = db_file.enforce_count(db, self.max_count, DROPPED_KIND)
                db.execute("COMMIT")
            except (sqlite3.Error, OSError) as err:
                db_file.rollback(db)
                if self._fail(err, "adding an alert"):
                    return self.add(alert_id, kind, raised, payload)  # a new, empty file
            else:
                self._db_depth += 1 - dropped
                self._ok()
                return dropped
        dropped = self._memory.hold(alert_id, kind, raised, payload)
        if dropped:  # counted as the memory bound's (take_drops), not the count bound's
            self._drops["memory_queue"] = self._drops.get("memory_queue", 0) + dropped
        return 0

    def prune(self) -> int:
        """Drop alerts older than ``max_age``; return how many."""
        cutoff = self.wall() - self.max_age
        pruned = self._memory.prune(cutoff)
        if self._db is not None:
            try:
                cur = self._db.execute("DELETE FROM outbox WHERE raised < ? AND kind != ?",
                                       (cutoff, DROPPED_KIND))
            except (sqlite3.Error, OSError) as err:
                self._fail(err, "pruning")
            else:
                pruned += int(cur.rowcount)
                self._db_depth = max(0, self._db_depth - int(cur.rowcount))
        return pruned

    def delete(self, seq: int) -> None:
        """The broker acknowledged this alert."""
        seq = self._memory.current(seq, forget=True)
        if seq < 0:
            self._memory.delete(seq)
            return
        if self._db is not None:
            try:
                self._db.execute("DELETE FROM outbox WHERE seq = ?", (seq,))
            except (sqlite3.Error, OSError) as err:
                self._fail(err, "deleting a delivered alert")
            else:
                self._db_depth = max(0, self._db_depth - 1)
                return
        self._memory.acked.add(seq)

    def replace(self, seq: int, payload: bytes) -> bool:
        """Update an undelivered alert in place (the running ``alerts.dropped`` count)."""
        seq = self._memory.current(seq)
        if seq < 0:
            return self._memory.replace(seq, payload)
        if self._db is None or seq in self._memory.acked:
            return False
        try:
            cur = self._db.execute("UPDATE outbox SET payload = ? WHERE seq = ?",
                                   (payload, seq))
        except (sqlite3.Error, OSError) as err:
            self._fail(err, "updating an alert")
            return False
        return cur.rowcount == 1

    # --- reading ------------------------------------------------------------------------

    def _rows(self, sql: str, args: tuple[object, ...] = ()) -> list[Entry]:
        if self._db is None:
            return []
        try:
            rows = self._db.execute(sql, args).fetchall()
        except (sqlite3.Error, OSError) as err:
            self._fail(err, "reading")
            return []
        acked = self._memory.acked
        return [e for e in map(db_file.entry, rows) if e is not None and e.seq not in acked]

    def oldest(self) -> Entry | None:
        rows = self._rows("SELECT seq, id, kind, raised, payload FROM outbox ORDER BY seq "
                          "LIMIT ?", (len(self._memory.acked) + 1,))
        if rows:
            return rows[0]
        held = self._memory.entries
        return held[0] if held else None

    def latest(self, kind: str) -> Entry | None:
        held = self._memory.latest(kind)
        if held is not None:
            return held
        rows = self._rows("SELECT seq, id, kind, raised, payload FROM outbox WHERE kind = ? "
                          "ORDER BY seq DESC LIMIT 1", (kind,))
        return rows[0] if rows else None

    def entries(self) -> list[Entry]:
        return self._rows("SELECT seq, id, kind, raised, payload FROM outbox ORDER BY seq") \
            + list(self._memory.entries)

    def _count(self) -> int:
        if self._db is None:
            return self._db_depth
        try:
            return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
        except (sqlite3.Error, OSError) as err:
            self._fail(err, "counting")
            return self._db_depth

    def depth(self) -> int:
        """Undelivered alerts, in the database and in memory."""
        self._db_depth = self._count()
        return max(0, self._db_depth - len(self._memory.acked)) + len(self._memory.entries)

    # --- small durable facts (open problems, counters) ----------------------------------

    def get_meta(self, key: str) -> str | None:
        if key in self._memory.meta:
            return self._memory.meta[key]
        if self._db is None:
            return None
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        except (sqlite3.Error, OSError) as err:
            self._fail(err, "reading")
            return None
        return str(row[0]) if row else None

    def set_meta(self, key: str, value: str) -> None:
        if self._db is not None and not self._memory.meta:
            try:
                db_file.put_meta(self._db, key, value)
            except (sqlite3.Error, OSError) as err:
                self._fail(err, "writing the open problems")
            else:
                return
        self._memory.meta[key] = value
