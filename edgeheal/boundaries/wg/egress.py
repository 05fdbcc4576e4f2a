"""Why a WireGuard device cannot send to its peer: the route to the endpoint, the egress
link, its address.

When the ``wireguard`` check sees a peer with persistent keepalive whose tx does not grow
although a keepalive is certainly due (``send_failing``, :mod:`edgeheal.boundaries.wg.health`), the
device's ``sendmsg`` fails. The remediation policy must then know whether the *uplink* is
gone (a Flannel restart cannot help) or only the tunnel's packets cannot leave (a local
firewall rule). This module asks the kernel over rtnetlink (pyroute2, imported lazily) and
names the cause:

==============  ==========================================================================
cause           meaning
==============  ==========================================================================
``no_endpoint`` the peer has no endpoint: the device does not know where to send
``no_address``  the source address the device used for this endpoint is no longer on any
                link (a 4G modem dropping its data session), or the egress link has no
                address of the endpoint's family
``link_down``   the egress link (now, or the one that carried the source address) is not
                operationally up
``no_route``    no route to the endpoint although the old source address and its link are
                still there (someone removed the route)
``local``       route, link and address are fine: the packets cannot leave this host for
                another reason (a local firewall drop: ``sendmsg`` returns EPERM)
``unknown``     the kernel could not be asked (the error is in the detail)
==============  ==========================================================================

Cost: :meth:`Egress.learn` asks for one route per (peer, endpoint) when the check first
sees it (again every 10 s while that found no source), to remember the source address the
kernel picks (the evidence for ``no_address`` once the address and the routes through it are
gone). :meth:`Egress.diagnose` runs for a peer that is ``send_failing``, and once per quiet
spell of a busy tunnel (``quiet_after_data``: at the shipped defaults after every tunnel
probe, so about once a minute); it asks for the route, then for that one link and its
addresses (a strict dump, which the kernel filters by index), so its cost does not grow with
the node's links: a dump of every link and address there (a veth per pod on a K3s node) grew
every agent by ~1 MB a minute to 63-66 MB with 48 extra links (docs/footprint.md). Only a
missing route lists the family's addresses, to find the link that held the learned source.
The pyroute2 module is the one the offload enforcer's link listener already imports
(:mod:`edgeheal.boundaries.kernel.link_events`), so with the enforcer on it adds no memory.
No subprocess.

``netns`` (lab and tests only) asks a named network namespace instead of the agent's own.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import Any

from edgeheal.boundaries.kernel import pyroute2_light as _pyroute2
from edgeheal.boundaries.wg.readings import IPAddress

log = logging.getLogger("edgeheal.wg.egress")  # the name operators grep for

CAUSES = ("no_endpoint", "no_address", "link_down", "no_route", "local", "unknown")
"""Every cause :meth:`Egress.diagnose` reports (closed; documented above)."""
UPLINK_CAUSES = frozenset({"no_endpoint", "no_address", "link_down", "no_route"})
"""Causes that mean the uplink (or what the device knows of it) is gone: a Flannel restart
cannot send through it either."""
UP_STATES = frozenset({"UP", "UNKNOWN"})
"""Operational states that carry packets (tun, ppp and some modems report UNKNOWN)."""


@dataclass(frozen=True, slots=True)
class Route:
    """What the kernel says about sending to one address."""

    ifindex: int | None
    ifname: str | None
    source: str | None
    gateway: str | None
    error: str | None = None
    """The lookup failed: the errno's text (e.g. "Network is unreachable")."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    cause: str
    message: str
    detail: dict[str, Any]


def _attr(msg: Any, name: str) -> Any:
    try:
        return msg.get_attr(name)
    except Exception:  # a message without the attribute
        return None


