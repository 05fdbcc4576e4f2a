"""The check inside the real agent (`python -m edgeheal run`) on a real tunnel: /status
shows the reason and every peer, /metrics the per-peer series, and the log no key."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgeheal.lab import nsutil
from edgeheal.lab.wireguard import WgMesh
from tests.support import until

pytestmark = pytest.mark.netns


async def test_the_agent_reports_a_blackholed_tunnel_and_its_recovery(
        mesh: WgMesh, tmp_path: Path) -> None:
    edge, cloud = mesh.nodes
    port = 20000 + secrets.randbelow(20000)  # the namespace is ours alone: any port is free
    conf = tmp_path / "edgeheal.toml"
    conf.write_text(f"""
[agent]
state_dir = "{tmp_path / 'state'}"
check_interval = "1s"
[http]
listen = ["127.0.0.1:{port}"]
[offload]
enabled = false
[wireguard]
interfaces = ["{edge.ifname}"]
connect_grace = "10s"
[[mqtt.targets]]
name = "cloud"
host = "{cloud.pod_cidr.replace('.0/24', '.5')}"
path = "tunnel"
enabled = false
""", encoding="utf-8")
    log = mesh.sandbox.track(tmp_path / "agent.log")
    mesh.sandbox.spawn([sys.executable, "-m", "edgeheal", "run", "--config", str(conf)],
                       ns=edge.ns, log_path=log)

    def check(state: str, reason: str | None = None) -> Callable[[], dict[str, Any] | None]:
        def probe() -> dict[str, Any] | None:
            try:
                _, doc = nsutil.get_json(edge.ns, "127.0.0.1", port, "/status", 2.0)
            except OSError:
                return None
            wg = doc.get("checks", {}).get("wireguard") if isinstance(doc, dict) else None
            if wg and wg["state"] == state and reason in (None, wg["reason"]):
                return dict(wg)
            return None
        return probe

    ok = await until(check("ok"), within=30, every=0.2, what="wireguard ok in /status")
    (row,) = ok["detail"]["peers"]
    assert (row["peer"], row["watched"], row["reason"]) == (cloud.public_key[:8], True, "ok")

    mesh.blackhole(edge, cloud)
    failed = await until(check("failed", "stalled"), within=17.5 + 3 + 10, every=0.2,
                         what="stalled in /status")
    assert "nothing received" in failed["message"]
    code, metrics = nsutil.http_get(edge.ns, "127.0.0.1", port, "/metrics", 2.0)
    text = metrics.decode()
    assert code == 200
    assert (f'edgeheal_wireguard_peer_state{{interface="{edge.ifname}",'
            f'peer="{cloud.public_key[:8]}",state="failed",watched="true"}} 1.0') in text
    assert "edgeheal_wireguard_receive_bytes_total" in text

    mesh.clear_faults(edge, cloud)
    await until(check("ok"), within=5 + 3 + 10, every=0.2, what="ok again in /status")
    agent_log = log.read_text(errors="replace")
    assert "stalled" in agent_log
    for node in mesh.nodes:
        assert node.private_key not in agent_log + text
