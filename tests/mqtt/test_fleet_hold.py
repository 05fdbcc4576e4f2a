"""The fleet hold through a real Mosquitto: ``edgeheal fleet hold`` publishes it retained,
a subscribed alert link hears it at once, a link that connects later hears it too, a
malformed one is refused (not obeyed), ``release`` clears it; the link keeps serving."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

from edgeheal.base import compat
from edgeheal.base.compat import UTC
from edgeheal.boundaries.mqtt.link import Link
from edgeheal.cli import fleet
from edgeheal.lab.mosquitto import Mosquitto
from tests.mqtt.conftest import USER, target_for
from tests.support import until

TOPIC = "edgeheal/fleet/hold"


def _config(broker: Mosquitto, tmp_path: Path) -> Path:
    path = tmp_path / "edge.toml"
    path.write_text(
        f'[agent]\nnode_name = "ops-box"\nstate_dir = "{tmp_path}/state"\n'
        f'[[mqtt.targets]]\nname = "cloud"\nhost = "{broker.host}"\nport = {broker.port}\n'
        f'username = "{USER}"\npassword_file = "{broker.password_file_for(USER)}"\n'
        '[alerts]\ntarget = "cloud"\n[fleet]\nhold = true\nmax_hold = "2h"\n')
    return path


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgeheal", "fleet", *args, "--config",
                           str(config)], capture_output=True, text=True, timeout=60,
                          check=False)


async def test_a_hold_is_heard_by_every_link_refused_when_malformed_and_released(
        broker: Mosquitto, tmp_path: Path) -> None:
    config = _config(broker, tmp_path)
    first = Link(target_for(broker, keepalive=5.0), "edge-1", hold_topic=TOPIC,
                 max_hold=7200.0)
    tasks = [asyncio.create_task(first.run(), name="test.link.first")]
    late: Link | None = None
    try:
        await until(lambda: first.connected)
        proc = await asyncio.to_thread(_cli, config, "hold", "--for", "30m", "--reason",
                                       "hub wg0 down", "--by", "ops")
        assert proc.returncode == 0, proc.stderr
        assert f"fleet hold set on {TOPIC} until" in proc.stdout
        heard = await until(lambda: first.fleet_hold)
        assert (heard.reason, heard.by, heard.refused) == ("hub wg0 down", "ops", "")
        assert heard.until is not None
        now = datetime.now(UTC)
        assert now + timedelta(minutes=29) < heard.until <= now + timedelta(minutes=30)
        assert heard.holds(now)

        late = Link(target_for(broker, keepalive=5.0, client_id="edge-2"), "edge-2",
                    hold_topic=TOPIC, max_hold=7200.0)
        tasks.append(asyncio.create_task(late.run(), name="test.link.late"))
        late_heard = await until(lambda: late.fleet_hold)  # retained: heard on connect
        assert late_heard.reason == "hub wg0 down"

        target = target_for(broker)
        await fleet._publish(target, "ops", TOPIC, b'{"reason": "x", "until": "soon"}')
        refused = await until(lambda: first.fleet_hold if first.fleet_hold is not heard
                              else None)
        assert refused.refused == '"until" is not an RFC 3339 time'
        assert not refused.holds(now)
        assert first.connected  # a refused hold is not a broken broker

        proc = await asyncio.to_thread(_cli, config, "release")
        assert proc.returncode == 0, proc.stderr
        released = await until(lambda: first.fleet_hold if first.fleet_hold is not refused
                               else None)
        assert (released.until, released.refused) == (None, "")
        assert first.connected
        assert late.connected
        assert first.state.connects == 1  # never dropped on the way
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await first.close()
        if late is not None:
            await late.close()


def test_the_command_refuses_a_hold_longer_than_max_hold(broker: Mosquitto,
                                                          tmp_path: Path) -> None:
    proc = _cli(_config(broker, tmp_path), "hold", "--for", "3h", "--reason", "x")
    assert proc.returncode == 2
    assert "--for must be 1m to [fleet] max_hold (7200s), got 10800s" in proc.stderr


async def test_a_running_agent_shows_the_hold_in_status_and_its_release(
        broker: Mosquitto, tmp_path: Path) -> None:
    """The agent's own wiring: ``[fleet] hold`` on, the alert link subscribed, the Flannel
    actor's view in ``/status``."""
    config = _config(broker, tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    agent_config = tmp_path / "agent.toml"
    agent_config.write_text(config.read_text().replace('node_name = "ops-box"',
                                                       'node_name = "edge-9"')
                            + f'[http]\nlisten = ["127.0.0.1:{port}"]\n'
                            '[wireguard]\nenabled = false\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    log = (tmp_path / "agent.log").open("w")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "edgeheal", "run", "--config", str(agent_config), env=env,
        stdout=log, stderr=log)

    def held() -> object:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as err:
            doc = json.loads(err.read())
        except OSError:
            return "unreachable"
        return (doc.get("remediation") or {}).get("fleet_hold", "absent")

    try:
        assert await until(lambda: asyncio.to_thread(held), holds=lambda v: v is None,
                           within=30, every=0.2) is None
        proc_cli = await asyncio.to_thread(_cli, config, "hold", "--for", "10m", "--reason",
                                           "hub flannel down")
        assert proc_cli.returncode == 0, proc_cli.stderr
        shown = await until(lambda: asyncio.to_thread(held),
                            holds=lambda v: isinstance(v, str) and "hub flannel" in v,
                            within=30, every=0.2)
        assert str(shown).startswith("hub flannel down, until ")
        assert (await asyncio.to_thread(_cli, config, "release")).returncode == 0
        await until(lambda: asyncio.to_thread(held), holds=lambda v: v is None, within=30,
                    every=0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except compat.TimeoutErrors:
            proc.kill()
            await proc.wait()
        log.close()
    assert "fleet hold on edgeheal/fleet/hold: until" in (tmp_path / "agent.log").read_text()
