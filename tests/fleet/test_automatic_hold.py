"""The automatic fleet hold, end to end: a real Prometheus evaluates the shipped
``EdgehealHubFaultFleetwide`` rule over five nodes' ``/metrics``, a real Alertmanager
(Debian's ``prometheus-alertmanager``) routes it with the shipped route
(monitoring/alertmanager/fleet-hold.yaml) to ``edgeheal fleet receive`` (a real process,
bearer token and all), which publishes the hold on a real Mosquitto; an agent's alert link
(:class:`edgeheal.boundaries.mqtt.link.Link`, what the Flannel ladder reads) hears it, and
hears the release when the nodes' tunnels come back.

The five nodes are a metrics source, not five agents (five tunnels to a hub are the
storm bench's business, not this test's): each serves, on its own loopback port, the
agent's ``edgeheal_check_state`` and ``edgeheal_mqtt_up`` families with the HELP, TYPE and
label names of the golden ``/metrics`` file (tests/agent/golden/metrics.txt), one value per
state as the agent writes them (1 for the current state, 0 for the others). What the test
changes in the shipped files, to fit in a minute: the rule's ``for:`` and
``keep_firing_for:`` (1 s each), the route's
``group_interval`` (1 s) and the webhook's URL and token file; scrapes and evaluations run
every 0.5 s. Everything listens on 127.0.0.1 on ports chosen for this run and runs in the
sandbox (killed and removed even on failure).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import socket
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from edgeheal.base.compat import UTC
from edgeheal.boundaries.mqtt.link import Link
from edgeheal.lab.mosquitto import Mosquitto
from edgeheal.lab.netns import Sandbox
from tests.mqtt.conftest import PASSWORD, USER, target_for
from tests.support import until

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "agent" / "golden" / "metrics.txt"
ALERT = "EdgehealHubFaultFleetwide"
TOPIC = "edgeheal/fleet/hold"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
STATES = ("ok", "degraded", "unknown", "failed")
NODES = 5

pytestmark = [pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _families() -> dict[str, tuple[str, str]]:
    """metric -> (TYPE line, HELP line), from the golden file."""
    lines = GOLDEN.read_text().splitlines()
    out = {}
    for name in ("edgeheal_check_state", "edgeheal_mqtt_up"):
        kind = next(x for x in lines if x.startswith(f"# TYPE {name} "))
        helps = next(x for x in lines if x.startswith(f"# HELP {name} "))
        labels = next(x for x in lines if x.startswith(name + "{"))
        assert labels in (f"{name}{{check,state}}", f"{name}{{path,target}}"), labels
        out[name] = (kind, helps)
    return out


class Node:
    """One node's /metrics: its tunnel's state and its two MQTT targets."""

    def __init__(self, families: dict[str, tuple[str, str]]) -> None:
        self.families, self.tunnel, self.direct_up = families, "ok", True
        self.server: asyncio.Server | None = None
        self.port = 0

    def render(self) -> bytes:
        check, mqtt = self.families["edgeheal_check_state"], self.families["edgeheal_mqtt_up"]
        lines = [*check]
        lines += [f'edgeheal_check_state{{check="wireguard",state="{s}"}} '
                  f"{int(s == self.tunnel)}" for s in STATES]
        lines += [*mqtt,
                  f'edgeheal_mqtt_up{{path="direct",target="broker-direct"}} '
                  f"{int(self.direct_up)}",
                  f'edgeheal_mqtt_up{{path="tunnel",target="broker-tunnel"}} '
                  f'{int(self.tunnel == "ok")}']
        return ("\n".join(lines) + "\n").encode()

    async def start(self) -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                body = self.render()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                             b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(answer, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def _rules(into: Path) -> Path:
    """The shipped alerts with the hub-fault rule's ``for:`` and ``keep_firing_for:`` at
    1 s."""
    doc = yaml.safe_load((ROOT / "monitoring" / "alerts.yaml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    assert len(rules) == 1
    assert rules[0]["keep_firing_for"] == "2m"
    rules[0]["for"] = rules[0]["keep_firing_for"] = "1s"
    out = into / "alerts.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def _route(into: Path, receiver_port: int, token_file: Path) -> Path:
    """The shipped route with the receiver's URL and token, and a 1 s group_interval."""
    doc = yaml.safe_load((ROOT / "monitoring" / "alertmanager" / "fleet-hold.yaml")
                         .read_text())
    route = next(r for r in doc["route"]["routes"] if r["receiver"] == "edgeheal-fleet-hold")
    assert route["group_wait"] == "0s"
    route["group_interval"] = "1s"
    hook = next(r for r in doc["receivers"]
                if r["name"] == "edgeheal-fleet-hold")["webhook_configs"][0]
    assert hook["send_resolved"] is True
    hook["url"] = f"http://127.0.0.1:{receiver_port}/alertmanager"
    hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    out = into / "alertmanager.yml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


async def _log_says(path: Path, pattern: str, within: float, proc: object) -> str:
    def look() -> str:
        text = path.read_text(errors="replace") if path.exists() else ""
        return text if re.search(pattern, text) else ""
    return await until(look, within=within, every=0.2,
                       what=f"{path.name} to say {pattern!r}",
                       report=lambda _: path.read_text(errors="replace")[-1500:]
                       if path.exists() else "(no log)")


