"""Which peers matter: the peers that really carry the tunnel-path MQTT targets.

``watch_peers = "auto"`` watches the peers WireGuard would send the targets' packets to:
the longest-prefix match over the peers' allowed IPs (cryptokey routing, :func:`route_peers`).
On a K3s node the target is usually a Service ClusterIP (service CIDR ``10.43.0.0/16``),
which no peer's allowed IPs hold: Flannel gives each peer exactly its node's pod subnet.
kube-proxy DNATs the ClusterIP to a pod address before the kernel routes the packet, and
conntrack records the translation, so :class:`Targets` follows it
(:func:`edgeheal.boundaries.kernel.conntrack.destinations`: the entries whose original
destination is the target, among them the tunnel probe's own connection, and what the
kernel rewrote them to) and routes the pod address instead. Every kube-proxy mode that NATs
through conntrack (iptables, nftables, IPVS) looks the same there; no API call, no RBAC.

What an address becomes (``detail.targets``)::

    how            meaning
    allowed_ips    a peer's allowed IPs hold it (a pod address, an address outside the
                   cluster that a peer carries)
    dnat           conntrack shows it translated to ``via`` (a ClusterIP): ``via`` is routed
    cached         conntrack holds no entry right now; the last translation is kept
    direct         conntrack shows connections to it untranslated, and no peer holds it:
                   the device lost the peer that carries it (``no_peers``)
    lost           a peer used to carry it and none does now (``no_peers``)
    unresolved     no peer holds it and conntrack knows no translation yet (before the
                   first probe, or conntrack cannot be read): ``target_unresolved``

The answer is cached like the DNS answer: conntrack is asked again every
:data:`FOLLOW_EVERY` seconds (so a broker pod that moved is followed within that), on every
run while an address is unresolved, and never for an address a peer holds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeheal.boundaries.wg.readings import endpoint_address, is_public_key

if TYPE_CHECKING:
    from edgeheal.boundaries.kernel.conntrack import Translation
    from edgeheal.boundaries.wg.readings import DeviceStats
    from edgeheal.config import Config

log = logging.getLogger("edgeheal.checks.wireguard")  # the parent's name: operators grep it

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
DNS_EVERY = 60.0
"""Seconds a tunnel target's DNS answer is kept."""
FOLLOW_EVERY = 30.0
"""Seconds a conntrack answer (a ClusterIP's translation) is kept before asking again: the
longest a moved broker pod goes unfollowed once a probe connected to its new address."""
Conntrack = Callable[[str, int | None], Awaitable[list["Translation"]]]
"""``async (address, port) -> [Translation]`` raising ``ConntrackError``."""


def _networks(cidrs: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = []
    for cidr in cidrs:
        try:
            nets.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            log.debug("ignoring unparseable allowed IP %r", cidr)
    return nets


def route_peers(device: DeviceStats, addresses: Iterable[IPAddress]) -> set[str]:
    """Public keys of the peers WireGuard would send ``addresses`` to (longest prefix
    match over all peers' allowed IPs: cryptokey routing)."""
    tables = [(p.public_key, _networks(p.allowed_ips)) for p in device.peers]
    chosen = set()
    for addr in addresses:
        best: tuple[int, str] | None = None
        for key, nets in tables:
            for net in nets:
                if addr.version == net.version and addr in net and (
                        best is None or net.prefixlen > best[0]):
                    best = (net.prefixlen, key)
        if best is not None:
            chosen.add(best[1])
    return chosen


def listed_peers(device: DeviceStats, entries: Iterable[str]) -> set[str]:
    """Public keys of peers named by key, or whose endpoint address is in a listed CIDR."""
    keys = {e for e in entries if is_public_key(e)}
    nets = _networks(e for e in entries if e not in keys)
    chosen = set()
    for peer in device.peers:
        ip = endpoint_address(peer.endpoint)
        if peer.public_key in keys or (ip is not None and any(
                ip.version == n.version and ip in n for n in nets)):
            chosen.add(peer.public_key)
    return chosen


def follow(translations: list[Translation], address: IPAddress) -> tuple[IPAddress, ...]:
    """Where conntrack says connections to ``address`` really go (live connections first:
    a closed one may still name the pod the broker had before it moved); ``()`` when the
    entries show no translation."""
    live = [t for t in translations if t.live] or translations
    found = {ipaddress.ip_address(t.destination) for t in live}
    found.discard(address)
    return tuple(sorted(found, key=lambda a: (a.version, int(a))))


@dataclass
class Address:
    """One tunnel target address and what the check knows of its path."""

    host: str
    address: IPAddress
    port: int
    how: str = "unresolved"
    via: tuple[IPAddress, ...] = ()
    asked: float | None = None
    """When conntrack was last asked (monotonic), None: never."""
    carried: bool = False
    """Some peer has carried it (or its translation) since the agent started."""
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"address": str(self.address), "how": self.how,
                "via": [str(v) for v in self.via], "message": self.message}


