"""The conntrack boundary against the kernel's own ctnetlink, behind a real nftables DNAT."""

from __future__ import annotations

import socket
import time

import pytest

from edgeheal.boundaries.kernel.conntrack import destinations
from edgeheal.lab import kubeproxy, nsutil
from edgeheal.lab.netns import Sandbox, run

CLUSTER_IP = "10.43.9.9"
POD_IP = "10.42.9.5"


def serve(sandbox: Sandbox, ns: str) -> socket.socket:
    with nsutil.inside(ns):
        return socket.create_server((POD_IP, 0))


async def test_a_dnated_connection_is_found_with_its_pod_address(sandbox: Sandbox) -> None:
    client, pod = sandbox.netns("k"), sandbox.netns("p")
    sandbox.veth(client, pod, addr_a="10.200.9.1/24", addr_b="10.200.9.2/24")
    run(["ip", "addr", "add", f"{POD_IP}/32", "dev", "lo"], ns=pod)
    run(["ip", "route", "add", "default", "via", "10.200.9.2"], ns=client)
    server = serve(sandbox, pod)
    port = server.getsockname()[1]
    kubeproxy.install(sandbox, client, [kubeproxy.Service(CLUSTER_IP, 1883, POD_IP, port)],
                      tunnel=None)
    assert await destinations(CLUSTER_IP, 1883, netns=client) == []
    with nsutil.inside(client):
        conn = socket.create_connection((CLUSTER_IP, 1883), timeout=5)
    try:
        found = await destinations(CLUSTER_IP, 1883, netns=client)
        assert [(t.destination, t.port, t.live) for t in found] == [(POD_IP, port, True)]
        assert found[0].state in ("established", "syn_recv", "syn_sent")
        assert await destinations(CLUSTER_IP, 1884, netns=client) == []  # another port
        t0 = time.process_time()
        for _ in range(100):
            await destinations(CLUSTER_IP, 1883, netns=client)
        per_call = (time.process_time() - t0) / 100
        assert per_call < 0.05, f"{per_call * 1000:.1f} ms CPU per conntrack question"
    finally:
        conn.close()
        server.close()


@pytest.mark.parametrize("bad", ["10.43.0", "broker.local"])
async def test_a_bad_address_is_an_error_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match=bad.replace(".", r"\.")):
        await destinations(bad, 1883)
