"""Which uplink carries the default route, and a switch from one to another (a failover).

Why: on a node with two uplinks (Ethernet or Wi-Fi plus LTE, or two modems) the network
manager moves the default route when the first loses its carrier or its route, and back
when it returns (NetworkManager and systemd-networkd order default routes by metric; LF
EVE orders its ports by a cost 0-255). With it the node's source address changes: the
WireGuard tunnel's source, the address K3s registered, and which link the traffic is
billed on. The ``uplink`` check (:mod:`edgeheal.checks.uplink`) asks this module, after each
of its runs, which of its interfaces is *active*, and turns a change into the
``uplink.failover`` event, the ``detail.active`` block of ``/status`` and the
``edgeheal_uplink_active*`` metrics.

The active uplink is the kernel's choice among the uplink interfaces that carry traffic
(up, carrier, a global address) and have a default route of the main table: the one whose
default route has the lowest metric; of equal metrics, the lower ``[[uplink.costs]]`` cost,
then the order of ``[uplink] interfaces``. edgeheal never moves a route itself (that is the
network manager's job, and two managers fighting over the default route is worse than
one); the cost ranks ties and says what the active link costs.

A switch names the cause: why the previous uplink stopped being the active one, read from
that interface's state in the same observation (first match wins):

===================  ===================================================================
cause                meaning
===================  ===================================================================
``link_gone``        the interface no longer exists (a USB modem re-enumerating or
                     unplugged) or was re-created with a new index
``operator``         it was set administratively down (``ip link set ... down``, an
                     operator, or a rung of the uplink ladder)
``carrier_lost``     it is admin-up but lost its carrier (cable, Wi-Fi association, the
                     modem's data session)
``address_lost``     it keeps its carrier but lost its global address (DHCP lease or
                     bearer gone)
``route_withdrawn``  it keeps carrier and address but its default route was removed
``preferred``        it still has everything, but another uplink's default route now has a
                     lower metric (the preferred uplink returned: the fail-back)
===================  ===================================================================

A period with no active uplink between two is one switch, with the cause seen when the
first was lost. The first observation after start is not a switch.

Cost: pure; it reads the interfaces the check already read. No I/O, no clock (``now`` is
passed in).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeheal.base.ifglob import matches

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from edgeheal.boundaries.kernel.interfaces import Interface
    from edgeheal.config import UplinkCost

CAUSES = ("link_gone", "operator", "carrier_lost", "address_lost", "route_withdrawn",
          "preferred")
"""Every cause of a switch (closed; the table above)."""
EVENT = "uplink.failover"


@dataclass(frozen=True, slots=True)
class Active:
    """The uplink that carries the default route."""

    interface: str
    index: int
    cost: int
    metric: int | None


@dataclass(frozen=True, slots=True)
class Switch:
    """The active uplink moved from ``previous`` to ``active`` because of ``cause``."""

    previous: Active
    active: Active
    cause: str
    at: float
    """Monotonic seconds of the observation that saw the new uplink."""

    @property
    def message(self) -> str:
        return (f"uplink failover: {self.previous.interface} (cost {self.previous.cost}) -> "
                f"{self.active.interface} (cost {self.active.cost}): {self.cause}")

    def to_json(self) -> dict[str, Any]:
        return {"from": self.previous.interface, "to": self.active.interface,
                "cause": self.cause, "from_cost": self.previous.cost,
                "to_cost": self.active.cost}


def cost_of(name: str, costs: tuple[UplinkCost, ...]) -> int:
    """The first ``[[uplink.costs]]`` entry matching ``name``; 0 when none does."""
    return next((c.cost for c in costs if matches(name, (c.interface,))), 0)


def choose(interfaces: tuple[Interface, ...], costs: tuple[UplinkCost, ...],
           ) -> Active | None:
    """The active uplink of one observation (the rule in the module docstring)."""
    usable = [(i.route_metric or 0, cost_of(i.name, costs), n, i)
              for n, i in enumerate(interfaces)
              if i.carries and i.addresses and i.default_route]
    if not usable:
        return None
    _metric, cost, _, best = min(usable, key=lambda u: u[:3])
    return Active(best.name, best.index, cost, best.route_metric)


def cause(previous: Active, interfaces: tuple[Interface, ...]) -> str:
    """Why ``previous`` is no longer the active uplink (the table in the docstring)."""
    now = next((i for i in interfaces if i.name == previous.interface), None)
    if now is None or now.index != previous.index:
        return "link_gone"
    if not now.admin_up:
        return "operator"
    if not now.carries:
        return "carrier_lost"
    if not now.addresses:
        return "address_lost"
    if not now.default_route:
        return "route_withdrawn"
    return "preferred"


class Failover:
    """The active uplink across the check's runs; :meth:`observe` after each read."""

    def __init__(self, costs: tuple[UplinkCost, ...]) -> None:
        self.costs = costs
        self.active: Active | None = None
        self.since: float | None = None
        """When the active uplink became active (monotonic; None: none yet)."""
        self.last: Switch | None = None
        self.switches: dict[str, int] = dict.fromkeys(CAUSES, 0)
        self._left: tuple[Active, str] | None = None
        """The uplink lost while no other took over, and why."""

    def observe(self, interfaces: tuple[Interface, ...], now: float) -> Switch | None:
        """Record one observation; the switch it shows, if any."""
        new = choose(interfaces, self.costs)
        current = self.active
        if new is None:
            if current is not None:
                self._left = (current, cause(current, interfaces))
            self.active = None
            return None
        before, why = self._left if current is None and self._left is not None else (
            current, "")
        self.active, self._left = new, None
        if before is None or new.interface == before.interface:  # re-created: the same
            if current is None or self.since is None:
                self.since = now
            return None
        switch = Switch(before, new, why or cause(before, interfaces), now)
        self.last, self.since = switch, now
        self.switches[switch.cause] += 1
        return switch

    @property
    def count(self) -> int:
        """Switches since start (the generation a reader compares)."""
        return sum(self.switches.values())

    def to_json(self, now: float) -> dict[str, Any]:
        """``detail.active`` of the uplink check."""
        a = self.active
        return {
            "interface": a.interface if a else None, "cost": a.cost if a else None,
            "route_metric": a.metric if a else None,
            "since_seconds": (round(now - self.since, 1) if a and self.since is not None
                              else None),
            "switches": self.count,
            "last_switch": self.last.to_json() if self.last else None,
        }

    def collect(self) -> Iterator[Metric]:
        """``edgeheal_uplink_active``, ``..._active_cost``, ``..._failovers_total``."""
        from prometheus_client.core import (  # only on scrape
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        active = GaugeMetricFamily(
            "edgeheal_uplink_active", "1 for the uplink interface that carries the default "
            "route (no sample: none does).", labels=["interface"])
        cost = GaugeMetricFamily(
            "edgeheal_uplink_active_cost", "The active uplink's [[uplink.costs]] cost, 0 "
            "(free) to 255 (dearest).", labels=["interface"])
        total = CounterMetricFamily(
            "edgeheal_uplink_failovers", "Switches of the active uplink, by cause.",
            labels=["cause"])
        a = self.active
        if a is not None:
            active.add_metric([a.interface], 1.0)
            cost.add_metric([a.interface], float(a.cost))
        for name, n in self.switches.items():
            total.add_metric([name], float(n))
        yield from (active, cost, total)
