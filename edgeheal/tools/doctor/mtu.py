"""MTU: does a full-size tunnel packet fit the uplink it leaves through?

WireGuard wraps each tunnel packet in UDP: 60 bytes more over IPv4 (IP 20 + UDP 8 +
WireGuard 32), 80 over IPv6 (IP 40). A tunnel MTU whose packets do not fit the uplink's MTU
makes the kernel fragment them, and a cellular network that drops fragments, or anything
above the MTU it advertised, loses every large packet while pings and handshakes pass:
throughput near zero on a tunnel that looks up (flannel-io/flannel#1620). So this is the
first thing the doctor says.

The static check takes, for every peer endpoint of the tunnel devices, the kernel's route
to it (the uplink) and compares ``tunnel MTU + overhead`` with the uplink's MTU. The active
probe (``--probe-mtu``) sends ICMP echo requests that must not be fragmented through the
tunnel to a watched peer's tunnel address, largest first, then halves the interval between
the largest answered and the smallest lost size: at most :data:`MAX_SIZES` sizes, each tried
at most twice with :data:`WAIT` s for an answer, so it ends within ~25 s and sends at most
24 small packets.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

from edgeheal.boundaries.wg.readings import endpoint_address, fingerprint
from edgeheal.tools.doctor.finding import Finding, fail, ok, skip, warn

if TYPE_CHECKING:
    from edgeheal.boundaries.wg.readings import PeerStats
    from edgeheal.config import Config
    from edgeheal.tools.doctor.system import System
    from edgeheal.tools.doctor.wireguard import Tunnel

OVERHEAD = {4: 60, 6: 80}
"""Bytes WireGuard adds to a tunnel packet, by the family of the outer (endpoint) address."""
MAX_SIZES = 12
TRIES = 2
WAIT = 1.0
PRECISION = 8
"""The search stops when the largest answered and the smallest lost size are this close."""
FLOOR = {4: 576, 6: 1280}
"""The smallest size probed: every IPv4 host must take 576 bytes, every IPv6 link 1280."""


async def static(config: Config, tunnel: Tunnel, system: System) -> list[Finding]:
    """One finding per (tunnel device, uplink)."""
    name = "mtu"
    if not tunnel.devices:
        return [skip(name, "no tunnel device could be read")]
    found: list[Finding] = []
    for ifname, device in tunnel.devices.items():
        link = tunnel.links.get(ifname)
        if link is None or not link.mtu:
            continue
        uplinks: dict[str, int] = {}  # uplink -> largest overhead of the peers it carries
        for peer in device.peers:
            address = endpoint_address(peer.endpoint)
            if address is None:
                continue
            where = await system.route(str(address))
            if where.ifname and where.ifname in tunnel.links:
                uplinks[where.ifname] = max(uplinks.get(where.ifname, 0),
                                            OVERHEAD[address.version])
        if not uplinks:
            found.append(skip(name, f"{ifname}: no peer endpoint has a route: the uplink "
                              "cannot be told", interface=ifname, mtu=link.mtu))
            continue
        for uplink, overhead in sorted(uplinks.items()):
            up_mtu = tunnel.links[uplink].mtu
            need = link.mtu + overhead
            detail = {"interface": ifname, "mtu": link.mtu, "uplink": uplink,
                      "uplink_mtu": up_mtu, "overhead": overhead}
            text = (f"{ifname} MTU {link.mtu} + {overhead} = {need} "
                    f"{'<=' if need <= up_mtu else '>'} {uplink} MTU {up_mtu}")
            if need <= up_mtu:
                found.append(ok(name, text, **detail))
            else:
                found.append(fail(
                    name, text + f": full-size tunnel packets are fragmented or dropped on "
                    f"{uplink}", f"make the tunnel MTU at most {up_mtu - overhead}: Flannel "
                    f"derives it from the uplink's MTU when it starts, so restart K3s after "
                    f"the uplink has its final MTU (`ip link show {uplink}`), or set the "
                    f"uplink's real MTU in its network configuration",
                    **detail, largest_fit=up_mtu - overhead))
    return found or [skip(name, "no tunnel device MTU known")]


def tunnel_address(peer: PeerStats) -> str | None:
    """Where to send the probe: a host route among the peer's allowed IPs (an overlay
    address), else the network address of its first allowed network (Flannel gives the
    remote ``flannel-wg`` the first address of its pod subnet)."""
    nets = []
    for cidr in peer.allowed_ips:
        try:
            nets.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            continue
    hosts = [n for n in nets if n.num_addresses == 1]
    chosen = hosts[0] if hosts else (nets[0] if nets else None)
    if chosen is None or chosen.prefixlen == 0:
        return None
    return str(chosen.network_address)


async def search(system: System, address: str, largest: int) -> tuple[int | None, int]:
    """(largest answered size or None, sizes tried) between the family's floor and
    ``largest``; bounded by :data:`MAX_SIZES` sizes."""
    version = ipaddress.ip_address(address).version
    tried = 0

    async def passes(size: int) -> bool:
        nonlocal tried
        tried += 1
        for _ in range(TRIES):
            answer = await system.echo(address, size, WAIT)
            if answer == "answered":
                return True
            if answer == "too_big":
                return False
        return False

    if await passes(largest):
        return largest, tried
    low = FLOOR[version]
    if not await passes(low):
        return None, tried
    high = largest  # low answered, high did not
    while high - low > PRECISION and tried < MAX_SIZES:
        middle = (low + high) // 2
        if await passes(middle):
            low = middle
        else:
            high = middle
    return low, tried


async def probe(config: Config, tunnel: Tunnel, system: System) -> list[Finding]:
    """``--probe-mtu``: the largest packet that really crosses each tunnel."""
    name = "mtu.probe"
    found: list[Finding] = []
    for ifname in tunnel.devices:
        link = tunnel.links.get(ifname)
        peers = [p for i, p in tunnel.watched_peers() if i == ifname]
        target = next((a for p in peers if (a := tunnel_address(p))), None)
        if link is None or not link.mtu or target is None:
            found.append(skip(name, f"{ifname}: no watched peer with a tunnel address to "
                              "probe", interface=ifname))
            continue
        peer = next(p for p in peers if tunnel_address(p) == target)
        try:
            largest, tried = await search(system, target, link.mtu)
        except OSError as err:
            found.append(skip(name, f"{ifname}: cannot send ICMP echo: {err} (run as "
                              "root)", interface=ifname))
            continue
        detail = {"interface": ifname, "mtu": link.mtu, "address": target,
                  "peer": fingerprint(peer.public_key), "largest": largest, "sizes": tried}
        if largest is None:
            found.append(warn(name, f"{ifname}: no answer from {target} even at "
                              f"{FLOOR[ipaddress.ip_address(target).version]} bytes",
                              "the probe needs the peer to answer ICMP echo through the "
                              "tunnel; check the tunnel first (edgeheal status) or a "
                              "firewall dropping ICMP", **detail))
        elif largest < link.mtu:
            found.append(fail(name, f"{ifname}: packets above {largest} bytes do not reach "
                              f"{target} (tunnel MTU {link.mtu}): the path drops what the "
                              "tunnel lets through",
                              f"set the tunnel MTU to {largest} or less (lower the uplink's "
                              f"MTU by {link.mtu - largest} bytes and restart K3s, so Flannel "
                              "derives the smaller tunnel MTU)", **detail))
        else:
            found.append(ok(name, f"{ifname}: {largest}-byte packets reach {target} "
                            f"unfragmented ({tried} size(s) sent)", **detail))
    return found or [skip(name, "no tunnel device to probe")]
