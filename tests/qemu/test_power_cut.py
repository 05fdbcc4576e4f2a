"""Power-cut safety, proven on a real kernel (issue 27): the guest's power is cut while the
agent writes alerts to its outbox and saves its remediation history, again and again; after
every boot the agent is ready within seconds, every alert it reported stored before a cut
reaches the broker (or is counted as lost, by an alert), no pause it reported persisted is
lost, and ``agent.started`` says the previous run ended ``unclean``.

**The cut.** QEMU is killed (SIGKILL): the guest's RAM goes, and with it everything the guest
had not flushed — its page cache, ext4's uncommitted journal, virtio requests not yet
handed to QEMU. The state lives on a second virtio disk, a raw ext4 file made per test and
opened ``cache=writeback`` (the guest is told the disk has a volatile write cache and sends
flushes): it survives the kill exactly as the guest had written it, and the next QEMU boots
on it (the root disk stays ``-snapshot``: a fresh root each boot, like a read-only root on
an edge box). A QMP ``system_reset`` would lose the same guest RAM (QEMU's block layer
keeps what it was handed either way); a new process per cut costs the same boot. The test
is not vacuous: a file written without fsync just before each cut (``canary-N``) must be
gone after the boot, and is.

**What "reported" means.** guest_power.py's load writes each answer of the agent's control
socket to the serial port once it has it; QEMU copies the port to a host file as it is
written. An id found there after the kill was reported before the cut.

Cost: one boot per cut (~15-30 s under TCG on the busy 2-core machine, plus the agent's
start). The default suite cuts :data:`CUTS` times; ``EDGEHEAL_POWER_CUTS=20`` runs the full
twenty (docs/testbed.md has the command and that run's figures).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.qemu import bed

pytestmark = [pytest.mark.slow, pytest.mark.vm, pytest.mark.root]

CUTS = int(os.environ.get("EDGEHEAL_POWER_CUTS", "3"))
"""Cuts in one run (the default suite's; see the module docstring)."""
GUEST = bed.SRC + "/tests/qemu/guest_power.py"
READY_WITHIN = 60.0
"""Seconds from the agent's start to ``/readyz`` 200 in the guest (TCG on a loaded host:
the import alone takes seconds; the agent itself waits for nothing)."""
DELIVER_WITHIN = 120.0
LINE = re.compile(rb"EHP ([qp]) (\d+) (\S+)")


@dataclass
class Ledger:
    """What the agent reported before each cut, and what the broker received since."""

    queued: dict[str, int] = field(default_factory=dict)
    """alert id -> the cycle in which the agent reported it stored."""
    paused: dict[int, int] = field(default_factory=dict)
    """cycle -> the last pause (hours) the agent reported persisted."""
    received: dict[str, dict[str, Any]] = field(default_factory=dict)
    cycles: list[dict[str, Any]] = field(default_factory=list)
    temp_files_left: int = 0
    """Temporary history files found after a cut (each removed by the agent's start)."""

    def reported(self, console: bytes) -> None:
        for what, cycle, value in LINE.findall(console):
            if what == b"q":
                self.queued.setdefault(value.decode(), int(cycle))
            else:
                self.paused[int(cycle)] = max(self.paused.get(int(cycle), 0), int(value))


@pytest.fixture
def state_disk(guest_image: bed.Image) -> Iterator[Path]:
    """A fresh ext4 file for the agent's state, labelled for the guest's ``mount -L``."""
    tmp = Path(tempfile.mkdtemp(prefix="edgeheal-power-"))
    try:
        disk = tmp / "state.ext4"
        subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-L", "ehpower", str(disk), "64M"],
                       check=True, capture_output=True, timeout=60)
        yield disk
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def boot(img: bed.Image, disk: Path, cycle: int) -> tuple[bed.VM, dict[str, Any]]:
    vm = bed.VM(img, devices=("-drive", f"file={disk},format=raw,if=virtio,"
                                        "cache=writeback,snapshot=off"))
    try:
        vm.boot()
        res = vm.run(["python3", GUEST, "boot", str(cycle)], timeout=240)
        got = json.loads(res.check("guest_power.py boot").out.strip().splitlines()[-1])
    except BaseException:
        vm.close()
        raise
    got["boot_seconds"] = vm.boot_seconds
    return vm, got


def received(vm: bed.VM) -> dict[str, dict[str, Any]]:
    out = vm.run(["cat", "/run/ehp/received"]).out
    docs = (json.loads(line) for line in out.splitlines() if line.strip())
    return {d["id"]: d for d in docs}


def agent_log(vm: bed.VM) -> str:
    return vm.run(["tail", "-c", "4000", "/run/ehp/agent.log"]).out


def lost_by_alert(got: dict[str, dict[str, Any]]) -> int:
    """Alerts the agent said it lost (``alerts.dropped`` counts; ``agent.state_reset``
    of the outbox: its count, when it has one)."""
    total = 0
    for doc in got.values():
        detail = doc.get("detail") or {}
        if doc["kind"] == "alerts.dropped":
            total += int(detail.get("dropped", 0))
        elif doc["kind"] == "agent.state_reset":
            total += int(detail.get("lost", 0) or 0)
    return total


