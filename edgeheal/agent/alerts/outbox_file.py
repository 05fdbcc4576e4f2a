"""The outbox's SQLite file: its schema, how it is opened, and what survives a fault.

Why apart from the queue (:mod:`edgeheal.agent.alerts.outbox`): opening decides the
durability promise (WAL journal, ``synchronous=FULL``: a committed row is on disk) and
refuses a file that cannot hold it (no WAL means the directory is not writable); the
helpers here are what fault recovery needs (a rollback that tolerates SQLite having ended
the transaction itself, and a read-only count of the rows in a file moved aside).

Two faults are the file's own, not the disk's. Rows of the wrong types (a TEXT or NULL
payload: SQLite's column types are only affinities) are moved aside at open
(:func:`set_aside_bad_rows`), counted as dropped and said as ``agent.state_reset``
(:attr:`Outbox.resets`). An AUTOINCREMENT that reached :data:`SEQ_MAX` fails with
SQLITE_FULL, "disk is full": the outbox calls it ``seq_exhausted`` (:func:`seq_exhausted`),
holds new alerts in memory while the queued ones drain, then numbers from 1 again
(:func:`restart_seq_if_empty`).

**Format.** ``PRAGMA user_version`` is the file's format, :data:`FORMAT`. Release 0.2.0
left it 0: the same schema, so :func:`open_db` reads such a file as it is and stamps it 1.
A file of a newer format (a downgrade) is never opened for writing: :func:`open_db` looks at
it read-only first and raises :class:`~edgeheal.base.statefile.NewerFormat` (the outbox then
holds alerts in memory and leaves the file alone; :mod:`edgeheal.base.statefile`).

The connection is made with ``check_same_thread=False``: the agent uses it from the
outbox's one writer thread (:mod:`edgeheal.base.writer`), which may not be the thread that
opened it; every use is serialised by that thread, never concurrent.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from edgeheal.base.statefile import Newer, NewerFormat, Reset

log = logging.getLogger("edgeheal.alerts.outbox")  # the outbox's, as operators grep for it

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


FORMAT = 1
"""The outbox file's format (``PRAGMA user_version``; 0 is release 0.2.0's, the same one)."""

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


def format_of(path: Path) -> int | None:
    """The file's ``user_version``, read without changing anything (None: no file, or
    SQLite cannot read it: :func:`open_db` then tells why). ``mode=ro`` while a writer has
    it open (its ``-wal`` exists), else ``immutable=1``: a read-only open of a WAL database
    would otherwise leave new ``-wal``/``-shm`` files behind."""
    if not path.exists():
        return None
    wal = path.with_name(path.name + "-wal").exists()
    try:
        uri = f"{path.absolute().as_uri()}?{'mode=ro' if wal else 'immutable=1'}"
        db = sqlite3.connect(uri, uri=True, timeout=LOCK_WAIT)
    except sqlite3.Error:
        return None
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error:
        return None
    finally:
        db.close()


def open_db(path: Path) -> sqlite3.Connection:
    """Open (create) the outbox file in WAL mode with ``synchronous=FULL``; raise
    :class:`sqlite3.Error` or :class:`OSError` if it cannot hold that promise, and
    :class:`NewerFormat` (touching nothing) if it is of a newer format than :data:`FORMAT`."""
    found = format_of(path)
    if found is not None and found > FORMAT:
        raise NewerFormat(Newer(path.name, found, FORMAT))
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
        if int(db.execute("PRAGMA user_version").fetchone()[0]) < FORMAT:
            db.execute(f"PRAGMA user_version = {FORMAT}")  # new, or 0.2.0's: the same schema
    except BaseException:
        db.close()
        raise
    return db


def enforce_count(db: sqlite3.Connection, max_count: int, exempt: str) -> int:
    """Delete the oldest rows beyond ``max_count`` (rows of kind ``exempt`` neither count
    nor go); return how many."""
    count = db.execute("SELECT COUNT(*) FROM outbox WHERE kind != ?", (exempt,)).fetchone()[0]
    excess = int(count) - max_count
    if excess <= 0:
        return 0
    db.execute("DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE "
               "kind != ? ORDER BY seq LIMIT ?)", (exempt, excess))
    return excess


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


_BAD = ("NOT (typeof(seq) = 'integer' AND typeof(id) = 'text' AND typeof(kind) = 'text' "
        "AND typeof(raised) IN ('real', 'integer') AND typeof(payload) = 'blob')")
_COUNT_BAD = "SELECT COUNT(*) FROM outbox WHERE " + _BAD  # noqa: S608 (constants only)
_KEEP_BAD = "CREATE TABLE aside.outbox AS SELECT * FROM main.outbox WHERE " + _BAD  # noqa: S608
_DELETE_BAD = "DELETE FROM outbox WHERE " + _BAD  # noqa: S608
SEQ_MAX = 2**63 - 1
"""The largest ``seq``: past it, AUTOINCREMENT fails with SQLITE_FULL ("disk is full")."""
SEQ_EXHAUSTED = ("its row numbers (AUTOINCREMENT) are used up, not the disk: the queued "
                 "alerts drain, then numbering starts again from 1")


def entry(row: tuple[object, ...]) -> Entry | None:
    """The :class:`Entry` of a row read back, or None if its values have the wrong types."""
    seq, alert_id, kind, raised, payload = row
    if (type(seq) is not int or not isinstance(alert_id, str) or not isinstance(kind, str)
            or not isinstance(raised, int | float) or isinstance(raised, bool)
            or not isinstance(payload, bytes)):
        return None
    return Entry(seq, alert_id, kind, float(raised), payload)


def set_aside_bad_rows(db: sqlite3.Connection, path: Path,
                       wall: float) -> tuple[int, Reset | None]:
    """Move the rows of types the outbox never writes into ``<file>.corrupt-<wall>`` (a table
    ``outbox`` there, for a human) and delete them; return how many, and the
    :class:`Reset` that says so (None: there were none). The good rows stay, in order."""
    bad = int(db.execute(_COUNT_BAD).fetchone()[0])
    if not bad:
        return 0, None
    aside = path.with_name(f"{path.name}.corrupt-{int(wall)}")
    try:
        db.execute("ATTACH DATABASE ? AS aside", (str(aside),))
        try:
            db.execute(_KEEP_BAD)
        finally:
            db.execute("DETACH DATABASE aside")
    except sqlite3.Error:
        aside = Path()
    db.execute(_DELETE_BAD)
    reason = f"{bad} row(s) of the wrong types (e.g. a payload that is not a BLOB)"
    log.error("alert outbox %s: %s, moved aside to %s", path, reason, aside)
    return bad, Reset(path.name, reason, aside.name or None)


def seq_exhausted(db: sqlite3.Connection | None) -> bool:
    """The outbox's AUTOINCREMENT has reached :data:`SEQ_MAX` (so a new row cannot be
    numbered, which SQLite reports as a full disk)."""
    if db is None:
        return False
    try:
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'").fetchone()
    except sqlite3.Error:
        return False
    return row is not None and isinstance(row[0], int) and row[0] >= SEQ_MAX


def restart_seq_if_empty(db: sqlite3.Connection) -> bool:
    """Number rows from 1 again if the outbox holds none (nothing can be in flight under an
    old number); True if it did."""
    if db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]:
        return False
    db.execute("DELETE FROM sqlite_sequence WHERE name = 'outbox'")
    return True