class Egress:
    """rtnetlink questions about the path to a peer's endpoint; see the module docstring."""

    def __init__(self, *, netns: str | None = None) -> None:
        self.netns = netns

    def _socket(self) -> Any:
        _pyroute2.light()
        from pyroute2.iproute.linux import AsyncIPRoute  # heavy, lazy

        # strict_check: the kernel filters a dump by the request's header (one link's
        # addresses), instead of sending every address for pyroute2 to parse and drop
        return AsyncIPRoute(strict_check=True,
                            **({"netns": self.netns, "flags": 0} if self.netns else {}))

    async def _route(self, ipr: Any, address: IPAddress) -> Route:
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            answer = list(await ipr.route("get", dst=str(address)))
        except NetlinkError as err:
            return Route(None, None, None, None, error=str(err.args[-1] if err.args else err))
        if not answer:
            return Route(None, None, None, None, error="no answer")
        msg = answer[0]
        rtype = msg.get("type") if hasattr(msg, "get") else None
        if rtype is not None and rtype != 1:  # RTN_UNICAST; blackhole/unreachable/prohibit
            return Route(None, None, None, None, error=f"route type {rtype}")
        index = _attr(msg, "RTA_OIF")
        return Route(ifindex=index, ifname=None, source=_attr(msg, "RTA_PREFSRC"),
                     gateway=_attr(msg, "RTA_GATEWAY"))

    async def learn(self, address: IPAddress) -> str | None:
        """The source address the kernel would use to reach ``address`` now (None: no
        route, or the kernel could not be asked). Called once per (peer, endpoint)."""
        ipr = None
        try:
            ipr = self._socket()
            route = await self._route(ipr, address)
        except Exception as err:  # evidence for later, never fatal
            log.debug("cannot look up the route to %s: %s", address, err)
            return None
        finally:
            if ipr is not None:
                ipr.close()
        return route.source

    async def diagnose(self, endpoint: IPAddress | None, *, source: str | None,
                       ) -> Diagnosis:
        """Why sends to ``endpoint`` fail; ``source`` is what :meth:`learn` remembered."""
        if endpoint is None:
            return Diagnosis("no_endpoint", "the peer has no endpoint", {})
        ipr = None
        try:
            ipr = self._socket()
            return await self._diagnose(ipr, endpoint, source)
        except Exception as err:  # say what is known, never fail the check
            return Diagnosis("unknown", f"cannot ask the kernel: {err}",
                             {"error": str(err)})
        finally:
            if ipr is not None:
                ipr.close()

    async def _link(self, ipr: Any, index: int | None) -> tuple[str, str] | None:
        """(name, operstate) of one link, asked for by index (None: no such link)."""
        from pyroute2.netlink.exceptions import NetlinkError

        if index is None:
            return None
        try:
            answer = list(await ipr.link("get", index=index))
        except NetlinkError:  # ENODEV: gone since the route was read
            return None
        if not answer:
            return None
        msg = answer[0]
        return (str(_attr(msg, "IFLA_IFNAME") or index),
                str(_attr(msg, "IFLA_OPERSTATE") or "UNKNOWN"))

    async def _addresses(self, ipr: Any, family: int, index: int | None = None,
                         ) -> list[tuple[int, str]]:
        """(ifindex, address) of every address of ``family`` (of link ``index`` only, when
        given: the kernel filters a strict dump by the header's index, so one link's
        addresses are all that crosses the socket and gets parsed)."""
        query: dict[str, Any] = {"family": family}
        if index is not None:
            query.update(index=index, dump_filter=lambda msg: msg)
        found = []
        async for msg in await ipr.addr("dump", **query):
            addr = _attr(msg, "IFA_LOCAL") or _attr(msg, "IFA_ADDRESS")
            if addr and (index is None or int(msg["index"]) == index):
                found.append((int(msg["index"]), str(addr)))
        return found

    async def _diagnose(self, ipr: Any, endpoint: IPAddress, source: str | None,
                        ) -> Diagnosis:
        import socket

        family = socket.AF_INET if endpoint.version == 4 else socket.AF_INET6
        route = await self._route(ipr, endpoint)
        # One link and its addresses, never a dump of every link: on a K3s node (a veth
        # per pod) a full dump here, once a minute after every probe's quiet, grew the
        # agent by ~1 MB a step (docs/footprint.md). Only a missing route needs every
        # address of the family, to find the link that held the learned source.
        if route.error:
            addresses = await self._addresses(ipr, family)
        elif route.ifindex is not None:
            addresses = await self._addresses(ipr, family, route.ifindex)
        else:  # a route without an output link: nothing to ask about
            addresses = []
        holder = next((i for i, a in addresses if a == source), None) if route.error \
            else route.ifindex
        links = {holder: found} if (found := await self._link(ipr, holder)) else {}
        detail: dict[str, Any] = {
            "endpoint": str(endpoint), "learned_source": source,
            "route": None if route.error else {
                "dev": links.get(route.ifindex or -1, ("?", ""))[0],
                "gateway": route.gateway, "source": route.source},
        }
        if route.error:
            detail["route_error"] = route.error
            if source is not None and holder is None:
                return Diagnosis("no_address", f"no route to {endpoint} and the source "
                                 f"address {source} is gone from every link", detail)
            if holder is not None:
                name, oper = links.get(holder, ("?", "UNKNOWN"))
                detail["link"] = {"name": name, "oper_state": oper}
                if oper not in UP_STATES:
                    return Diagnosis("link_down", f"no route to {endpoint}: link {name} "
                                     f"(source {source}) is {oper.lower()}", detail)
            return Diagnosis("no_route", f"no route to {endpoint} ({route.error})", detail)
        name, oper = links.get(route.ifindex or -1, ("?", "UNKNOWN"))
        own = [a for i, a in addresses if i == route.ifindex]
        detail["link"] = {"name": name, "oper_state": oper, "addresses": len(own)}
        if oper not in UP_STATES:
            return Diagnosis("link_down", f"the route to {endpoint} leaves through {name}, "
                             f"which is {oper.lower()}", detail)
        if not own:
            return Diagnosis("no_address", f"the route to {endpoint} leaves through {name}, "
                             f"which has no IPv{endpoint.version} address", detail)
        return Diagnosis("local", f"route to {endpoint} via {name} is up and addressed: the "
                         "packets cannot leave this host (a local firewall rule?)", detail)


def parse(address: str | None) -> IPAddress | None:
    """An address from its text form (zone dropped); None when absent or unparseable."""
    if not address:
        return None
    try:
        return ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return None


__all__ = ["CAUSES", "UPLINK_CAUSES", "Diagnosis", "Egress", "Route", "parse"]
