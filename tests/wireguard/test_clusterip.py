"""The tunnel target is a Service ClusterIP, as on a real K3s node (issue 34).

A real wireguard-go pair addressed as Flannel addresses it (each peer's allowed IPs are
exactly its node's pod subnet), a Mosquitto on a pod address in the cloud node's pod subnet,
and on the edge what kube-proxy and Flannel install (:mod:`edgeheal.lab.kubeproxy`): the
ClusterIP DNATed to that pod address in the nat table's ``output`` hook, host traffic into
the tunnel masqueraded to the tunnel's address. A real ``edgeheal run`` on the edge with the
example's settings points its tunnel-path target at the ClusterIP. No peer's allowed IPs
hold the ClusterIP, so before issue 34 the WireGuard check said ``failed``/``no_peers`` and
``/readyz`` never turned ready although the broker answered through the tunnel.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeheal.lab import kubeproxy, nsutil
from edgeheal.lab.mosquitto import Mosquitto
from edgeheal.lab.netns import run
from edgeheal.lab.wireguard import WgMesh
from tests.support import until

pytestmark = [pytest.mark.root, pytest.mark.daemon]

CLUSTER_IP = "10.43.7.7"
SERVICE_PORT = 1883
K = 5


class Site:
    def __init__(self, mesh: WgMesh, port: int, log: Path, pod_ip: str) -> None:
        self.mesh, self.port, self.log, self.pod_ip = mesh, port, log, pod_ip

    def get(self, path: str) -> tuple[int, Any]:
        try:
            return nsutil.get_json(self.mesh.nodes[0].ns, "127.0.0.1", self.port, path, 2.0)
        except OSError:
            return 0, None

    def check(self, name: str) -> dict[str, Any]:
        _, doc = self.get("/status")
        return dict(doc["checks"].get(name) or {}) if isinstance(doc, dict) else {}

    def story(self) -> str:
        said = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return f"wireguard: {self.check('wireguard')}\n{said}"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    mesh = WgMesh(2, keepalive=K, log_dir=tmp_path)
    try:
        edge, cloud = mesh.nodes
        assert run(["wg", "show", edge.ifname, "allowed-ips"], ns=edge.ns).stdout.split()[
            1:] == [cloud.pod_cidr]  # Flannel's: the lease only
        # a node has a default route (its uplink): the ClusterIP is routed there until
        # kube-proxy's DNAT reroutes the packet into the tunnel
        run(["ip", "route", "add", "default", "via", cloud.underlay[0]], ns=edge.ns)
        pod_ip = cloud.pod_cidr.replace(".0/24", ".5")
        run(["ip", "addr", "add", f"{pod_ip}/32", "dev", "lo"], ns=cloud.ns)
        broker = Mosquitto(mesh.sandbox, tmp_path, ns=cloud.ns, host="0.0.0.0")
        broker.start()
        kubeproxy.install(mesh.sandbox, edge.ns,
                          [kubeproxy.Service(CLUSTER_IP, SERVICE_PORT, pod_ip, broker.port)],
                          tunnel=edge.ifname)
        port = 20000 + secrets.randbelow(20000)
        conf = tmp_path / "edgeheal.toml"
        conf.write_text(f"""
[agent]
node_name = "edge-test"
state_dir = "{tmp_path / 'state'}"
check_interval = "1s"
[http]
listen = ["127.0.0.1:{port}"]
[offload]
enabled = false
[wireguard]
interfaces = ["{edge.ifname}"]
watch_peers = "auto"
interval = "1s"
required = true
[[mqtt.targets]]
name = "broker-tunnel"
host = "{CLUSTER_IP}"
port = {SERVICE_PORT}
path = "tunnel"
interval = "3s"
required = true
[remediation]
mode = "none"
""", encoding="utf-8")
        mesh.wait_handshake(edge, cloud)
        log = mesh.sandbox.track(tmp_path / "agent.log")
        mesh.sandbox.spawn([sys.executable, "-m", "edgeheal", "run", "--config", str(conf)],
                           ns=edge.ns, log_path=log)
        yield Site(mesh, port, log, pod_ip)
    finally:
        mesh.close()


async def test_a_clusterip_target_through_kube_proxys_dnat_is_ok_and_ready(
        site: Site) -> None:
    try:
        await until(lambda: asyncio.to_thread(site.get, "/readyz"),
                    holds=lambda r: r[0] == 200, within=40, every=0.5, what="/readyz 200")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{site.story()}") from None
    wg = site.check("wireguard")
    assert (wg["state"], wg["reason"]) == ("ok", "ok"), site.story()
    peers = wg["detail"]["peers"]
    assert [p["watched"] for p in peers] == [True]
    # the check says how it found the peer: kube-proxy's DNAT, read from conntrack
    assert wg["detail"]["targets"][CLUSTER_IP]["via"] == [site.pod_ip], wg["detail"]
    assert site.check("broker-tunnel")["state"] == "ok"
