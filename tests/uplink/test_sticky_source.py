"""A userspace WireGuard device forgets its sticky source address when its peer's endpoint
is set again (edgeheal.boundaries.wg.sticky), against real wireguard-go devices."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edgeheal.boundaries.wg import UAPI_DIR
from edgeheal.boundaries.wg.readings import NoSuchDevice
from edgeheal.boundaries.wg.sticky import forget_source, request
from edgeheal.lab.netns import run
from edgeheal.lab.wireguard import PORT, WgMesh
from tests.support import until

KEY = "Q0xPVURDTE9VRENMT1VEQ0xPVURDTE9VRENMT1VEQ0w="


def test_the_request_re_sets_only_the_endpoint_of_an_existing_peer() -> None:
    body = request(KEY, "198.51.100.1:51820").decode()
    assert body.startswith("set=1\npublic_key=")
    assert "update_only=true\nendpoint=198.51.100.1:51820\n\n" in body
    assert "private_key" not in body
    assert "allowed_ip" not in body
    with pytest.raises(ValueError, match="32-byte key"):
        request("c2hvcnQ=", "198.51.100.1:51820")
    with pytest.raises(ValueError, match="endpoint"):
        request(KEY, "198.51.100.1:1\nremove=true")


async def test_a_missing_device_is_no_such_device(tmp_path: Path) -> None:
    with pytest.raises(NoSuchDevice, match="nope0"):
        await forget_source("nope0", KEY, "198.51.100.1:51820", uapi_dir=tmp_path)


@pytest.mark.netns
@pytest.mark.daemon
async def test_after_its_address_is_gone_the_device_sends_from_the_new_one_at_once(
        tmp_path: Path) -> None:
    """Node 0's address on its link is replaced (a secondary promoted): wireguard-go keeps
    sending from the old one, and node 1 keeps the stale endpoint, until the endpoint is
    set again; then node 1 learns the new source from the next keepalive (K = 1 s)."""
    with WgMesh(2, keepalive=1, log_dir=tmp_path) as mesh:
        a, b = mesh.nodes
        mesh.wait_handshake(a, b)
        mesh.wait_handshake(b, a)

        def seen_by_b() -> str:
            return mesh.dump(b)[a.public_key][2]

        assert seen_by_b() == f"10.200.0.1:{PORT}"
        link = a.uplinks[1]
        run(["sysctl", "-qw", f"net.ipv4.conf.{link}.promote_secondaries=1"], ns=a.ns)
        run(["ip", "addr", "add", "10.200.0.51/24", "dev", link], ns=a.ns)
        run(["ip", "addr", "del", "10.200.0.1/24", "dev", link], ns=a.ns)
        await asyncio.sleep(3.5)  # three keepalives: all sent from the vanished address
        assert seen_by_b() == f"10.200.0.1:{PORT}"  # the stale source: nothing arrives
        await forget_source(a.ifname, b.public_key, mesh.endpoint(a, b), uapi_dir=UAPI_DIR)
        await until(lambda: seen_by_b() == f"10.200.0.51:{PORT}", within=7, every=0.2,
                    what="node 1 learning node 0's new source (roaming)")
        # the peer is otherwise unchanged: same endpoint, keepalive, allowed IPs
        row = mesh.dump(a)[b.public_key]
        assert row[2] == mesh.endpoint(a, b)
        assert row[3] == b.pod_cidr
        # update_only: a key the device does not know creates no peer
        await forget_source(a.ifname, KEY, mesh.endpoint(a, b), uapi_dir=UAPI_DIR)
        assert KEY not in mesh.dump(a)
