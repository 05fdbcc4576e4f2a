"""The outbox's SQLite file: its schema, how it is opened, and what survives a fault.

Why apart from the queue (:mod:`edgeheal.agent.alerts.outbox`): opening decides the
durability promise (WAL journal, ``synchronous=FULL``: a committed row is on disk) and
refuses a file that cannot hold it (no WAL means the directory is not writable); the
helpers here are what fault recovery needs (a rollback that tolerates SQLite having ended
the transaction itself, and a read-only count of the rows in a file moved aside).

The connection is made with ``check_same_thread=False``: the agent uses it from the
outbox's one writer thread (:mod:`edgeheal.base.writer`), which may not be the thread that
opened it; every use is serialised by that thread, never concurrent.
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
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


CACHE_KIB = 512
"""SQLite's page cache, KiB (its default is 2000). Every :meth:`Outbox.add` counts the rows,
so a backlog of ``max_count`` alerts (about 7 MB) would fill the default cache: 2.1 MB of
RSS against 0.5 MB at this size, and an ``add`` no slower, its fsync dominates
(docs/footprint.md)."""
LOCK_WAIT = 0.5
"""Seconds SQLite waits for a lock held by another process (it blocks the outbox's writer
thread, never the event loop)."""


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


def open_db(path: Path) -> sqlite3.Connection:
    """Open (create) the outbox file in WAL mode with ``synchronous=FULL``; raise
    :class:`sqlite3.Error` or :class:`OSError` if it cannot hold that promise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, timeout=LOCK_WAIT,
                         check_same_thread=False)
    try:
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(
                f"cannot switch to WAL (journal_mode={mode}): the directory is not "
                "writable")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        db.executescript(SCHEMA)
        db.execute("SELECT COUNT(*) FROM outbox").fetchone()
    except BaseException:
        db.close()
        raise
    return db


def put_meta(db: sqlite3.Connection, key: str, value: str) -> None:
    db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO "
               "UPDATE SET value = excluded.value", (key, value))


def rollback(db: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open (SQLite ends one itself on SQLITE_FULL)."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def count_rows(path: Path) -> int | None:
    """Undelivered rows in a database moved aside, if it can still be read."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        return int(db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
    except sqlite3.Error:
        return None
    finally:
        db.close()
