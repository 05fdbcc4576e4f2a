"""Issue 17, finding 12: ``edgeheal alert test`` said "published" of alerts only queued.

Now the agent waits (``--wait``, bounded) for the broker's PUBACKs and the command says
"published" only of acknowledged alerts and "queued" of the rest: through the real CLI,
the real control socket, and a real Mosquitto (or a port where nothing listens).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from edgeheal.agent.alerts.engine import AlertEngine
from edgeheal.boundaries.control_socket import ControlServer
from edgeheal.lab.mosquitto import Mosquitto, free_port
from tests.alerts.support import harness
from tests.mqtt.conftest import USER, broker  # noqa: F401 - the fixture

pytestmark = pytest.mark.netns


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "edgeheal.toml"
    cfg.write_text(f'[agent]\nstate_dir = "{tmp_path}/state"\nnode_name = "edge-7"\n')
    return subprocess.run([sys.executable, "-m", "edgeheal", "alert", "test", *args,
                           "--config", str(cfg)], capture_output=True, text=True,
                          timeout=90, check=False)


async def _run(tmp_path: Path, toml: str, *args: str) -> subprocess.CompletedProcess[str]:
    server = ControlServer(tmp_path / "state")
    h = harness(tmp_path, toml, control=server.register)
    engine = AlertEngine(h.ctx, link=h.link)
    await server.start()
    serve = asyncio.create_task(engine.serve())
    try:
        return await asyncio.to_thread(_cli, tmp_path, *args)
    finally:
        serve.cancel()
        await asyncio.gather(serve, return_exceptions=True)
        await engine.close()
        await server.close()


def _toml(host: str, port: int, extra: str = "") -> str:
    return (f'[[mqtt.targets]]\nname = "alerts"\nhost = "{host}"\nport = {port}\n'
            f'timeout = "2s"\n{extra}[alerts]\ntarget = "alerts"\n')


async def test_alerts_the_broker_did_not_acknowledge_are_said_to_be_queued(
        tmp_path: Path) -> None:
    done = await _run(tmp_path, _toml("127.0.0.1", free_port()), "--count", "2",
                      "--wait", "1")
    assert done.returncode == 0, done.stderr
    assert "queued for edgeheal/edge-7/alerts via alerts" in done.stdout
    assert "published" not in done.stdout


async def test_alerts_the_broker_acknowledged_are_said_to_be_published(
        tmp_path: Path, broker: Mosquitto) -> None:  # noqa: F811
    extra = (f'username = "{USER}"\npassword_file = "{broker.password_file_for(USER)}"\n')
    done = await _run(tmp_path, _toml(broker.host, broker.port, extra), "--count", "3",
                      "--wait", "20")
    assert done.returncode == 0, done.stderr
    assert "published to edgeheal/edge-7/alerts via alerts (acknowledged" in done.stdout
    assert "queued" not in done.stdout


@pytest.mark.parametrize("wait", ["-1", "31", "nan", "inf", "x"])
def test_a_bad_wait_is_a_usage_error(tmp_path: Path, wait: str) -> None:
    done = _cli(tmp_path, "--wait", wait)
    assert done.returncode == 2
    assert "--wait" in done.stderr
