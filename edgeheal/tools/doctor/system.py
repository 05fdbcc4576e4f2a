"""What the doctor reads from the node, behind one narrow, injectable interface.

Every check takes a :class:`System`; the real one reads the kernel (``/sys``,
``/lib/modules``, ``adjtimex``, rtnetlink through pyroute2, ICMP echo sockets), the
WireGuard devices (:mod:`edgeheal.boundaries.wg`), the brokers (:mod:`edgeheal.boundaries.mqtt`),
the Kubernetes API (:mod:`edgeheal.boundaries.kube`) and systemd over D-Bus (dbus-fast). Unit tests
replace any of them with recorded data: a fake ``/sys`` tree, a kernel clock state, a route table.

Everything here only reads. The one exception to "touches nothing" is the MTU probe (a few
ICMP echo requests, only with ``--probe-mtu``) and the state check's temporary file, which
is removed at once (:mod:`edgeheal.tools.doctor.state`). Heavy imports (pyroute2, dbus-fast,
paho, lightkube) happen inside the function that needs them: the doctor is a command, never
imported by the agent.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import ipaddress
import os
import platform
import secrets
import shutil
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeheal.base import compat
from edgeheal.boundaries.kernel import pyroute2_light as _pyroute2

if TYPE_CHECKING:
    from edgeheal.boundaries.kernel.ethtool import FeatureSource
    from edgeheal.boundaries.kube import KubeClient
    from edgeheal.boundaries.mqtt import ProbeResult
    from edgeheal.boundaries.wg import DeviceStats
    from edgeheal.config import KubernetesSettings, MqttTarget


# --- the kernel's clock state (adjtimex) -----------------------------------------------

STA_UNSYNC = 0x0040
"""``status`` bit: the clock is not synchronized (set at boot, cleared by an NTP daemon)."""
TIME_ERROR = 5
"""``adjtimex`` return value: the clock is not synchronized (``TIME_BAD``)."""


@dataclass(frozen=True, slots=True)
class KernelClock:
    """The kernel's NTP status, as ``adjtimex(2)`` with ``modes = 0`` reports it."""

    state: int
    """The call's return value: TIME_OK 0, TIME_INS 1, TIME_DEL 2, TIME_OOP 3,
    TIME_WAIT 4, TIME_ERROR 5."""
    status: int
    """The ``STA_*`` bits."""
    maxerror_us: int
    esterror_us: int

    @property
    def synchronized(self) -> bool:
        return self.state != TIME_ERROR and not self.status & STA_UNSYNC


class _Timeval(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long))


class _Timex(ctypes.Structure):
    """``struct timex`` of ``<sys/timex.h>`` (Linux, glibc and musl, 64- and 32-bit)."""

    _fields_ = (
        ("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
        ("constant", ctypes.c_long), ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long), ("time", _Timeval), ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
        ("_reserved", ctypes.c_int * 16))


def kernel_clock() -> KernelClock:
    """Read (never set: ``modes = 0``) the kernel's clock state; raise OSError."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    tx = _Timex()
    state = libc.adjtimex(ctypes.byref(tx))
    if state < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"adjtimex: {os.strerror(code)}")
    return KernelClock(int(state), int(tx.status), int(tx.maxerror), int(tx.esterror))


# --- rtnetlink: links and routes ---------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NodeLink:
    name: str
    index: int
    mtu: int
    oper_state: str


@dataclass(frozen=True, slots=True)
class Route:
    """The kernel's answer to ``ip route get <address>``."""

    ifname: str | None
    source: str | None = None
    error: str | None = None


def _attr(msg: Any, name: str) -> Any:
    try:
        return msg.get_attr(name)
    except Exception:  # a message without the attribute
        return None


def _ipr() -> Any:
    _pyroute2.light()
    from pyroute2.iproute.linux import AsyncIPRoute  # heavy, lazy

    return AsyncIPRoute()


async def links() -> dict[str, NodeLink]:
    """Every link of this network namespace by name (one rtnetlink dump)."""
    ipr = _ipr()
    try:
        found = {}
        async for msg in await ipr.link("dump"):
            name = str(_attr(msg, "IFLA_IFNAME") or msg["index"])
            found[name] = NodeLink(name, int(msg["index"]), int(_attr(msg, "IFLA_MTU") or 0),
                               str(_attr(msg, "IFLA_OPERSTATE") or "UNKNOWN"))
        return found
    finally:
        ipr.close()


