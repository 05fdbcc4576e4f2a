"""rtnetlink events that can move the default route: links and default routes.

Why: the ``uplink`` check follows the interface that carries the default route
(:mod:`edgeheal.checks.uplink_failover`). A failover is a carrier lost (``RTM_NEWLINK``
with the carrier gone), an interface removed (``RTM_DELLINK``), or a default route
withdrawn or added by the network manager (``RTM_DELROUTE`` / ``RTM_NEWROUTE``: when
NetworkManager, systemd-networkd or ModemManager's bearer setup deactivate a device they
remove its routes; a route metric decides which default the kernel uses). The kernel
announces all of them on the ``RTNLGRP_LINK``, ``RTNLGRP_IPV4_ROUTE`` and
``RTNLGRP_IPV6_ROUTE`` multicast groups, so one socket bound to the three wakes the check
within milliseconds, with no polling.

Only default routes of the main table are passed on (``dst_len`` 0, table 254): on a K3s
node the CNI adds and removes a route per pod, and those must not wake anything. A link
event is passed on for every link (the caller matches names; a veth per pod is cheap to
ignore). The listener is a pyroute2 ``AsyncIPRoute`` driven by the asyncio loop, like the
offload enforcer's :mod:`edgeheal.boundaries.kernel.link_events`: no thread, no subprocess;
the task sleeps in the kernel until a message arrives. If the socket fails (ENOBUFS when
events were lost), iteration raises :class:`RouteListenerError`; the caller reopens and
re-reads everything, which is what a lost event would have triggered anyway.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from edgeheal.boundaries.kernel import pyroute2_light as _pyroute2

log = logging.getLogger(__name__)

MAIN_TABLE = 254
"""RT_TABLE_MAIN: where the default routes a network manager installs live."""
EVENTS = frozenset({"RTM_NEWLINK", "RTM_DELLINK", "RTM_NEWROUTE", "RTM_DELROUTE"})


class RouteListenerError(Exception):
    """The rtnetlink event socket could not be opened or failed; events may be lost."""


@dataclass(frozen=True, slots=True)
class RouteEvent:
    """One notification that may move the default route."""

    event: str
    """``RTM_NEWLINK``, ``RTM_DELLINK``, ``RTM_NEWROUTE`` or ``RTM_DELROUTE``."""
    ifindex: int
    """The link (a route's output interface; 0 for a multipath route)."""
    ifname: str = ""
    """The link's name (link events only: a route carries the index alone)."""

    @property
    def route(self) -> bool:
        return self.event in ("RTM_NEWROUTE", "RTM_DELROUTE")


def _attr(msg: Any, name: str) -> Any:
    try:
        return msg.get_attr(name)
    except Exception:  # a message without the attribute
        return None


def parse(msg: Any) -> RouteEvent | None:
    """The event one rtnetlink message stands for, or None (not a link, not a default
    route of the main table)."""
    event = msg["event"]  # not msg.get("event"): that prefers the IFLA_EVENT attribute
    if event not in EVENTS:
        return None
    if event in ("RTM_NEWLINK", "RTM_DELLINK"):
        return RouteEvent(event, int(msg["index"]), str(_attr(msg, "IFLA_IFNAME") or ""))
    table = _attr(msg, "RTA_TABLE") or msg.get("table")
    if msg.get("dst_len", 1) != 0 or table != MAIN_TABLE:
        return None
    return RouteEvent(event, int(_attr(msg, "RTA_OIF") or 0))


class RouteListener:
    """``async with RouteListener() as events: async for ev in events: ...``

    ``netns`` (lab and tests only) listens in a named network namespace instead of the
    agent's own.
    """

    def __init__(self, *, netns: str | None = None) -> None:
        self._netns = netns
        self._ipr: Any = None

    async def __aenter__(self) -> RouteListener:
        try:
            _pyroute2.light()
            from pyroute2.iproute.linux import AsyncIPRoute  # heavy, lazy
            from pyroute2.netlink.rtnl import (
                RTMGRP_IPV4_ROUTE,
                RTMGRP_IPV6_ROUTE,
                RTMGRP_LINK,
            )

            kwargs: dict[str, Any] = {"netns": self._netns, "flags": 0} if self._netns else {}
            self._ipr = AsyncIPRoute(**kwargs)
            await self._ipr.bind(groups=RTMGRP_LINK | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE)
        except Exception as err:
            self.close()
            where = f" in netns {self._netns}" if self._netns else ""
            raise RouteListenerError(f"cannot listen to route events{where}: {err}") \
                from err
        log.debug("listening to rtnetlink link and route events",
                  extra={"netns": self._netns})
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._ipr is not None:
            ipr, self._ipr = self._ipr, None
            ipr.close()

    def __aiter__(self) -> AsyncGenerator[RouteEvent, None]:
        return self._events()

    async def _events(self) -> AsyncGenerator[RouteEvent, None]:
        if self._ipr is None:
            raise RouteListenerError("the route listener is not open")
        while self._ipr is not None:
            try:
                async with contextlib.aclosing(self._ipr.get()) as batch:
                    async for msg in batch:
                        found = parse(msg)
                        if found is not None:
                            yield found
            except Exception as err:
                if self._ipr is None:  # closed while waiting
                    return
                raise RouteListenerError(f"route event socket failed: {err}") from err
