"""Issue 27, findings 4 and 7: the state directory, read-only or not trusted.

- 4: a read-only state directory (an SD card remounted ``errors=remount-ro``) stopped the
  agent with exit 3 at ``agent.lock``. Now it runs degraded: probes served, the outbox's
  ``read_only`` fault in ``/status`` and the metrics, the control socket's absence logged;
  a second agent on the same directory is still refused while the first holds the lock.
- 7: a ``state_dir`` that is a symlink or writable by others is refused with exit 2 and a
  message naming what is wrong, before anything in it is opened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeheal.lab.mosquitto import free_port
from edgeheal.lab.netns import Sandbox
from tests.hardening.test_agent_process import AgentProcess, get, wait_serving, write_config
from tests.support import wait_until

pytestmark = pytest.mark.root


@pytest.fixture
def read_only_state(tmp_path: Path) -> Iterator[Path]:
    """A state directory an earlier run left (with its lock file), bind-mounted read-only."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "agent.lock").write_text("")
    subprocess.run(["mount", "--bind", str(state), str(state)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(state)], check=True)
        yield state
    finally:
        if subprocess.run(["umount", str(state)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(state)], check=True)  # a process still in it


def test_a_read_only_state_dir_degrades_the_agent_instead_of_stopping_it(
        read_only_state: Path, sandbox: Sandbox, tmp_path: Path) -> None:
    # (read_only_state first: the sandbox ends the agents before the mount goes)
    port = free_port()
    cfg = write_config(tmp_path / "edgeheal.toml", read_only_state, port)
    agent = AgentProcess(sandbox, tmp_path, cfg, name="agent")
    wait_serving(agent, port)
    assert get(port, "/readyz")[0] == 200
    status = json.loads(get(port, "/status")[1])
    assert status["alerts"]["outbox"]["state"] == "read_only"
    metrics = get(port, "/metrics")[1]
    assert 'edgeheal_alerts_outbox_fault{fault="read_only"} 1.0' in metrics
    wait_until(lambda: "control socket: cannot make" in agent.log,
               what="the missing control socket to be logged")
    second = AgentProcess(sandbox, tmp_path, write_config(
        tmp_path / "second.toml", read_only_state, free_port()), name="second")
    assert second.wait(timeout=60) == 3  # the lock still keeps a second agent out
    assert "is edgeheal already running?" in second.log
    assert agent.stop() == 0, agent.log[-3000:]
    assert "cannot start" not in agent.log


@pytest.mark.parametrize("how", ["symlink", "group-writable", "world-writable"])
def test_a_state_dir_others_could_write_is_refused_with_exit_2(tmp_path: Path,
                                                               how: str) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    state = real
    if how == "symlink":
        state = tmp_path / "link"
        state.symlink_to(real)
    else:
        os.chmod(real, 0o770 if how == "group-writable" else 0o777)
    cfg = write_config(tmp_path / "edgeheal.toml", state, free_port())
    proc = subprocess.run([sys.executable, "-m", "edgeheal", "run", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"agent.state_dir: {state}" in proc.stderr
    assert ("symlink" if how == "symlink" else "writable by group or others") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in real.iterdir()) == []  # nothing was opened in it
