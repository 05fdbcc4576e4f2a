"""The uplink interfaces as rtnetlink sees them, and the two things done to them.

Why a boundary of its own: the ``uplink`` check needs, per uplink interface, what
``ip -s link``, ``ip addr`` and ``ip route`` print — operational state, carrier, global
addresses, whether the default route leaves through it, the rx/tx packet counters — and the
``link-bounce`` rung sets a link down and up again. Both go over one rtnetlink socket
(pyroute2's ``AsyncIPRoute`` through :mod:`edgeheal.boundaries.kernel.pyroute2_light`, the light
import the offload enforcer's link listener already pays for: no memory added with it on), never a
subprocess. :func:`reachable` is the check's optional second direct-path probe: one TCP
handshake over the host's own route (connection refused also proves the path works).

:func:`links` is the cheap half: what sysfs (``/sys/class/net/<if>/``) says of each uplink
interface — index, operational state, flags, carrier, carrier changes, packet counters —
in a handful of tiny file reads, no socket and no pyroute2. A netlink dump returns every
link, address and route of the host (on a K3s node a veth per pod and the CNI's routes) and
is parsed into pyroute2 objects; the check runs every 10 s while the uplink carries
traffic, so it reads sysfs then and dumps only when something moved (see the check).
sysfs shows the network namespace it was *mounted* in, not the caller's: ``ip netns exec``
remounts it, so an agent started that way (systemd on the host, the lab's edges) sees its
own interfaces; a caller that only switched a thread's namespace must pass ``root``.

Errors are :class:`IfStateError` naming the interface and the kernel's words. ``netns``
(lab and tests only) asks a named network namespace instead of the agent's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeheal.base import compat
from edgeheal.base.ifglob import matches
from edgeheal.boundaries.kernel import pyroute2_light as _pyroute2

log = logging.getLogger("edgeheal.ifstate")  # the name operators grep for

UP_STATES = frozenset({"UP", "UNKNOWN"})
"""Operational states that carry packets (tun, ppp and some modems report UNKNOWN)."""


class IfStateError(Exception):
    """rtnetlink could not be asked, or refused a change (the message names the link)."""


@dataclass(frozen=True, slots=True)
class Interface:
    name: str
    index: int
    oper: str
    """``IFLA_OPERSTATE``: UP, DOWN, LOWERLAYERDOWN, DORMANT, UNKNOWN, ..."""
    admin_up: bool
    carrier: bool
    addresses: tuple[str, ...]
    """Global (scope universe) IPv4/IPv6 addresses."""
    default_route: bool
    """A default route (IPv4 or IPv6) leaves through this interface."""
    rx_packets: int
    tx_packets: int
    route_metric: int | None = None
    """The lowest metric (``RTA_PRIORITY``) of a default route through this interface (None:
    none). Of several default routes the kernel uses the lowest metric's: that is the
    active uplink (:mod:`edgeheal.checks.uplink_failover`)."""

    @property
    def carries(self) -> bool:
        """Administratively up, operationally up (or UNKNOWN) and with carrier."""
        return self.admin_up and self.carrier and self.oper in UP_STATES


@dataclass(frozen=True, slots=True)
class UplinkLink:
    """One interface as sysfs shows it (:func:`links`): no addresses, no routes."""

    name: str
    index: int
    oper: str
    """``operstate`` upper-cased, as rtnetlink names it: UP, DOWN, UNKNOWN, ..."""
    admin_up: bool
    carrier: bool
    carrier_changes: int
    """Every carrier loss and return since the device was created (a bounce adds 2)."""
    rx_packets: int
    tx_packets: int


SYSFS = Path("/sys/class/net")


def _text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:  # carrier of a link set down: EINVAL; a link gone in between: ENOENT
        return ""


def _int(text: str, base: int = 10) -> int:
    try:
        return int(text, base)
    except ValueError:
        return 0


def links(patterns: tuple[str, ...], root: Path = SYSFS) -> tuple[UplinkLink, ...]:
    """Every interface under ``root`` matching ``patterns``, in index order (sysfs only:
    a few tiny reads per interface, done inline since sysfs never waits on a disk)."""
    if not patterns:
        return ()
    try:
        names = [n for n in os.listdir(root) if matches(n, patterns)]
    except OSError:
        return ()
    out = []
    for name in names:
        d = root / name
        index = _int(_text(d / "ifindex"))
        if not index:  # gone since the listing
            continue
        flags = _int(_text(d / "flags"), 16)
        out.append(UplinkLink(
            name=name, index=index, oper=(_text(d / "operstate") or "unknown").upper(),
            admin_up=bool(flags & 0x1), carrier=_text(d / "carrier") == "1",
            carrier_changes=_int(_text(d / "carrier_changes")),
            rx_packets=_int(_text(d / "statistics" / "rx_packets")),
            tx_packets=_int(_text(d / "statistics" / "tx_packets"))))
    return tuple(sorted(out, key=lambda link: link.index))


def _attr(msg: Any, name: str) -> Any:
    try:
        return msg.get_attr(name)
    except Exception:  # a message without the attribute
        return None


def _socket(netns: str | None) -> Any:
    _pyroute2.light()
    from pyroute2.iproute.linux import AsyncIPRoute  # heavy, lazy

    return AsyncIPRoute(**({"netns": netns, "flags": 0} if netns else {}))


async def read(patterns: tuple[str, ...], *, netns: str | None = None,
               ) -> tuple[Interface, ...]:
    """Every interface matching ``patterns`` (names or globs), in index order."""
    if not patterns:
        return ()
    ipr = None
    try:
        ipr = _socket(netns)
        links = [m async for m in await ipr.link("dump")]
        chosen = {int(m["index"]): m for m in links
                  if matches(str(_attr(m, "IFLA_IFNAME") or ""), patterns)}
        if not chosen:
            return ()
        addrs: dict[int, list[str]] = {i: [] for i in chosen}
        async for msg in await ipr.addr("dump"):
            index = int(msg["index"])
            if index in addrs and msg.get("scope", 0) == 0:  # RT_SCOPE_UNIVERSE
                addr = _attr(msg, "IFA_LOCAL") or _attr(msg, "IFA_ADDRESS")
                if addr:
                    addrs[index].append(str(addr))
        defaults: dict[int, int] = {}
        for family in (2, 10):  # AF_INET, AF_INET6
            async for msg in await ipr.route("dump", family=family):
                if msg.get("dst_len", 1) == 0 and msg.get("table") in (254, None) \
                        and msg.get("type", 1) == 1:
                    metric = int(_attr(msg, "RTA_PRIORITY") or 0)
                    oifs = [_attr(msg, "RTA_OIF")] + [
                        hop.get("oif") for hop in _attr(msg, "RTA_MULTIPATH") or ()]
                    for oif in oifs:
                        if oif is not None and int(oif) >= 0:
                            defaults[int(oif)] = min(metric, defaults.get(int(oif), metric))
    except IfStateError:
        raise
    except Exception as err:
        raise IfStateError(f"cannot read the uplink interfaces over rtnetlink: {err}") \
            from err
    finally:
        if ipr is not None:
            ipr.close()
    out = []
    for index, msg in sorted(chosen.items()):
        stats = _attr(msg, "IFLA_STATS64") or _attr(msg, "IFLA_STATS") or {}
        out.append(Interface(
            name=str(_attr(msg, "IFLA_IFNAME")), index=index,
            oper=str(_attr(msg, "IFLA_OPERSTATE") or "UNKNOWN"),
            admin_up=bool(int(msg.get("flags", 0)) & 0x1),  # IFF_UP
            carrier=bool(_attr(msg, "IFLA_CARRIER") if _attr(msg, "IFLA_CARRIER")
                         is not None else int(msg.get("flags", 0)) & 0x10000),  # LOWER_UP
            addresses=tuple(addrs[index]), default_route=index in defaults,
            rx_packets=int(stats.get("rx_packets", 0) if stats else 0),
            tx_packets=int(stats.get("tx_packets", 0) if stats else 0),
            route_metric=defaults.get(index)))
    return tuple(out)


async def set_up(name: str, up: bool, *, netns: str | None = None) -> None:
    """Set link ``name`` administratively up or down; raise :class:`IfStateError`."""
    ipr = None
    try:
        ipr = _socket(netns)
        index = [int(m["index"]) async for m in await ipr.link("dump")
                 if _attr(m, "IFLA_IFNAME") == name]
        if not index:
            raise IfStateError(f"no interface {name}")
        await ipr.link("set", index=index[0], state="up" if up else "down")
    except IfStateError:
        raise
    except Exception as err:
        raise IfStateError(f"cannot set {name} {'up' if up else 'down'}: {err}") from err
    finally:
        if ipr is not None:
            ipr.close()


async def bounce(name: str, *, down_for: float = 2.0, netns: str | None = None) -> None:
    """Down, wait ``down_for`` seconds, up again — and up again even if cancelled."""
    await set_up(name, False, netns=netns)
    try:
        await asyncio.sleep(down_for)
    finally:
        await asyncio.shield(set_up(name, True, netns=netns))


async def reachable(host: str, port: int, limit: float) -> str:
    """One TCP handshake to ``host:port`` within ``limit`` seconds: ``"ok"`` when it
    completes *or is refused* (the path carried a packet both ways), otherwise what went
    wrong (``timeout``, the errno's name)."""
    writer = None
    try:
        async with compat.timeout(limit):
            _, writer = await asyncio.open_connection(host, port)
    except compat.TimeoutErrors:
        return "timeout"
    except ConnectionRefusedError:
        return "ok"
    except OSError as err:
        return errno.errorcode.get(err.errno or 0, type(err).__name__)
    else:
        return "ok"
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
