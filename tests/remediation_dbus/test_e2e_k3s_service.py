"""End to end: the real agent on an edge node whose Flannel is "embedded in K3s".

A wireguard-go mesh (edge + cloud namespaces), a Mosquitto broker in the cloud reachable
through the tunnel (overlay address) and directly (underlay address), the agent running
`python -m edgeheal run` inside the edge namespace with `mode = "k3s-service"`, and a
private dbus-daemon with the stand-in systemd whose `k3s-agent.service` restart re-creates
the edge's tunnel device — what K3s's embedded Flannel does when K3s restarts.

Fault: the edge's device loses its peer (the tunnel-path broker becomes unreachable while
the direct path works). Expected: the agent restarts the unit exactly once over D-Bus and
reports recovery in /status.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeheal.lab import nsutil
from edgeheal.lab.mosquitto import Mosquitto
from edgeheal.lab.netns import Sandbox
from edgeheal.lab.systemd_bus import FakeSystemd, SystemBus, start_system_bus
from edgeheal.lab.wireguard import WgMesh
from tests.support import until

pytestmark = [pytest.mark.slow, pytest.mark.netns]

AGENT = "k3s-agent.service"


@pytest.fixture
def mesh(sandbox: Sandbox) -> Iterator[WgMesh]:
    wg = WgMesh(nodes=2, keepalive=2, sandbox=sandbox)
    try:
        yield wg
    finally:
        wg.close()


async def test_a_tunnel_that_lost_its_peer_is_cured_by_one_unit_restart(
        sandbox: Sandbox, mesh: WgMesh, tmp_path: Path) -> None:
    edge, cloud = mesh.nodes
    broker = Mosquitto(sandbox, tmp_path, ns=cloud.ns, host="0.0.0.0")
    broker.start()
    bus: SystemBus = start_system_bus(sandbox)
    mesh.wait_handshake(edge, cloud)
    port = 20000 + secrets.randbelow(40000)  # the edge namespace is fresh: any port is free
    direct_host = mesh.endpoint(edge, cloud).rsplit(":", 1)[0]
    conf = tmp_path / "edgeheal.toml"
    conf.write_text(f"""
[agent]
node_name = "edge-e2e"
state_dir = "{tmp_path}/state"
check_interval = "1s"

[http]
listen = ["127.0.0.1:{port}"]

[wireguard]
interfaces = ["{edge.ifname}"]
connect_grace = "10s"
recover_after = 1

[[mqtt.targets]]
name = "broker-tunnel"
host = "{cloud.overlay}"
port = {broker.port}
path = "tunnel"
interval = "1s"
timeout = "1s"
recover_after = 1

[[mqtt.targets]]
name = "broker-direct"
host = "{direct_host}"
port = {broker.port}
path = "direct"
interval = "1s"
timeout = "1s"

[remediation]
mode = "k3s-service"
startup_grace = "0s"
cooldown = "0s"
restart_jitter = "0s"
max_per_hour = 5
verify_timeout = "30s"

[remediation.service]
timeout = "20s"
""", encoding="utf-8")

    async def flannel_rebuilds_the_device(unit: str) -> None:
        await asyncio.to_thread(mesh.recreate_device, edge)

    def status() -> dict[str, Any] | None:
        try:
            code, doc = nsutil.get_json(edge.ns, "127.0.0.1", port, "/status", timeout=2.0)
        except OSError:
            return None
        return doc if code in (200, 503) and isinstance(doc, dict) else None

    def states() -> dict[str, str]:
        doc = status() or {}
        return {name: c["state"] for name, c in doc.get("checks", {}).items()}

    async with FakeSystemd.with_units(bus.address, {AGENT: "active"},
                                      on_restart=flannel_rebuilds_the_device) as fake:
        env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": bus.address}
        sandbox.spawn([sys.executable, "-m", "edgeheal", "run", "--config", str(conf)],
                      ns=edge.ns, env=env, log_path=sandbox.track(tmp_path / "agent.log"))
        healthy = {"wireguard": "ok", "broker-tunnel": "ok", "broker-direct": "ok"}
        await until(lambda: asyncio.to_thread(lambda: states() == healthy), within=30, every=0.2,
                    what="agent sees a healthy tunnel")
        doc = status()
        assert doc is not None
        assert doc["remediation"]["mode"] == "k3s-service", doc["remediation"]

        started = time.monotonic()
        await asyncio.to_thread(mesh.remove_peer, edge, cloud)

        def recovered() -> list[dict[str, Any]]:
            doc = status() or {}
            return [a for a in doc.get("actions", []) if a.get("result") == "recovered"]

        (action,) = await until(lambda: asyncio.to_thread(recovered), within=90, every=0.2,
                                what="a recovered restart in /status actions")
        took = time.monotonic() - started
        assert action["mode"] == "k3s-service"
        assert action["target"] == AGENT
        assert fake.restarts == [AGENT], "exactly one restart of the K3s unit"
        await until(lambda: asyncio.to_thread(lambda: states() == healthy), within=30, every=0.2,
                    what="healthy again")
        assert fake.restarts == [AGENT]
        assert took < 90
        log = (tmp_path / "agent.log").read_text(errors="replace")
        assert edge.private_key not in log