def cut(vm: bed.VM) -> bytes:
    """The power cable: SIGKILL QEMU; return what the guest wrote to its serial port."""
    assert vm.process is not None
    os.killpg(vm.process.pid, signal.SIGKILL)
    vm.process.wait(timeout=30)
    console = vm.console.read_bytes()
    vm.close()
    return console


def test_power_cuts_while_alerts_and_history_are_written_lose_nothing_reported(
        guest_image: bed.Image, state_disk: Path) -> None:
    ledger = Ledger()
    rng = random.Random(27)  # noqa: S311 (timing, not secrets)
    vm: bed.VM | None = None
    t0 = time.monotonic()
    try:
        for cycle in range(1, CUTS + 2):  # the last boot only checks the last cut
            vm, got = boot(guest_image, state_disk, cycle)
            survived = got["survived"]
            ready = got["ready_seconds"]
            assert ready is not None, f"boot {cycle}: no /readyz 200\n{agent_log(vm)}"
            assert ready <= READY_WITHIN, (cycle, ready)
            if cycle > 1:
                # the canary written without fsync just before the cut is gone: the cut lost
                # what the guest had not flushed (else this test would prove nothing)
                assert survived["canary"] in (None, ""), (cycle, survived)
                assert "history_error" not in survived, (cycle, survived)
                last = ledger.paused.get(cycle - 1)
                if last is not None:  # the newest reported pause is on disk (or a later one)
                    assert (survived["paused_hours"] or 0) >= last, (cycle, survived, last)
                # a temp file the cut left (a save cut between its fsync and its rename)
                # is gone once the agent has started
                left = [n for n in survived["names"] if n.startswith(".")]
                ledger.temp_files_left += len(left)
                after = [n for n in got["names_when_ready"] if n.startswith(".")]
                assert not after, f"boot {cycle}: temporary files kept: {after} (cut left {left})"
            # every alert reported before any earlier cut reaches the broker, and this
            # boot's agent.started says whether the last run was cut
            want = set(ledger.queued)
            began = time.monotonic()
            while True:
                now = received(vm)
                ledger.received.update(now)
                missing = want - set(ledger.received)
                started = [d for d in now.values() if d["kind"] == "agent.started"]
                if (not missing and started) or time.monotonic() - began > DELIVER_WITHIN:
                    break
                time.sleep(1.0)
            assert [(d.get("detail") or {}).get("previous_run") for d in started] == [
                "unclean" if cycle > 1 else "none"], (cycle, started)
            delivered_in = time.monotonic() - began
            lost = lost_by_alert(ledger.received)
            assert len(missing) <= lost, (
                f"boot {cycle}: {len(missing)} alert(s) reported stored before a cut never "
                f"reached the broker, {lost} counted as lost: {sorted(missing)[:5]}\n"
                f"{agent_log(vm)}")
            resets = [d for d in ledger.received.values() if d["kind"] == "agent.state_reset"]
            assert not resets, f"boot {cycle}: a state file was unusable: {resets}"
            backlog = [i for i, c in ledger.queued.items() if c == cycle - 1]
            ledger.cycles.append({"cycle": cycle, "boot": round(got["boot_seconds"], 1),
                                  "ready": round(ready, 1), "delivered": round(delivered_in, 1),
                                  "backlog": len(backlog),
                                  "pause": ledger.paused.get(cycle - 1)})
            if cycle > CUTS:
                break
            # the writes the cut interrupts: broker down, alerts and pauses in turn
            vm.sh("kill $(cat /run/ehp/mq.pid)")
            vm.sh(f"setsid python3 {GUEST} load {cycle} >/dev/ttyS0 2>&1 </dev/null &")
            deadline = time.monotonic() + 120
            while b"EHP p %d " % cycle not in vm.console.read_bytes():
                assert time.monotonic() < deadline, f"cycle {cycle}: no load\n{agent_log(vm)}"
                time.sleep(0.2)
            time.sleep(rng.uniform(0.2, 3.0))
            vm.sh(f"printf unsynced > /var/lib/edgeheal-power/canary-{cycle}")
            console = cut(vm)
            vm = None
            ledger.reported(console)
    finally:
        if vm is not None:
            vm.close()
    cycles = ledger.cycles
    print(f"\n{CUTS} power cuts in {time.monotonic() - t0:.0f} s; "
          f"{len(ledger.queued)} alerts reported stored before a cut, "
          f"{len(set(ledger.queued) & set(ledger.received))} delivered after it, "
          f"{lost_by_alert(ledger.received)} counted lost; medians: boot "
          f"{statistics.median(c['boot'] for c in cycles):.1f} s, /readyz 200 "
          f"{statistics.median(c['ready'] for c in cycles):.1f} s after the agent's start "
          f"(max {max(c['ready'] for c in cycles):.1f} s), backlog delivered in "
          f"{statistics.median(c['delivered'] for c in cycles[1:]):.1f} s; "
          f"{ledger.temp_files_left} temp file(s) a cut left, removed at start; per boot:")
    for c in cycles:
        print(f"  {c}")
    assert ledger.queued, "the load reported no alert: the test proved nothing"
    assert ledger.paused, "the load reported no pause: the test proved nothing"