async def route(address: str) -> Route:
    """Where the kernel would send a packet to ``address`` now (``RTM_GETROUTE``)."""
    from pyroute2.netlink.exceptions import NetlinkError

    ipr = _ipr()
    try:
        try:
            answer = list(await ipr.route("get", dst=address))
        except NetlinkError as err:
            return Route(None, error=str(err.args[-1] if err.args else err))
        if not answer:
            return Route(None, error="no answer")
        msg = answer[0]
        rtype = msg.get("type") if hasattr(msg, "get") else None
        if rtype is not None and rtype != 1:  # RTN_UNICAST; blackhole/unreachable/prohibit
            return Route(None, error=f"route type {rtype} (not unicast)")
        index = _attr(msg, "RTA_OIF")
        name = None
        if index is not None:
            try:
                name = socket.if_indextoname(int(index))
            except OSError:
                name = str(index)
        return Route(name, source=_attr(msg, "RTA_PREFSRC"))
    finally:
        ipr.close()


# --- ICMP echo with the don't-fragment bit (the MTU probe) ------------------------------

IP_MTU_DISCOVER, IP_PMTUDISC_PROBE = 10, 3
IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE = 23, 3
IPV6_DONTFRAG = 62


def _icmp_socket(family: int) -> tuple[socket.socket, bool]:
    """An ICMP socket: the unprivileged datagram kind if ``ping_group_range`` allows it,
    else a raw one (root). Returns (socket, raw)."""
    proto = socket.IPPROTO_ICMP if family == socket.AF_INET else socket.IPPROTO_ICMPV6
    try:
        return socket.socket(family, socket.SOCK_DGRAM, proto), False
    except OSError:
        return socket.socket(family, socket.SOCK_RAW, proto), True


async def echo(address: str, size: int, wait: float) -> str:
    """Send one ICMP echo request whose IP packet is ``size`` bytes, with the DF bit
    (IPv4) / without fragmentation (IPv6), ignoring the cached path MTU (``PMTUDISC_PROBE``
    sends exactly this size or fails). Returns ``"answered"``, ``"lost"`` (no reply within
    ``wait`` s) or ``"too_big"`` (the local route's MTU refuses it: EMSGSIZE)."""
    addr = ipaddress.ip_address(address)
    family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    header = 20 if addr.version == 4 else 40
    sock, raw = _icmp_socket(family)
    sock.setblocking(False)
    try:
        if addr.version == 4:
            sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_PROBE)
            request, reply = 8, 0
        else:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE)
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_DONTFRAG, 1)
            request, reply = 128, 129
        ident, seq = secrets.randbelow(0xFFFF), secrets.randbelow(0xFFFF)
        token = secrets.token_bytes(8)
        payload = token + bytes(max(0, size - header - 8 - len(token)))
        head = struct.pack("!BBHHH", request, 0, 0, ident, seq)
        packet = head + payload
        if addr.version == 4:  # the kernel computes ICMPv6 checksums, not ICMPv4 on raw
            packet = struct.pack("!BBHHH", request, 0, _checksum(packet), ident, seq) + payload
        loop = asyncio.get_running_loop()
        try:
            await compat.sock_sendto(loop, sock, packet, (address, 0))
        except OSError as err:
            if err.errno == errno.EMSGSIZE:
                return "too_big"
            raise
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            try:
                data = await asyncio.wait_for(loop.sock_recv(sock, 65535), left)
            except compat.TimeoutErrors:
                break
            if raw and addr.version == 4:
                data = data[(data[0] & 0x0F) * 4:]  # a raw IPv4 socket gets the IP header
            if len(data) >= 16 and data[0] == reply and data[8:16] == token and (
                    not raw or struct.unpack("!HH", data[4:8]) == (ident, seq)):
                return "answered"
        return "lost"
    finally:
        sock.close()


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return int(~total & 0xFFFF)


# --- systemd over D-Bus -------------------------------------------------------------------

DEFAULT_BUS = "unix:path=/run/dbus/system_bus_socket"
BUS_ENV = "DBUS_SYSTEM_BUS_ADDRESS"
BUS_TIMEOUT = 5.0


class NoBus(Exception):
    """There is no system bus to ask (no systemd here, or a container without one)."""


def bus_address() -> str:
    return os.environ.get(BUS_ENV) or DEFAULT_BUS


