"""State: ``state_dir`` is writable and has room, the alert outbox can be read, and no state
file is of a newer format than this build reads (``state.formats``: a downgrade).

Nothing permanent is written: writability is ``os.access`` plus one temporary file created
and removed at once (a read-only filesystem or a full disk shows there, where
``os.access`` alone can lie), and the outbox is opened read-only: SQLite ``mode=ro`` while
the agent has it open (its WAL files exist), else ``immutable=1`` — a read-only open of a
WAL database would otherwise leave new ``-wal``/``-shm`` files behind.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from edgeheal.agent.alerts import outbox_file
from edgeheal.agent.alerts.engine import OUTBOX_FILE
from edgeheal.agent.remediation import history
from edgeheal.base import statefile
from edgeheal.tools.doctor.finding import Finding, fail, ok, warn

if TYPE_CHECKING:
    from edgeheal.config import Config
    from edgeheal.tools.doctor.system import System

FREE_WARN = 64 << 20
"""Bytes free below which the state check warns (a full outbox is about 10 MB)."""
FREE_FAIL = 16 << 20
"""Bytes free below which it fails: the outbox and the history may not fit."""
STALE_OUTBOX = 600.0
"""Seconds: an alert older than this still in the outbox is not being delivered."""


def directory(config: Config) -> Finding:
    name = "state.dir"
    path = Path(config.agent.state_dir)
    if not path.exists():
        parent = next((p for p in path.parents if p.exists()), Path("/"))
        return warn(name, f"{path} does not exist yet (systemd's StateDirectory= creates it "
                    f"when edgeheal.service starts; {parent} exists)",
                    "start the service once (`systemctl start edgeheal`), or create it: "
                    f"`install -d -m 0700 -o edgeheal -g edgeheal {path}`", path=str(path))
    if not path.is_dir():
        return fail(name, f"{path} is not a directory", "point [agent] state_dir at a "
                    "directory", path=str(path))
    if not os.access(path, os.W_OK | os.X_OK):
        return fail(name, f"{path} is not writable", f"`chown edgeheal: {path}`",
                    path=str(path))
    try:
        fd, temp = tempfile.mkstemp(prefix=".doctor-", dir=path)
    except OSError as err:
        return fail(name, f"{path}: cannot create a file: {err.strerror}",
                    "remount the filesystem read-write or free space", path=str(path))
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(temp)
    stat = os.statvfs(path)
    free = stat.f_bavail * stat.f_frsize
    detail = {"path": str(path), "free_bytes": free}
    text = f"{path} writable, {free / 2**20:.0f} MiB free"
    if free < FREE_FAIL:
        return fail(name, text, f"free space on {path}'s filesystem (at least "
                    f"{FREE_WARN >> 20} MiB)", **detail)
    if free < FREE_WARN:
        return warn(name, text, f"free space on {path}'s filesystem (at least "
                    f"{FREE_WARN >> 20} MiB)", **detail)
    return ok(name, text, **detail)


def outbox(config: Config, system: System) -> Finding:
    """Depth and oldest entry of the alert outbox, read-only."""
    name = "state.outbox"
    path = Path(config.agent.state_dir) / OUTBOX_FILE
    if not path.exists():
        return ok(name, f"no outbox yet ({path}; the agent creates it)", depth=0)
    # A WAL database opened read-only still gets -wal and -shm files unless a writer has
    # them open already: with no -wal present (the agent is not running) nothing can
    # change under us, so read it as immutable and create nothing.
    wal = path.with_name(path.name + "-wal").exists()
    try:
        db = sqlite3.connect(f"{path.as_uri()}?{'mode=ro' if wal else 'immutable=1'}",
                             uri=True, timeout=0.5)
    except sqlite3.Error as err:
        return fail(name, f"{path}: cannot open: {err}", _FIX, path=str(path))
    try:
        depth, oldest = db.execute("SELECT COUNT(*), MIN(raised) FROM outbox").fetchone()
    except sqlite3.Error as err:
        return fail(name, f"{path}: cannot read: {err}", _FIX, path=str(path))
    finally:
        db.close()
    if not depth:
        return ok(name, f"{path}: empty (every alert delivered)", depth=0)
    age = max(0.0, system.wall() - float(oldest))
    detail = {"depth": int(depth), "oldest_age_seconds": round(age, 1)}
    text = f"{depth} alert(s) waiting, the oldest {_age(age)} old"
    if age > STALE_OUTBOX:
        return warn(name, text + ": alerts are not being delivered",
                    "check the [alerts] target's reachability below and "
                    "`journalctl -u edgeheal | grep alert`", **detail)
    return ok(name, text, **detail)


HISTORY_FILES = ("remediation-history.json", "uplink-history.json")
"""The ladders' history files (Flannel's, the uplink's), in the format of ``history``."""


def formats(config: Config) -> Finding:
    """Each state file's format against what this build reads (read-only; a damaged file is
    the agent's to move aside, not this row's)."""
    name = "state.formats"
    directory = Path(config.agent.state_dir)
    found: dict[str, int] = {}
    newer: list[statefile.Newer] = []
    version = outbox_file.format_of(directory / OUTBOX_FILE)
    if version is not None:
        found[OUTBOX_FILE] = max(version, 1)  # 0: release 0.2.0's, format 1
        if version > outbox_file.FORMAT:
            newer.append(statefile.Newer(OUTBOX_FILE, version, outbox_file.FORMAT))
    for file in HISTORY_FILES:
        try:
            data = statefile.read(directory / file)
            if data is not None:
                found[file] = statefile.format_of(data, what=file, known=history.FORMAT)
        except statefile.NewerFormat as err:
            newer.append(err.newer)
        except (statefile.StateFileError, OSError):
            continue
    if newer:
        return warn(name, "; ".join(n.describe() for n in newer),
                    "install the edgeheal release that wrote them again, or move the files "
                    "aside (the agent then starts that state afresh)",
                    newer=[n.detail() for n in newer])
    if not found:
        return ok(name, "no state files yet")
    return ok(name, ", ".join(f"{f} format {v}" for f, v in found.items())
              + " (this build reads them)", formats=found)


_FIX = ("the agent moves a corrupt outbox aside by itself on start; check the file's owner "
        "(edgeheal) and the filesystem")


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
