"""Issue 26, item 5: nothing blocks the loop — /readyz answers while the disk takes 2 s.

The alert outbox and the remediation history wait for fsync on every write. On a worn SD
card one can take seconds; done on the event loop, it stalled every probe the agent serves,
and /readyz is the readiness gate of every collector pod on the node.

How the slow disk is made: in process. device-mapper's ``delay`` target over a loop device
would be the real thing, but the kernels this suite runs on may have no device-mapper
driver (no ``dm_delay``, no ``/dev/mapper/control`` that answers), so each fsync is made to
take :data:`FSYNC` seconds where the agent calls it: ``os.fsync`` (the history's temp file)
and the outbox's commit (SQLite fsyncs in C, out of Python's reach, so the 2 s are added
after :meth:`Outbox.add` returned on the writer thread). Every stall is recorded, so the
test proves the probes ran *while* one was in progress, not merely beside one.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from edgeheal.agent.alerts.engine import OUTBOX_FILE
from edgeheal.agent.alerts.outbox import Outbox
from edgeheal.agent.remediation.history import Store, Timeline
from edgeheal.config import CheckSettings
from edgeheal.core.safeguards import History
from tests.agent.fakes import ScriptedCheck, ok
from tests.agent.support import running_agent
from tests.support import until

FSYNC = 2.0
"""Seconds each fsync takes on the simulated card."""
BOUND = 0.2
"""The most one /readyz may take while an fsync is in progress (it takes about 1 ms)."""
FAST = CheckSettings(interval=0.2, fail_after=1, recover_after=1, required=True)


class SlowDisk:
    """Records each stalled fsync as (thread, began, ended) on ``time.monotonic``."""

    def __init__(self) -> None:
        self.stalls: list[tuple[str, float, float | None]] = []
        self._lock = threading.Lock()

    def stall(self) -> None:
        began = time.monotonic()
        with self._lock:
            index = len(self.stalls)
            self.stalls.append((threading.current_thread().name, began, None))
        time.sleep(FSYNC)
        with self._lock:
            self.stalls[index] = (self.stalls[index][0], began, time.monotonic())

    def in_progress(self, began: float, ended: float) -> bool:
        """True if one stall covered the whole of [began, ended]."""
        with self._lock:
            return any(b <= began and (e is None or ended <= e) for _, b, e in self.stalls)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> SlowDisk:
    slow = SlowDisk()
    real_fsync, real_add = os.fsync, Outbox.add

    def fsync(fd: int) -> None:
        real_fsync(fd)
        slow.stall()

    def add(self: Outbox, alert_id: str, kind: str, raised: float, payload: bytes) -> int:
        dropped = real_add(self, alert_id, kind, raised, payload)
        slow.stall()  # the commit's fsync, as a 2 s card makes it
        return dropped

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Outbox, "add", add)
    return slow


async def test_readyz_answers_in_milliseconds_while_the_disk_takes_2s(
        tmp_path: Path, disk: SlowDisk) -> None:
    check = ScriptedCheck("fast", FAST, [ok()])
    async with running_agent(tmp_path, [check]) as agent:
        await until(lambda: agent.agent.snapshot.ready, what="the agent ready")
        engine = agent.agent.alerts
        await engine.outbox.settled()  # agent.started is stored: what follows is ours
        disk.stalls.clear()
        store = Store(tmp_path / "state", Timeline(boot_id="test-boot", offset=0.0))

        alert = engine.raise_alert("agent.test", "queued on a slow disk")
        store.save(History(failures_in_row=2))
        probes: list[tuple[float, float, int]] = []
        deadline = time.monotonic() + 1.5 * FSYNC
        while time.monotonic() < deadline:
            began = time.monotonic()
            status, _ = await agent.get("/readyz")
            probes.append((began, time.monotonic(), status))
            await asyncio.sleep(0.02)

        during = [(b, e) for b, e, _ in probes if disk.in_progress(b, e)]
        worst = max(e - b for b, e, _ in probes)
        assert all(status == 200 for _, _, status in probes)
        assert len(during) >= 20, f"only {len(during)} probes ran while an fsync stalled"
        assert worst < BOUND, f"/readyz took {worst:.3f}s while the disk took {FSYNC}s"
        threads = {name for name, _, _ in disk.stalls}
        assert len(disk.stalls) >= 2, disk.stalls  # the alert's commit and the history's
        assert threading.current_thread().name not in threads, threads

        await engine.outbox.settled()
        await store.written()
    db = sqlite3.connect(tmp_path / "state" / OUTBOX_FILE)  # a reader of the file itself
    try:
        ids = {row[0] for row in db.execute("SELECT id FROM outbox")}
    finally:
        db.close()
    assert alert.id in ids
    assert Store(tmp_path / "state", Timeline("test-boot", 0.0)).load().failures_in_row == 2