async def unit_properties(address: str, unit: str) -> dict[str, Any]:
    """Every property of ``unit`` (its ``Unit`` and, for a service, ``Service``
    interface) from systemd over D-Bus, by name; ``{}`` when systemd has no such unit.
    Raise :class:`NoBus` when the bus is not there, OSError/RuntimeError when a call fails."""
    if address.startswith("unix:path="):
        path = address.split("=", 1)[1].split(",", 1)[0]
        if not os.path.exists(path):  # noqa: ASYNC240 - a stat of a local socket path
            raise NoBus(f"no system bus at {path}")
    from dbus_fast import BusType, Message, MessageType
    from dbus_fast.aio import MessageBus

    bus = MessageBus(bus_address=address, bus_type=BusType.SYSTEM,
                     **compat.bus_auth_timeout(BUS_TIMEOUT))
    try:
        await asyncio.wait_for(bus.connect(), BUS_TIMEOUT)
    except (OSError, *compat.TimeoutErrors) as err:
        raise NoBus(f"cannot connect to the system bus at {address}: {err}") from err

    async def call(path: str, interface: str, member: str, signature: str,
                   body: list[Any]) -> Any:
        reply = await asyncio.wait_for(bus.call(Message(
            destination="org.freedesktop.systemd1", path=path, interface=interface,
            member=member, signature=signature, body=body)), BUS_TIMEOUT)
        if reply is None:
            raise RuntimeError(f"{member}: no reply")
        if reply.message_type is MessageType.ERROR:
            raise _BusCallError(str(reply.error_name), str(reply.body[0] if reply.body
                                                            else ""))
        return reply.body

    try:
        manager = ("/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager")
        try:
            (path,) = await call(*manager, "GetUnit", "s", [unit])
        except _BusCallError as err:
            if err.name != "org.freedesktop.systemd1.NoSuchUnit":
                raise
            (path,) = await call(*manager, "LoadUnit", "s", [unit])
        props: dict[str, Any] = {}
        for interface in ("org.freedesktop.systemd1.Unit",
                          "org.freedesktop.systemd1.Service"):
            try:
                (values,) = await call(path, "org.freedesktop.DBus.Properties", "GetAll",
                                       "s", [interface])
            except _BusCallError:
                continue  # not a service, or a systemd that lacks the interface
            props.update({k: v.value for k, v in values.items()})
    except _BusCallError as err:
        if err.name in ("org.freedesktop.DBus.Error.ServiceUnknown",
                        "org.freedesktop.DBus.Error.NameHasNoOwner"):
            raise NoBus(f"systemd is not on the system bus at {address}") from err
        raise RuntimeError(f"{err.name}: {err.text}") from err
    finally:
        bus.disconnect()
    return {} if props.get("LoadState") == "not-found" else props


class _BusCallError(Exception):
    def __init__(self, name: str, text: str) -> None:
        super().__init__(f"{name}: {text}")
        self.name, self.text = name, text


# --- the whole interface --------------------------------------------------------------

async def _read_device(ifname: str) -> DeviceStats:
    from edgeheal.boundaries.wg import read_device

    return await read_device(ifname)


async def _conntrack(address: str, port: int | None) -> list[Any]:
    from edgeheal.boundaries.kernel.conntrack import destinations

    return await destinations(address, port)


async def _resolve(host: str) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host.split("%", maxsplit=1)[0]))]
    except ValueError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def _probe(target: MqttTarget, node: str, limit: float) -> ProbeResult:
    from edgeheal.boundaries.mqtt import probe

    return await probe(target, node, limit=limit)


def _kube(settings: KubernetesSettings) -> KubeClient:
    from edgeheal.boundaries.kube import KubeClient

    return KubeClient(settings)


def _features() -> FeatureSource:
    from edgeheal.boundaries.kernel.ethtool import Ethtool

    return Ethtool()


@dataclass
class System:
    """The node as the checks see it; every field can be replaced by a test."""

    sys_root: Path = Path("/sys")
    modules_root: Path = Path("/lib/modules")
    release: str = field(default_factory=platform.release)
    which: Callable[[str], str | None] = shutil.which
    clock: Callable[[], KernelClock] = field(default_factory=lambda: kernel_clock)
    wall: Callable[[], float] = time.time
    device: Callable[[str], Awaitable[DeviceStats]] = _read_device
    links: Callable[[], Awaitable[dict[str, NodeLink]]] = links
    route: Callable[[str], Awaitable[Route]] = route
    resolve: Callable[[str], Awaitable[list[str]]] = _resolve
    conntrack: Callable[[str, int | None], Awaitable[list[Any]]] = _conntrack
    """kube-proxy's translations of a destination (edgeheal.boundaries.kernel.conntrack)."""
    echo: Callable[[str, int, float], Awaitable[str]] = echo
    mqtt_probe: Callable[[MqttTarget, str, float], Awaitable[ProbeResult]] = _probe
    kube: Callable[[KubernetesSettings], KubeClient] = _kube
    features: Callable[[], FeatureSource] = _features
    bus_address: str = field(default_factory=bus_address)
    unit: Callable[[str, str], Awaitable[dict[str, Any]]] = unit_properties
    polkit_rule: Path = Path("/etc/polkit-1/rules.d/50-edgeheal-k3s-restart.rules")
