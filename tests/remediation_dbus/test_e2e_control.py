"""End to end: the real agent (``python -m edgeheal run``) with the control check and the
control ladder, on loopback.

The stand-in API server (:class:`edgeheal.lab.kubeapi.FakeKube`, with its stand-in kubelet
renewing the node's Lease) is also the K3s server the node's "agent" talks to; the test
holds one TCP connection to it, as the K3s agent's load balancer does. A private
dbus-daemon carries the stand-in systemd with ``k3s-agent.service``, whose restart plays
the K3s agent coming back: the kubelet renews again and the agent reconnects.

- Stuck agent: the agent's connection goes and the kubelet stops renewing while the server
  still answers directly -> ``heartbeat_stale`` -> exactly one ``RestartUnit`` of
  ``k3s-agent.service`` over D-Bus, then the control check ``ok`` and the attempt
  ``recovered`` in ``/status``.
- Server outage: the server stops answering (the direct path is down) -> the check says
  ``server_unreachable`` and the ladder never restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from edgeheal.lab.kubeapi import FakeKube
from edgeheal.lab.netns import Sandbox
from edgeheal.lab.systemd_bus import FakeSystemd, SystemBus
from tests.agent.support import validate
from tests.support import until

pytestmark = [pytest.mark.slow]

NODE = "edge-ctl"
AGENT = "k3s-agent.service"
RENEW = 0.2
"""The stand-in kubelet renews every 0.2 s (10 s on a node) ..."""
DURATION = 2
"""... a Lease of 2 s (40 s on a node)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Node:
    api: FakeKube
    port: int
    held: list[socket.socket] = field(default_factory=list)

    @property
    def server(self) -> str:
        return self.api.url.removeprefix("https://")

    def connect(self) -> None:
        """The K3s agent's connection to its server (what the check's local evidence sees)."""
        host, port = self.server.rsplit(":", 1)
        self.held.append(socket.create_connection((host, int(port)), timeout=5.0))

    def drop(self) -> None:
        for sock in self.held:
            sock.close()
        self.held.clear()

    def status(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/status", timeout=2.0) as resp:
                doc = json.loads(resp.read())
        except OSError as err:
            code = getattr(err, "code", None)
            if code != 503:
                return {}
            doc = json.loads(err.read())  # type: ignore[attr-defined]
        return doc if isinstance(doc, dict) else {}

    async def control(self) -> tuple[str, str]:
        doc = await asyncio.to_thread(self.status)
        check = doc.get("checks", {}).get("control", {})
        return check.get("state", ""), check.get("reason", "")


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    api = FakeKube()
    api.add_node(NODE)
    api.set_addresses(NODE, "127.0.0.1")
    await api.start()
    api.kubelet_start(NODE, renew=RENEW, grace=3600.0, duration=DURATION)
    world = Node(api, free_port())
    try:
        yield world
    finally:
        world.drop()
        await api.close()


def start_agent(sandbox: Sandbox, node: Node, bus: SystemBus, tmp_path: Path) -> Path:
    account = node.api.add_user(f"system:serviceaccount:kube-flannel:edgeheal-{NODE}")
    node.api.allow_agent(account.user)
    kubeconfig = node.api.write_kubeconfig(tmp_path / "kubeconfig", account)
    conf = tmp_path / "edgeheal.toml"
    conf.write_text(f"""
[agent]
node_name = "{NODE}"
state_dir = "{tmp_path}/state"

[http]
listen = ["127.0.0.1:{node.port}"]

[kubernetes]
kubeconfig = "{kubeconfig}"
request_timeout = "5s"
retries = 0

[control]
servers = ["{node.server}"]
balancer = "127.0.0.1:{free_port()}"
kubelet_healthz = ""
interval = "1s"
retry_interval = "1s"
api_spacing = "5s"
connect_timeout = "1s"

[remediation]
mode = "none"
restart_jitter = "0s"

[remediation.service]
timeout = "20s"

[remediation.control]
enabled = true
act_after = "0s"
startup_grace = "0s"
cooldown = "0s"
verify_timeout = "90s"
""", encoding="utf-8")
    log = sandbox.track(tmp_path / "agent.log")
    env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": bus.address}
    sandbox.spawn([sys.executable, "-m", "edgeheal", "run", "--config", str(conf)],
                  env=env, log_path=log)
    return log


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"


async def test_a_stuck_agent_is_restarted_once_and_the_node_heartbeats_again(
        sandbox: Sandbox, system_bus: SystemBus, node: Node, tmp_path: Path) -> None:
    def agent_back(unit: str) -> None:  # the restarted K3s agent reconnects and renews
        node.api.kubelet_start(NODE, renew=RENEW, grace=3600.0, duration=DURATION)
        node.connect()

    node.connect()
    async with FakeSystemd.with_units(system_bus.address, {AGENT: "active"},
                                      on_restart=agent_back) as fake:
        log = start_agent(sandbox, node, system_bus, tmp_path)
        await until(node.control, holds=lambda s: s == ("ok", "ok"), within=30, every=0.3,
                    what="the control check ok", report=lambda s: f"{s}\n{tail(log)}")
        assert fake.restarts == []
        node.drop()  # the agent's balancer lost its server ...
        node.api.kubelet_stop(NODE)  # ... and the kubelet stops renewing

        def recovered(doc: dict[str, Any]) -> list[dict[str, Any]]:
            actions = doc.get("control_remediation", {}).get("actions", [])
            return [a for a in actions if a.get("result") == "recovered"]

        doc = await until(lambda: asyncio.to_thread(node.status),
                          holds=lambda d: bool(recovered(d)), within=150, every=0.5,
                          what="a recovered agent restart in /status",
                          report=lambda d: f"{d.get('checks', {}).get('control')}\n"
                                           f"{d.get('control_remediation')}\n{tail(log)}")
        (action,) = recovered(doc)
        validate(doc, "status.schema.json")
        assert (action["reason"], action["target"]) == ("control_heartbeat_stale", AGENT)
        assert doc["control_remediation"]["circuit"] == "closed"
        for _ in range(10):  # and it stays so: ok, no second restart
            assert await node.control() == ("ok", "ok")
            await asyncio.sleep(0.5)
        assert fake.restarts == [AGENT], (
            f"exactly one restart: {doc['control_remediation']}\n{tail(log)}")
        doc = await asyncio.to_thread(node.status)
        assert [a["result"] for a in doc["control_remediation"]["actions"]] == ["recovered"]


async def test_a_server_outage_restarts_nothing(
        sandbox: Sandbox, system_bus: SystemBus, node: Node, tmp_path: Path) -> None:
    node.connect()
    async with FakeSystemd.with_units(system_bus.address, {AGENT: "active"}) as fake:
        log = start_agent(sandbox, node, system_bus, tmp_path)
        await until(node.control, holds=lambda s: s == ("ok", "ok"), within=30, every=0.3,
                    what="the control check ok", report=lambda s: f"{s}\n{tail(log)}")
        node.drop()
        node.api.kubelet_stop(NODE)
        with contextlib.suppress(Exception):
            await node.api.close()  # the server is gone: its port refuses the handshake

        def skipped(doc: dict[str, Any]) -> bool:
            last = doc.get("control_remediation", {}).get("last_decision") or {}
            return last.get("reason") == "server_unreachable"

        await until(lambda: asyncio.to_thread(node.status), holds=skipped, within=60,
                    every=0.5, what="the ladder skipping server_unreachable",
                    report=lambda d: f"{d.get('checks', {}).get('control')}\n{tail(log)}")
        # the verdict holds for a while longer: still no restart, no D-Bus restart call
        for _ in range(10):  # between handshakes too: no old reading speaks for it
            assert await node.control() == ("failed", "server_unreachable")
            await asyncio.sleep(0.5)
        assert fake.restarts == []
        assert "RestartUnit" not in [m for m, _ in fake.calls]
        doc = await asyncio.to_thread(node.status)
        assert doc["control_remediation"]["actions"] == []
