"""rtnetlink link events, as an async iterator: (event, ifname, ifindex).

Why: the offload enforcer must re-apply "TX checksum offload off" the moment an interface
appears, is re-created (a USB modem re-enumerating comes back with offload on) or has its
features changed by someone. The kernel announces all three on the ``RTNLGRP_LINK``
multicast group: ``RTM_NEWLINK`` for a new or changed link -- including a feature change,
which the kernel signals as ``NETDEV_FEAT_CHANGE`` and rtnetlink turns into an
``RTM_NEWLINK`` (so ``ethtool -K`` by hand wakes us too) -- and ``RTM_DELLINK`` when it
goes away.

The listener is a pyroute2 ``AsyncIPRoute`` socket bound to that group and driven by the
asyncio loop: no thread, no polling; the task sleeps in the kernel until a message arrives.
Bind first, then do the full reconcile pass, so an interface appearing in between is
never missed. If the socket fails (e.g. ENOBUFS after the receive buffer overflowed, when
events were lost), iteration raises :class:`LinkListenerError`; the caller reopens and
re-reconciles everything, which is what a lost event would have triggered anyway.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edgeheal.boundaries.kernel import pyroute2_light as _pyroute2

log = logging.getLogger("edgeheal.links")  # the name operators grep for

NEWLINK: Literal["RTM_NEWLINK"] = "RTM_NEWLINK"
DELLINK: Literal["RTM_DELLINK"] = "RTM_DELLINK"


UDEV_RUN = Path("/run/udev")
"""systemd-udevd's runtime directory: ``control`` (its socket) and ``data/`` (its database)."""


def udev_busy_with(ifindex: int, run: Path = UDEV_RUN) -> bool:
    """True while udev runs here and has not finished its event for link ``ifindex``.

    udevd writes a device's database entry (``data/n<ifindex>`` for a network interface)
    at the end of its event, after the rules, the rename among them (systemd's
    ``udev-event.c``: ``udev_event_execute_rules`` then ``device_update_db``). Where udev
    does not run (a container) this is False at once; two stats, on link events only."""
    try:
        return (run / "control").exists() and not (run / "data" / f"n{ifindex}").exists()
    except OSError:
        return False


class LinkListenerError(Exception):
    """The rtnetlink event socket could not be opened or failed; events may be lost."""


@dataclass(frozen=True, slots=True)
class LinkEvent:
    """One link notification: ``RTM_NEWLINK`` (appeared or changed) or ``RTM_DELLINK``."""

    event: Literal["RTM_NEWLINK", "RTM_DELLINK"]
    ifname: str
    ifindex: int

    def __iter__(self) -> Any:
        return iter((self.event, self.ifname, self.ifindex))


class LinkListener:
    """``async with LinkListener() as links: async for ev in links: ...``

    ``netns`` (lab and tests only) listens in a named network namespace instead of the
    agent's own.
    """

    def __init__(self, *, netns: str | None = None) -> None:
        self._netns = netns
        self._ipr: Any = None

    async def __aenter__(self) -> LinkListener:
        try:
            _pyroute2.light()
            from pyroute2.iproute.linux import AsyncIPRoute  # heavy, lazy
            from pyroute2.netlink.rtnl import RTMGRP_LINK

            kwargs: dict[str, Any] = {"netns": self._netns, "flags": 0} if self._netns else {}
            self._ipr = AsyncIPRoute(**kwargs)
            await self._ipr.bind(groups=RTMGRP_LINK)
        except Exception as err:
            self.close()
            where = f" in netns {self._netns}" if self._netns else ""
            raise LinkListenerError(f"cannot listen to link events{where}: {err}") from err
        log.debug("listening to rtnetlink link events", extra={"netns": self._netns})
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._ipr is not None:
            ipr, self._ipr = self._ipr, None
            ipr.close()

    def __aiter__(self) -> AsyncGenerator[LinkEvent, None]:
        return self._events()

    async def _events(self) -> AsyncGenerator[LinkEvent, None]:
        if self._ipr is None:
            raise LinkListenerError("the link listener is not open")
        while self._ipr is not None:
            try:
                async with contextlib.aclosing(self._ipr.get()) as batch:
                    async for msg in batch:
                        # msg["event"], not msg.get("event"): get() prefers the IFLA_EVENT
                        # attribute, which a feature change carries (IFLA_EVENT_FEATURES).
                        event = msg["event"]
                        if event not in (NEWLINK, DELLINK):
                            continue
                        yield LinkEvent(event, msg.get_attr("IFLA_IFNAME") or "",
                                        int(msg["index"]))
            except Exception as err:
                if self._ipr is None:  # closed while waiting
                    return
                raise LinkListenerError(f"link event socket failed: {err}") from err
