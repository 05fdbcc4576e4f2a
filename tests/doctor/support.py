"""Fakes for the doctor's :class:`~edgeheal.tools.doctor.system.System`: recorded links, routes,
devices and clock states, so each check runs against data and not this machine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeheal.boundaries.wg.readings import DeviceStats, NoSuchDevice, PeerStats
from edgeheal.config import Config
from edgeheal.settings import loads
from edgeheal.tools.doctor.system import KernelClock, NoBus, NodeLink, Route, System

CLOUD = "Y2xvdWQtcHVibGljLWtleS0wMDAwMDAwMDAwMDAwMDA="
NEIGHBOUR = "bmVpZ2hib3VyLXB1YmxpYy1rZXktMDAwMDAwMDAwMDA="
SYNCED = KernelClock(state=0, status=0x2001, maxerror_us=16000, esterror_us=100)
UNSYNCED = KernelClock(state=5, status=0x0041, maxerror_us=16000000, esterror_us=16000000)
NOW = 1_796_000_000.0
"""A wall clock in 2026."""


def config(text: str = "", state_dir: str = "/nonexistent/edgeheal") -> Config:
    return loads(f'[agent]\nstate_dir = "{state_dir}"\n' + text)


TUNNEL_CONFIG = """
[wireguard]
interfaces = ["flannel-wg", "flannel-wg-v6"]
[[mqtt.targets]]
name = "broker-tunnel"
host = "10.42.1.20"
path = "tunnel"
"""


def peer(key: str = CLOUD, *, endpoint: str | None = "203.0.113.7:51820",
         allowed: tuple[str, ...] = ("10.42.1.0/24",), keepalive: int = 25) -> PeerStats:
    return PeerStats(public_key=key, endpoint=endpoint, allowed_ips=allowed,
                     last_handshake=NOW - 30, rx_bytes=1000, tx_bytes=1000,
                     persistent_keepalive=keepalive)


def device(*peers: PeerStats, name: str = "flannel-wg") -> DeviceStats:
    return DeviceStats(interface=name, listen_port=51820, peers=tuple(peers), reader="uapi")


@dataclass
class Node:
    """A recorded node: links with MTUs, a route table by destination, WireGuard devices."""

    links: dict[str, NodeLink] = field(default_factory=dict)
    routes: dict[str, Route] = field(default_factory=dict)
    devices: dict[str, DeviceStats] = field(default_factory=dict)
    echo_limit: int | None = None
    """Largest ICMP packet that crosses the tunnel (None: nothing answers)."""
    sent: list[int] = field(default_factory=list)
    units: Mapping[str, dict[str, Any]] | None = None
    """systemd's units by name (None: no system bus)."""

    def link(self, name: str, mtu: int) -> None:
        self.links[name] = NodeLink(name, len(self.links) + 1, mtu, "UP")

    async def _links(self) -> dict[str, NodeLink]:
        return dict(self.links)

    async def _route(self, address: str) -> Route:
        return self.routes.get(address, Route(None, error="Network is unreachable"))

    async def _device(self, name: str) -> DeviceStats:
        if name not in self.devices:
            raise NoSuchDevice(name, "no such device")
        return self.devices[name]

    async def _resolve(self, host: str) -> list[str]:
        return [host]

    async def _echo(self, address: str, size: int, wait: float) -> str:
        self.sent.append(size)
        tunnel_mtu = min((lk.mtu for n, lk in self.links.items() if n in self.devices),
                         default=1420)
        if size > tunnel_mtu:
            return "too_big"
        return "answered" if self.echo_limit is not None and size <= self.echo_limit \
            else "lost"

    async def _unit(self, address: str, name: str) -> dict[str, Any]:
        if self.units is None:
            raise NoBus("no system bus at /run/dbus/system_bus_socket")
        return dict(self.units.get(name, {}))

    def system(self, tmp_path: Path | None = None, **kw: Any) -> System:
        base = tmp_path or Path("/nonexistent")
        defaults: dict[str, Any] = {
            "sys_root": base / "sys", "modules_root": base / "lib/modules",
            "release": "6.1.0-test", "which": lambda name: None,
            "clock": lambda: SYNCED, "wall": lambda: NOW, "device": self._device,
            "links": self._links, "route": self._route, "resolve": self._resolve,
            "echo": self._echo, "unit": self._unit, "bus_address": "unix:path=/fake",
            "polkit_rule": base / "polkit.rules"}
        defaults.update(kw)
        return System(**defaults)


def edge(*, tunnel_mtu: int = 1420, uplink_mtu: int = 1500, keepalive: int = 25) -> Node:
    """flannel-wg to one cloud peer over wwan0; flannel-wg-v6 absent."""
    node = Node()
    node.link("lo", 65536)
    node.link("wwan0", uplink_mtu)
    node.link("flannel-wg", tunnel_mtu)
    node.devices["flannel-wg"] = device(
        peer(keepalive=keepalive),
        peer(NEIGHBOUR, endpoint="198.51.100.9:51820", allowed=("10.42.2.0/24",)))
    node.routes["203.0.113.7"] = Route("wwan0", source="100.64.0.2")
    node.routes["198.51.100.9"] = Route("wwan0", source="100.64.0.2")
    node.routes["10.42.1.20"] = Route("flannel-wg", source="10.42.0.0")
    return node
