"""``edgeheal alert test``: usage errors, an absent agent, and a real round trip."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from edgeheal.agent.alerts.engine import AlertEngine
from edgeheal.boundaries.control_socket import ControlServer
from tests.alerts.support import harness


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "edgeheal.toml"
    cfg.write_text(f'[agent]\nstate_dir = "{tmp_path}/state"\nnode_name = "edge-7"\n')
    return subprocess.run([sys.executable, "-m", "edgeheal", "alert", "test", *args,
                           "--config", str(cfg)], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("count", ["0", "-3", "x", "1001"])
def test_a_bad_count_is_a_usage_error(tmp_path: Path, count: str) -> None:
    done = _cli(tmp_path, "--count", count)
    assert done.returncode == 2
    assert "--count" in done.stderr


def test_no_running_agent_is_an_environment_error(tmp_path: Path) -> None:
    done = _cli(tmp_path, "--count", "2")
    assert done.returncode == 3
    assert "not running" in done.stderr


async def test_the_command_raises_alerts_through_the_agents_control_socket(
        tmp_path: Path) -> None:
    server = ControlServer(tmp_path / "state")
    h = harness(tmp_path, control=server.register)
    engine = AlertEngine(h.ctx)
    await server.start()
    try:
        done = await asyncio.to_thread(_cli, tmp_path, "--count", "3", "--ids")
    finally:
        await server.close()
    assert done.returncode == 0, done.stderr
    ids = done.stdout.split()
    assert ids == [e.id for e in engine.outbox.entries()][1:]
    await engine.close()
