"""Issue 17, findings 6 and 7: the outbox tells its faults apart and loses nothing unseen.

Before: any database error at start-up counted as corruption (a permission error or a
read-only state directory renamed the outbox away and started empty, with no count and no
alert), and on a full filesystem raising an alert crashed the check loops (``database or
disk is full``, then ``cannot rollback - no transaction is active``) while the outage's
alerts never existed. Now only a corrupt file is moved aside (and the loss alerted); the
other faults leave the file alone, keep alerts in a bounded memory queue that is retried,
say which fault is in force in ``/status`` and ``edgeheal_alerts_outbox_fault``, and count
and alert whatever memory could not hold. The read-only and full filesystems are real
tmpfs mounts (unmounted even when a test fails); the permission case runs as ``nobody``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeheal.agent.alerts.engine import OUTBOX_FILE, AlertEngine
from edgeheal.agent.alerts.outbox import Outbox, classify
from edgeheal.agent.alerts.outbox_memory import MEMORY_MAX
from edgeheal.agent.alerts.payload import Alert
from edgeheal.model import State
from tests.alerts.support import harness, snapshot, status

pytestmark = pytest.mark.netns  # root: mounts and setuid


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                    str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def _fill(path: Path) -> Path:
    """Write zeros until the filesystem is full; return the filler (delete to free)."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            for _ in range(100_000):  # bounded: 400 MB at most
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    return filler


def _kinds(engine: AlertEngine) -> list[str]:
    return [Alert.decode(e.payload).kind for e in engine.outbox.entries()]


def _fault(engine: AlertEngine, fault: str) -> float | None:
    return engine.ctx.registry.get_sample_value("edgeheal_alerts_outbox_fault",
                                                {"fault": fault})


def test_sqlite_and_filesystem_errors_are_classified() -> None:
    assert classify(sqlite3.DatabaseError("file is not a database")) == "corrupt"
    assert classify(sqlite3.DatabaseError("database disk image is malformed")) == "corrupt"
    assert classify(sqlite3.OperationalError("database or disk is full")) == "disk_full"
    assert classify(sqlite3.OperationalError("attempt to write a readonly database")) \
        == "read_only"
    assert classify(sqlite3.OperationalError("database is locked")) == "locked"
    assert classify(PermissionError(errno.EACCES, "denied")) == "permission"
    assert classify(OSError(errno.EROFS, "read-only")) == "read_only"
    assert classify(OSError(errno.ENOSPC, "full")) == "disk_full"
    assert classify(OSError(errno.EIO, "io")) == "io_error"


def test_a_corrupt_outbox_is_moved_aside_and_the_loss_is_alerted(tmp_path: Path) -> None:
    h = harness(tmp_path)
    engine = AlertEngine(h.ctx)
    for _ in range(3):
        engine.raise_alert("agent.test", "x")
    engine.outbox.close()
    path = tmp_path / "state" / OUTBOX_FILE
    with path.open("r+b") as f:
        f.write(b"not a database, not at all")
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    again = AlertEngine(harness(tmp_path).ctx)
    assert list((tmp_path / "state").glob(f"{OUTBOX_FILE}.corrupt-*"))
    dropped = [Alert.decode(e.payload) for e in again.outbox.entries()
               if e.kind == "alerts.dropped"]
    assert len(dropped) == 1
    assert dropped[0].detail["bound"] == "outbox_corrupt"
    assert dropped[0].detail["unknown"] is True
    assert again.outbox.fault is None
    again.outbox.close()


def test_a_read_only_state_dir_keeps_the_file_and_alerts_in_memory(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "state") as state:
        first = AlertEngine(harness(tmp_path).ctx)
        first.raise_alert("agent.test", "before")
        first.outbox.close()
        _remount(state, "ro")
        h = harness(tmp_path)
        engine = AlertEngine(h.ctx)  # no exception, no false "moved aside"
        assert (state / OUTBOX_FILE).exists()
        assert not list(state.glob("*.corrupt-*"))
        assert engine.outbox.fault == "read_only"
        for i in range(3):
            engine.raise_alert("agent.test", f"during {i}")
        view = engine.view()["outbox"]
        assert view["state"] == "read_only"
        assert view["memory_queue"] == 4  # agent.started and three tests
        assert _fault(engine, "read_only") == 1
        assert _fault(engine, "disk_full") == 0
        _remount(state, "rw")
        h.clock.advance(60)
        engine._prune()  # what the delivery loop does while it waits
        assert engine.outbox.fault is None
        assert engine.view()["outbox"] == {"state": "ok", "message": "", "memory_queue": 0}
        messages = [Alert.decode(e.payload).message for e in engine.outbox.entries()
                    if e.kind == "agent.test"]
        assert messages == ["before", "during 0", "during 1", "during 2"]
        assert _fault(engine, "read_only") == 0
        engine.outbox.close()


