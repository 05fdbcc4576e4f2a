"""What a sandbox starts dies with the process that started it, even when that process is
killed before it can clean up (a test worker killed by a timeout, a lab run by SIGKILL)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from edgeheal.lab import netns
from tests.support import wait_until

CHILD = textwrap.dedent("""
    import sys, time
    from edgeheal.lab.netns import Sandbox
    box = Sandbox()
    proc = box.spawn(["sleep", "300"])
    print(proc.pid, flush=True)
    time.sleep(300)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_spawned_process_dies_with_a_killed_owner() -> None:
    owner = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    pid = 0
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        assert alive(pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        wait_until(lambda: not alive(pid), within=10, what="the orphan sleep exits")
    finally:
        owner.kill()
        owner.wait(timeout=10)
        if owner.stdout is not None:
            owner.stdout.close()
        if pid and alive(pid):  # the assertion failed: do not leave it behind
            os.kill(pid, signal.SIGKILL)


@pytest.mark.root
def test_the_sweep_removes_wireguard_sockets_nothing_listens_on() -> None:
    """A wireguard-go killed with its namespace leaves ``<ifname>.sock``: the sweep removes
    such a file, never one that still has a listener."""
    netns.WG_SOCKETS.mkdir(parents=True, exist_ok=True)
    stale, live = (netns.WG_SOCKETS / f"{netns.unique(t)}.sock" for t in ("s", "l"))
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(stale))
    dead.close()  # the file stays, nothing listens: what a killed wireguard-go leaves
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(live))
    server.listen(1)
    try:
        removed = netns.sweep()
        assert stale.name in removed
        assert not stale.exists()
        assert live.exists()
        assert live.name not in removed
    finally:
        server.close()
        stale.unlink(missing_ok=True)
        live.unlink(missing_ok=True)
