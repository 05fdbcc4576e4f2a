"""How the uplink check reads its interfaces: sysfs on every run, netlink only when
something moved (or every :data:`REFRESH`).

**Cost.** A netlink read was a dump of every link, address and route of the host (on a K3s
node a veth per pod, the CNI's routes), parsed into pyroute2 objects; done every 10 s it
was most of the check's CPU and warmed the allocator by 1-1.4 MB. Now it asks for the
uplink interfaces alone (by the names sysfs listed; their addresses and main-table routes
in strict dumps the kernel filters by index), and each run reads sysfs first
(``/sys/class/net/<if>/``: index, operstate, flags, carrier, carrier_changes, rx/tx
packets and bytes; a few tiny file reads) and reuses the addresses and default routes of the last
netlink read while the uplink is *plainly fine*: the same interfaces (names and indices)
in the same link state with no carrier change since that read, rx grown since the last
run, the second probe (if any) answered, and that read found an interface up with an
address and a default route. Anything else — silence starting, a link change or bounce, a
re-created interface, a failed probe, no address or route at the last read — reads netlink
at once, and so does every run ``REFRESH`` (60 s) after the last read: an address or route
lost while traffic still flows shows within 60 s plus one interval.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from edgeheal.boundaries.kernel.interfaces import Interface

REFRESH = 60.0
"""Seconds the fast path may go without a netlink read: the bound on noticing a lost
address or default route while traffic still flows (silence dumps at once)."""


class InterfaceReader:
    """The uplink interfaces of one check, with the last netlink read kept for the fast
    path."""

    def __init__(self, patterns: tuple[str, ...], *, netns: str | None = None,
                 sysfs: Path | Literal["auto"] | None = "auto") -> None:
        self.patterns, self.netns = patterns, netns
        self._sysfs = sysfs
        """Where the fast path reads (``auto``: ``/sys/class/net``, or with ``netns`` none,
        since another namespace's sysfs is not this process's to read; tests that mount
        one pass it); None: no fast path."""
        self.full: tuple[Interface, ...] | None = None
        """The last netlink read (addresses and default routes come from it)."""
        self._full_at = -math.inf
        self._seen: tuple[tuple[Any, ...], ...] = ()
        """sysfs's view of the links at that read: what must not have moved since."""
        self.dumps = 0
        """Netlink reads so far (tests and benchmarks count them)."""

    async def read(self, now: float, *, rx: int | None, probe: str,
                   ) -> tuple[Interface, ...]:
        """The uplink interfaces: from sysfs plus the last netlink read's addresses and
        routes when nothing moved, else a fresh netlink read (see the module docstring).
        ``rx``: the rx packets the check counted at its last run; ``probe``: the second
        probe's last answer ("" without one)."""
        # pyroute2 only with the check on
        from edgeheal.boundaries.kernel import interfaces as ifstate

        root = (None if self.netns else ifstate.SYSFS) if self._sysfs == "auto" \
            else self._sysfs
        fast = ifstate.links(self.patterns, root) if root is not None else ()
        seen = tuple((k.name, k.index, k.oper, k.admin_up, k.carrier, k.carrier_changes)
                     for k in fast)
        full = self.full
        if (full is not None and fast and seen == self._seen
                and now - self._full_at < REFRESH
                and sum(k.rx_packets for k in fast) != rx
                and probe in ("", "ok")
                and any(i.carries and i.addresses and i.default_route for i in full)):
            by_index = {i.index: i for i in full}
            return tuple(dataclasses.replace(by_index[k.index], rx_packets=k.rx_packets,
                                             tx_packets=k.tx_packets, rx_bytes=k.rx_bytes,
                                             tx_bytes=k.tx_bytes) for k in fast)
        interfaces = await ifstate.read(self.patterns, netns=self.netns,
                                        names=tuple(k.name for k in fast) or None)
        self.dumps += 1
        same = [(i.name, i.index) for i in interfaces] == [(k.name, k.index) for k in fast]
        # sysfs of another namespace (names, indices differ) never vouches for this one
        self.full, self._full_at, self._seen = interfaces, now, seen if same else ()
        return interfaces

    def forget(self) -> None:
        """Something moved: the next read is a netlink read, not sysfs alone."""
        self.full = None