def test_a_permission_error_is_not_corruption(tmp_path: Path) -> None:
    state = tmp_path / "state"
    box = Outbox(state / OUTBOX_FILE, max_count=10, max_age=60)
    box.add("a1", "agent.test", box.wall(), b"{}")
    box.close()
    os.chmod(state, 0o755)  # noqa: S103 - others may read, only root may write
    os.chmod(tmp_path, 0o755)  # noqa: S103
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the agent as a user who may not write there
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            child = Outbox(state / OUTBOX_FILE, max_count=10, max_age=60)
            for i in range(3):
                child.add(f"b{i}", "agent.test", child.wall(), b"{}")
            os.write(write, json.dumps({"fault": child.fault, "depth": child.depth(),
                                        "memory": child.memory_depth}).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = json.loads(pipe.read() or "{}")
    os.waitpid(pid, 0)
    assert seen == {"fault": "permission", "depth": 3, "memory": 3}
    assert (state / OUTBOX_FILE).exists()
    assert not list(state.glob("*.corrupt-*"))
    reopened = Outbox(state / OUTBOX_FILE, max_count=10, max_age=60)
    assert reopened.depth() == 1
    reopened.close()


def test_a_full_disk_keeps_raising_alerts_and_counts_what_memory_cannot_hold(
        tmp_path: Path) -> None:
    with tmpfs(tmp_path / "state", size="512k") as state:
        h = harness(tmp_path, "[alerts]\noutbox_max_count = 10000\n")
        engine = AlertEngine(h.ctx)
        filler = _fill(state)
        # the check loop's path: debounced transitions become alerts
        engine.observe(snapshot(status("wg", State.FAILED, "dead")))
        engine.observe(snapshot(status("wg", State.OK)))
        for i in range(MEMORY_MAX + 20):  # more than memory holds
            engine.raise_alert("agent.test", f"burst {i}")
        assert engine.outbox.fault == "disk_full"
        assert engine.view()["outbox"]["state"] == "disk_full"
        assert _fault(engine, "disk_full") == 1
        assert engine.outbox.memory_depth == MEMORY_MAX + 1  # plus one alerts.dropped
        lost = h.ctx.registry.get_sample_value("edgeheal_alerts_dropped_total",
                                                {"reason": "memory_queue"})
        assert lost == 22  # the two check alerts and the 20 oldest bursts
        filler.unlink()
        h.clock.advance(60)
        engine._prune()
        assert engine.outbox.fault is None
        kinds = _kinds(engine)
        assert kinds.count("alerts.dropped") == 1
        dropped = next(Alert.decode(e.payload) for e in engine.outbox.entries()
                       if e.kind == "alerts.dropped")
        assert dropped.detail["dropped"] == 22
        assert dropped.detail["bound"] == "memory_queue"
        bursts = [Alert.decode(e.payload).message for e in engine.outbox.entries()
                  if e.kind == "agent.test"]
        assert bursts == [f"burst {i}" for i in range(20, MEMORY_MAX + 20)]
        assert engine.outbox.close() == 0  # nothing left only in memory
        reopened = Outbox(state / OUTBOX_FILE, max_count=10000, max_age=3600)
        assert reopened.depth() == len(kinds)  # on disk now
        reopened.close()


def test_the_status_schema_lists_exactly_the_outbox_faults() -> None:
    from edgeheal.agent.alerts.outbox import FAULTS

    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" /
                         "status.schema.json").read_text())
    outbox = schema["properties"]["alerts"]["properties"]["outbox"]
    assert outbox["properties"]["state"]["enum"] == ["ok", *FAULTS]