@dataclass
class Choice:
    """The outcome of one run's peer selection."""

    watched: dict[str, set[str]] = field(default_factory=dict)
    """Interface -> public keys of the watched peers."""
    unresolved: list[Address] = field(default_factory=list)
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Host -> {addresses, how, via, message} for ``detail.targets``."""


class Targets:
    """The tunnel-path MQTT targets' addresses, followed through kube-proxy's DNAT."""

    def __init__(self, config: Config, clock: Callable[[], float], *,
                 resolve: Callable[[str], Awaitable[list[str]]] | None = None,
                 conntrack: Conntrack | None = None) -> None:
        self._config = config
        self._clock = clock
        self._resolve = resolve or _resolve
        self._conntrack = conntrack or _conntrack
        self._dns: tuple[float, list[tuple[str, int, IPAddress]]] | None = None
        self._known: dict[tuple[str, IPAddress], Address] = {}

    def hosts(self) -> list[tuple[str, int]]:
        return [(t.host, t.port) for t in self._config.mqtt.targets if t.path == "tunnel"]

    async def _addresses(self) -> list[tuple[str, int, IPAddress]]:
        now = self._clock()
        if self._dns is not None and now - self._dns[0] < DNS_EVERY:
            return self._dns[1]
        found: list[tuple[str, int, IPAddress]] = []
        for host, port in self.hosts():
            try:
                found.append((host, port, ipaddress.ip_address(host)))
                continue
            except ValueError:
                pass
            try:
                answers = await self._resolve(host)
            except OSError as err:
                log.warning("cannot resolve tunnel target %s: %s", host, err,
                            extra={"check": "wireguard"})
                continue
            found.extend((host, port, ipaddress.ip_address(a.split("%")[0]))
                         for a in answers)
        self._dns = (now, found)
        return found

    async def choose(self, devices: list[DeviceStats]) -> Choice | None:
        """The watched peers of ``devices``; None when there is no tunnel-path target, or
        none resolves (then every peer is watched, as before)."""
        addrs = await self._addresses()
        if not addrs:
            return None
        choice = Choice()
        routed: list[IPAddress] = []
        for host, port, address in addrs:
            entry = self._known.setdefault((host, address), Address(host, address, port))
            await self._place(entry, devices)
            routed.extend(entry.via or (entry.address,))
            if entry.how == "unresolved":
                choice.unresolved.append(entry)
            row = choice.targets.setdefault(host, {"addresses": [], "how": [], "via": [],
                                                   "message": []})
            for key, value in entry.to_json().items():
                row["addresses" if key == "address" else key] += (
                    value if isinstance(value, list) else [value])
        for row in choice.targets.values():
            row["how"] = sorted(set(row["how"]))
            row["message"] = "; ".join(m for m in row["message"] if m)
        for device in devices:
            choice.watched[device.interface] = route_peers(device, routed)
        return choice

    async def _place(self, entry: Address, devices: list[DeviceStats]) -> None:
        if any(route_peers(d, [entry.address]) for d in devices):
            entry.how, entry.via, entry.carried, entry.message = (
                "allowed_ips", (), True, "")
            return
        now = self._clock()
        due = (entry.asked is None or entry.how in ("unresolved", "direct", "lost")
               or now - entry.asked >= FOLLOW_EVERY)
        if due:
            entry.asked = now
            try:
                translations = await self._conntrack(str(entry.address), entry.port)
            except Exception as err:  # ConntrackError, or a test's fault
                translations = None
                entry.message = f"conntrack cannot be read ({err})"
            if translations:
                via = follow(translations, entry.address)
                if via != entry.via and via:
                    log.info("tunnel target %s is translated to %s (kube-proxy's DNAT, "
                             "conntrack)", entry.address, ", ".join(map(str, via)),
                             extra={"check": "wireguard"})
                entry.via = via
                entry.how = "dnat" if via else "direct"
                entry.message = "" if via else (
                    f"conntrack shows connections to {entry.address} untranslated and no "
                    "peer's allowed IPs hold it")
            elif entry.via:
                entry.how = "cached"
            elif translations is not None:
                entry.message = (f"no peer's allowed IPs hold {entry.address} and conntrack "
                                 "knows no translation for it yet (no connection since "
                                 "the agent started)")
        if entry.via:
            if any(route_peers(d, entry.via) for d in devices):
                entry.carried = True
                if entry.how == "lost":
                    entry.how = "dnat"
            elif entry.carried:
                entry.how = "lost"
            return
        if entry.how == "direct":
            return
        if entry.carried:
            entry.how, entry.message = "lost", f"no peer carries {entry.address} any more"
            return
        entry.how = "unresolved"


async def _resolve(host: str) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def _conntrack(address: str, port: int | None) -> list[Translation]:
    from edgeheal.boundaries.kernel.conntrack import destinations

    return await destinations(address, port)
