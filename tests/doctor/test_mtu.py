"""The MTU rule per uplink, and the bounded path-MTU search, on recorded links."""

from __future__ import annotations

from edgeheal.tools.doctor import mtu, wireguard
from edgeheal.tools.doctor.finding import Finding, Result
from edgeheal.tools.doctor.system import Route
from tests.doctor.support import TUNNEL_CONFIG, Node, config, edge, peer


async def _static(node: Node) -> list[Finding]:
    cfg = config(TUNNEL_CONFIG)
    system = node.system()
    return await mtu.static(cfg, await wireguard.observe(cfg, system), system)


async def test_1420_fits_a_1500_uplink_over_ipv4() -> None:
    (found,) = await _static(edge())
    assert found.result is Result.OK
    assert found.found == "flannel-wg MTU 1420 + 60 = 1480 <= wwan0 MTU 1500"


async def test_1500_on_an_lte_uplink_of_1400_fails_with_the_largest_that_fits() -> None:
    (found,) = await _static(edge(tunnel_mtu=1500, uplink_mtu=1400))
    assert found.result is Result.FAIL
    assert "1500 + 60 = 1560 > wwan0 MTU 1400" in found.found
    assert "at most 1340" in found.fix
    assert found.detail["largest_fit"] == 1340


async def test_an_ipv6_endpoint_costs_80_bytes() -> None:
    node = edge(tunnel_mtu=1440, uplink_mtu=1500)
    dev = node.devices["flannel-wg"]
    node.devices["flannel-wg"] = type(dev)(dev.interface, dev.listen_port,
                                           (peer(endpoint="[2001:db8::7]:51820"),))
    node.routes["2001:db8::7"] = Route("wwan0")
    (found,) = await _static(node)
    assert found.result is Result.FAIL
    assert "1440 + 80 = 1520 > wwan0 MTU 1500" in found.found


async def test_the_probe_finds_the_largest_size_that_passes_within_its_bound() -> None:
    node = edge()
    node.echo_limit = 1337
    largest, tried = await mtu.search(node.system(), "10.42.1.0", 1420)
    assert largest is not None
    assert 1337 - mtu.PRECISION <= largest <= 1337
    assert tried <= mtu.MAX_SIZES
    assert len(node.sent) <= mtu.MAX_SIZES * mtu.TRIES
    assert node.sent[0] == 1420  # largest first


async def test_a_tunnel_that_carries_full_size_packets_costs_one_packet() -> None:
    node = edge()
    node.echo_limit = 1420
    assert await mtu.search(node.system(), "10.42.1.0", 1420) == (1420, 1)
    assert node.sent == [1420]


async def test_a_silent_peer_is_not_an_mtu_verdict() -> None:
    node = edge()
    cfg = config(TUNNEL_CONFIG)
    system = node.system()
    (found,) = await mtu.probe(cfg, await wireguard.observe(cfg, system), system)
    assert found.result is Result.WARN
    assert "no answer from 10.42.1.0" in found.found
    assert len(node.sent) == 2 * mtu.TRIES  # the full size and the floor, twice each


async def test_a_probe_below_the_tunnel_mtu_fails_and_says_by_how_much() -> None:
    node = edge()
    node.echo_limit = 1340
    cfg = config(TUNNEL_CONFIG)
    system = node.system()
    (found,) = await mtu.probe(cfg, await wireguard.observe(cfg, system), system)
    assert found.result is Result.FAIL
    assert found.detail["largest"] <= 1340
    assert "set the tunnel MTU to" in found.fix


def test_the_probe_address_is_a_host_route_or_the_subnets_first_address() -> None:
    assert mtu.tunnel_address(peer(allowed=("10.201.0.2/32", "10.42.1.0/24"))) == "10.201.0.2"
    assert mtu.tunnel_address(peer(allowed=("10.42.1.0/24",))) == "10.42.1.0"
    assert mtu.tunnel_address(peer(allowed=("0.0.0.0/0",))) is None
