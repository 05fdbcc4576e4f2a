"""What a sandbox starts dies with the process that started it, even when that process is
killed before it can clean up (a test worker killed by a timeout, a lab run by SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

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