async def test_the_hub_fault_alert_sets_the_hold_through_alertmanager_and_releases_it(
        sandbox: Sandbox, tmp_path: Path) -> None:
    broker = Mosquitto(sandbox, tmp_path, users={USER: PASSWORD})
    broker.start()
    token = tmp_path / "fleet-receive.token"
    token.write_text(secrets.token_hex(16) + "\n")
    config = tmp_path / "ops.toml"
    config.write_text(
        f'[agent]\nnode_name = "ops-box"\nstate_dir = "{tmp_path}/state"\n'
        f'[[mqtt.targets]]\nname = "cloud"\nhost = "{broker.host}"\nport = {broker.port}\n'
        f'username = "{USER}"\npassword_file = "{broker.password_file_for(USER)}"\n'
        '[alerts]\ntarget = "cloud"\n[fleet]\nhold = true\nmax_hold = "2h"\n')
    receiver_port, am_port, prom_port = _free_port(), _free_port(), _free_port()
    receiver_log = tmp_path / "receive.log"
    receiver = sandbox.spawn([sys.executable, "-m", "edgeheal", "--config", str(config),
                              "fleet", "receive", "--listen", f"127.0.0.1:{receiver_port}",
                              "--for", "10m", "--token-file", str(token)],
                             log_path=receiver_log)
    nodes = [Node(_families()) for _ in range(NODES)]
    link = Link(target_for(broker, keepalive=5.0, client_id="edge-0"), "edge-0",
                hold_topic=TOPIC, max_hold=7200.0)
    task = asyncio.create_task(link.run(), name="test.link")
    try:
        for node in nodes:
            await node.start()
        await _log_says(receiver_log, r"listening on http://127\.0\.0\.1:\d+/alertmanager",
                        20, receiver)
        am_dir, prom_dir = tmp_path / "am", tmp_path / "prom"
        (am_dir / "data").mkdir(parents=True)
        (prom_dir / "data").mkdir(parents=True)
        sandbox.spawn([ALERTMANAGER, f"--config.file={_route(am_dir, receiver_port, token)}",
                       f"--storage.path={am_dir / 'data'}",
                       f"--web.listen-address=127.0.0.1:{am_port}",
                       "--cluster.listen-address=", "--log.level=warn"],
                      log_path=am_dir / "alertmanager.log")
        (prom_dir / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "500ms", "evaluation_interval": "500ms",
                       "scrape_timeout": "500ms"},
            "rule_files": [str(_rules(prom_dir))],
            "alerting": {"alertmanagers": [{"static_configs": [
                {"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "edgeheal", "static_configs": [
                {"targets": [f"127.0.0.1:{n.port}" for n in nodes]}]}],
        }))
        sandbox.spawn([PROMETHEUS, f"--config.file={prom_dir / 'prometheus.yml'}",
                       f"--storage.tsdb.path={prom_dir / 'data'}",
                       f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
                      log_path=prom_dir / "prometheus.log")
        await until(lambda: link.connected, within=15, what="the alert link to connect")

        # healthy fleet, then a single node's failure: no hold (a few evaluations each)
        nodes[0].tunnel = "failed"
        await asyncio.sleep(4)
        assert link.fleet_hold is None, link.fleet_hold

        # the hub fault: 4 of 5 tunnels failed, every direct path fine
        for node in nodes[1:4]:
            node.tunnel = "failed"
        fault = datetime.now(UTC)
        began = time.monotonic()
        held = await until(lambda: link.fleet_hold, within=45, every=0.1,
                           what="the fleet hold to arrive",
                           report=lambda _: receiver_log.read_text(errors="replace")[-1500:])
        took = time.monotonic() - began
        assert (held.reason, held.by, held.refused) == (ALERT, "alertmanager", ""), held
        assert held.until is not None
        assert fault + timedelta(minutes=9) < held.until <= datetime.now(UTC) + \
            timedelta(minutes=10)
        assert held.holds(datetime.now(UTC))

        # the hub is back: every tunnel ok, the alert resolves, the hold is released
        for node in nodes:
            node.tunnel = "ok"
        released = await until(lambda: link.fleet_hold if link.fleet_hold is not held
                               and link.fleet_hold.until is None else None,
                               within=45, every=0.1, what="the release",
                               report=lambda _: receiver_log.read_text(errors="replace")
                               [-1500:])
        assert released.refused == "", released
        # the receiver logs once its publish is acknowledged: the retained release may
        # reach the link first
        def release_line() -> str | None:
            text = receiver_log.read_text(errors="replace")
            return text if "fleet hold released" in text else None

        log = await until(release_line, within=10, every=0.1,
                          what="the receiver's release line")
        assert "fleet hold set until" in log, log
        assert "refused" not in log, log
        assert "bearer" not in log.lower(), log
        assert token.read_text().strip() not in log
        assert receiver.poll() is None, log
        assert link.state.connects == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await link.close()
        for node in nodes:
            await node.close()
    print(f"fault -> hold heard: {took:.1f}s")
    assert took < 40
