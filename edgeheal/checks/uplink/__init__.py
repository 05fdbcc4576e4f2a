"""The uplink check: is the 4G/5G uplink up, and does anything pass through it?

Why: a large share of edge outages are a *stuck modem* — link, address, registration and
signal all fine, an active bearer, and yet no packet gets through (a stale data session, a
PDP context the network dropped silently, a firmware hang). The uplink ladder
(:mod:`edgeheal.core.uplink_ladder`) may act on that, and on nothing else; so this check tells it
apart from the cases where nothing local helps (no coverage) or where the modem's manager is
already at work (no address, no route, the link gone). It observes only, from its own
evidence (checks do not read the snapshot):

- the uplink interfaces (:mod:`edgeheal.boundaries.kernel.interfaces`): operational state and
carrier, global
  addresses, the default route, the rx packet counter — from sysfs plus a netlink read
  (see "Cost" below);
- the optional second direct-path probe (``[uplink] probe``, one TCP handshake): an answer
  means traffic passes, whatever the counters say;
- the modem over ModemManager's D-Bus API (:mod:`edgeheal.boundaries.modemmanager`), when enabled
and
  running: registration, signal quality, whether its bearer is connected.

*Silence* is "nothing passed for ``window``": the probe failing for that long, or without a
probe the interfaces' rx counter flat for that long, counted from the last run whose
verdict explained it (``no_coverage``, ``link_down``, ``no_address``, ``no_route``,
``modem_not_ready``): ``stuck`` needs a whole window of silence with everything else
fine. Reasons (first match wins):

=======================  =========  ===========================================================
reason                   state      meaning
=======================  =========  ===========================================================
``modem_absent``         failed     the uplink's modem (seen, or its interface unplugged) is
                                    gone from ModemManager (or ModemManager does not answer)
                                    for ``modem_absent_after``
``modem_failed``         failed     ModemManager says the modem is ``failed`` for a reason no
                                    SIM change explains (``unknown``, ``unknown-capabilities``)
``registration_denied``  failed     the network refuses to register the modem (3GPP
                                    registration ``denied``; the reject cause when given)
``link_down``            failed     no configured uplink interface exists, or none is up with
                                    carrier
``no_coverage``          failed     the modem is not registered (searching, idle) or has no
                                    signal: nothing local can help
``no_address``           failed     the interface is up but has no global address
``no_route``             failed     it has an address but no default route leaves through it
``stuck``                failed     silent for ``window`` while registered, with signal, an
                                    active bearer, link, address and route: the ladder's case
``modem_not_ready``      unknown    the modem is locked, disabled or initializing, or failed
                                    for its SIM (``sim_missing``, ``sim_locked``, ``sim_error``,
                                    ``esim_without_profiles`` in ``detail.modem.not_ready``,
                                    the fix in the message): a person's matter
``silent``               unknown    silent for ``window``, but the agent cannot tell why (no
                                    ModemManager, the modem not found, or its bearer not
                                    connected): no coverage and a stuck modem look the same
``ok``                   ok         the uplink carries traffic (or was silent for less than
                                    ``window``)
=======================  =========  ===========================================================

ModemManager is asked only when the interfaces' evidence is not plainly fine (silence,
or no interface up with an address and a default route): a healthy uplink costs no D-Bus
call and no dbus-fast import (about 3 MB of RSS, paid once trouble first comes), and the
verdicts that need the modem — ``stuck``, ``no_coverage``, ``silent``, the modem's own
failures — are all reached through silence, a missing address or a link gone.
``no_coverage`` therefore shows up to ``window`` after the cell is lost when the address
survives it.

The modem's own failures come first, before the link's: a modem that vanished, failed or
was refused by the network usually takes its interface down with it, and ``link_down``
(which the ladder leaves to the modem's manager) would hide what can be acted on.
``modem_absent`` needs evidence that the uplink is a modem: one seen on it since the agent
started, or an uplink interface that was unplugged (gone from the kernel, or back with a
new index: a USB device re-enumerating; a NIC whose cable is pulled stays, down). A node
whose uplink has no modem at all is not one that lost it. The modem is asked only when
the uplink is in trouble, so a modem that vanishes *without* taking its interface away,
on an agent that never saw it, reads ``link_down`` (or ``no_address``) until it returns:
the price of asking ModemManager nothing while the uplink is fine.

Cost: each run reads sysfs (a few tiny file reads) and reuses the addresses and default
routes of the last netlink read while the uplink is plainly fine; anything else reads
netlink at once, asking for the uplink interfaces alone, and so does every run ``REFRESH``
(60 s) after the last read (:mod:`edgeheal.checks.uplink.interface_reader`).

Failover: after each run the check records which of its interfaces carries the default
route (:mod:`edgeheal.checks.uplink_failover`: ``detail.active``, the
``edgeheal_uplink_active*`` metrics, the ``uplink.failover`` event with its cause), and on
a switch asks the tunnel check to run at once, which re-learns the WireGuard source
address. Its ``serve`` task listens to rtnetlink link and default-route events
(:mod:`edgeheal.boundaries.kernel.route_events`, ``[uplink] events``) and runs the check
at once, with a fresh netlink read, when one touches an uplink: no polling.

Data: every run also counts the interfaces' rx/tx bytes into the ledger of
:mod:`edgeheal.checks.uplink.usage` (per UTC day and billing period, durable across restarts,
reboots and counter resets; ``detail.data``, ``edgeheal_uplink_bytes_total``, and the
``uplink.plan_forecast``/``uplink.plan_exceeded`` events with ``[uplink] plan``). Cost: two
more sysfs reads per interface a run, and 4 small writes an hour.

Off unless configured: with ``[uplink] interfaces`` empty the check is not created. The
modem's bearer properties (they hold the APN password) are never put in ``detail``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edgeheal.boundaries.modemmanager.readings import Modem, ModemError
from edgeheal.checks import Check, Registration, register
from edgeheal.checks.uplink.interface_reader import InterfaceReader
from edgeheal.checks.uplink.verdict import NOT_SILENCE, REASONS, Evidence, judge
from edgeheal.checks.uplink_failover import EVENT as FAILOVER_EVENT
from edgeheal.checks.uplink_failover import Failover
from edgeheal.model import CheckResult, CheckStatus, Context, Event, Kind

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric

    from edgeheal.boundaries.kernel.interfaces import Interface
    from edgeheal.config import CheckSettings, Config, UplinkSettings

log = logging.getLogger(__name__)

NAME = "uplink"


def pick_modem(modems: tuple[Modem, ...], names: set[str]) -> Modem | None:
    """The modem whose bearer uses one of the uplink interfaces, else the only modem."""
    for m in modems:
        if any(b.interface in names for b in m.bearers) or any(p in names
                                                                for p, _ in m.ports):
            return m
    return modems[0] if len(modems) == 1 else None


class UplinkCheck:
    name = NAME

    def __init__(self, ctx: Context, settings: UplinkSettings, *, netns: str | None = None,
                 modem_manager: Any = None, sysfs: Path | Literal["auto"] | None = "auto",
                 ) -> None:
        self.settings: CheckSettings = settings
        self.uplink: UplinkSettings = settings
        self.ctx, self.netns = ctx, netns
        self.reader = InterfaceReader(settings.interfaces, netns=netns, sysfs=sysfs)
        """The uplink interfaces, read cheaply (:mod:`edgeheal.checks.uplink.interface_reader`;
        ``sysfs``: where its fast path reads)."""
        self._mm = modem_manager
        self._rx: int | None = None
        self._passed = ctx.clock()
        """When traffic last passed (monotonic); the start counts as traffic."""
        self._probe = ""
        self._explained = False
        """The last verdict explained the silence (``NOT_SILENCE``)."""
        self._modem_seen = False
        """A modem was seen on the uplink since the start, or an uplink interface was
        unplugged (gone from the kernel, or back with a new index): ``modem_absent`` needs
        one of the two."""
        self._indices: dict[str, int] = {}
        """The uplink interfaces' indices as last read (a change is a re-enumeration)."""
        self._absent_since: float | None = None
        """Since when that modem has been missing (monotonic), or None."""
        self.failover = Failover(settings.costs)
        """The active uplink and its switches (:mod:`edgeheal.checks.uplink_failover`)."""
        from edgeheal.checks.uplink.usage import Meter, parse_size

        self.meter = Meter(ctx, plan=parse_size(settings.plan) if settings.plan else None,
                           start_day=settings.plan_start_day, warn=settings.plan_warn,
                           exceeded=settings.plan_exceeded)
        """The data accounting (:mod:`edgeheal.checks.uplink.usage`): ``detail.data``."""

    async def run(self) -> CheckResult:
        from edgeheal.boundaries.kernel import interfaces as ifstate

        now = self.ctx.clock()
        interfaces = await self.reader.read(now, rx=self._rx, probe=self._probe)
        data = self.meter.observe((i.name, i.index, i.rx_bytes, i.tx_bytes)
                                  for i in interfaces)
        indices = {i.name: i.index for i in interfaces}
        if any(indices.get(name) != index for name, index in self._indices.items()):
            self._modem_seen = True  # unplugged or re-enumerated: a modem, not a NIC
        self._indices = indices
        rx = sum(i.rx_packets for i in interfaces)
        if self.uplink.probe:
            from edgeheal.config import split_hostport

            host, port = split_hostport(self.uplink.probe)
            self._probe = await ifstate.reachable(host, port,
                                                  max(1.0, self.settings.timeout - 1.0))
            if self._probe == "ok":
                self._passed = now
        elif self._rx is None or rx != self._rx:
            self._passed = now
        self._rx = rx
        silent = max(0.0, now - self._passed)
        absent_for = 0.0
        if silent < self.uplink.window and not self._explained and any(
                i.carries and i.addresses and i.default_route for i in interfaces):
            modem, note = None, ""  # plainly fine: the modem is not asked (see docstring)
            self._absent_since = None
        else:
            modem, note = await self._modem({i.name for i in interfaces})
            if modem is not None:
                self._modem_seen, self._absent_since = True, None
            elif self._modem_seen and self.uplink.modem_manager:
                if self._absent_since is None:
                    self._absent_since = now
                absent_for = max(now - self._absent_since, 1e-9)
        result = judge(Evidence(interfaces, modem, note, silent, self._probe,
                                absent_for=absent_for,
                                absent_after=self.uplink.modem_absent_after),
                       self.uplink.window)
        result = self._follow(interfaces, now, result)
        self._explained = result.reason in NOT_SILENCE
        if self._explained:  # the modem is asked again next run: is it still so?
            self._passed = now
        return dataclasses.replace(result, detail={**result.detail, "data": data})

    def _follow(self, interfaces: tuple[Interface, ...], now: float,
                result: CheckResult) -> CheckResult:
        """Record the active uplink; on a switch, the event and a tunnel run at once."""
        switch = self.failover.observe(interfaces, now)
        if switch is not None:
            log.warning("%s", switch.message, extra={"check": NAME, **switch.to_json()})
            self.ctx.emit(Event(FAILOVER_EVENT, switch.message, switch.to_json()))
            from edgeheal import checks  # the tunnel re-learns its source address now

            for name in checks.role("tunnel").names(self.ctx.config):
                self.ctx.hasten(name)
        return dataclasses.replace(
            result, detail={**result.detail, "active": self.failover.to_json(now)})

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self.failover.collect()

    async def serve(self) -> None:
        """Run the check at once when rtnetlink says an uplink's link or a default route
        moved (``[uplink] events``); idle otherwise. A failed socket raises: the agent
        restarts this task with backoff, and the first run after reads netlink afresh."""
        if not self.uplink.events:
            await asyncio.Event().wait()
        from edgeheal.base.ifglob import matches
        from edgeheal.boundaries.kernel.route_events import RouteListener

        async with RouteListener(netns=self.netns) as events:
            self._moved()
            async for ev in events:
                indices = {i.index for i in self.reader.full or ()}
                if ev.route or ev.ifindex in indices or matches(ev.ifname,
                                                                self.uplink.interfaces):
                    log.debug("uplink event %s on %s", ev.event, ev.ifname or ev.ifindex,
                              extra={"check": NAME})
                    self._moved()

    def _moved(self) -> None:
        """Something moved: the next run reads netlink (not sysfs alone), and runs now."""
        self.reader.forget()
        self.ctx.hasten(NAME)

    async def _modem(self, names: set[str]) -> tuple[Modem | None, str]:
        if not self.uplink.modem_manager:
            return None, ""
        from edgeheal.boundaries.modemmanager.client import ModemManager

        if self._mm is None:
            self._mm = ModemManager(self.uplink.dbus_address or None,
                                    timeout=max(1.0, self.settings.timeout / 2))
        try:
            modems = await self._mm.modems()
        except ModemError as err:
            return None, str(err)
        modem = pick_modem(modems, names)
        if modem is None:
            return None, ("ModemManager knows no modem" if not modems
                          else f"{len(modems)} modems, none on the uplink interfaces")
        return modem, ""

    async def close(self) -> None:
        self.meter.flush()  # the writer thread finishes it before the process exits
        if self._mm is not None:
            await self._mm.close()


def _build(ctx: Context) -> list[Check]:
    settings = ctx.config.uplink
    if not settings.interfaces:
        return []
    check = UplinkCheck(ctx, settings)
    if settings.enabled:
        ctx.registry.register(check)
    return [check]


def _names(config: Config) -> tuple[str, ...]:
    return (NAME,) if config.uplink.interfaces and config.uplink.enabled else ()


def _validate(config: Config) -> None:
    from edgeheal.config import ConfigError, split_hostport

    settings = config.uplink
    if settings.plan:
        from edgeheal.checks.uplink.usage import parse_size

        try:
            parse_size(settings.plan)
        except ValueError as err:
            raise ConfigError("uplink.plan", str(err)) from None
    if not 1 <= settings.plan_start_day <= 28:
        raise ConfigError("uplink.plan_start_day", "expected a day of the month from 1 to 28 "
                          f"(every month has it), got {settings.plan_start_day}")
    if settings.probe:
        try:
            split_hostport(settings.probe)
        except ValueError as err:
            raise ConfigError("uplink.probe", str(err)) from None
    if settings.window < (settings.effective_interval(config.agent) * 2):
        raise ConfigError("uplink.window", "expected at least two check intervals, got "
                          f"{settings.window:g}s")
    if not math.isfinite(settings.window):
        raise ConfigError("uplink.window", "expected a finite duration")
    from edgeheal.base.ifglob import matches

    seen: set[str] = set()
    for n, entry in enumerate(settings.costs):
        key = f"uplink.costs[{n}]"
        if not entry.interface:
            raise ConfigError(f"{key}.interface", "expected an interface name or glob")
        if not any(matches(entry.interface, (p,)) or entry.interface == p
                   for p in settings.interfaces):
            raise ConfigError(f"{key}.interface", f"{entry.interface!r} is not one of "
                              f"[uplink] interfaces ({', '.join(settings.interfaces)})")
        if entry.interface in seen:
            raise ConfigError(f"{key}.interface", f"{entry.interface!r} is listed twice")
        seen.add(entry.interface)
        if not 0 <= entry.cost <= 255:
            raise ConfigError(f"{key}.cost", f"expected 0 to 255, got {entry.cost}")


OWN_KINDS = frozenset({"stuck", "no_coverage", "modem_absent", "modem_failed",
                       "registration_denied"})
"""Reasons with an alert kind of their own (``uplink.<reason>``); the rest are
``uplink.down``."""


def _alert(status: CheckStatus) -> tuple[str, str]:
    if status.reason in OWN_KINDS:
        return f"uplink.{status.reason}", "uplink.recovered"
    return "uplink.down", "uplink.recovered"


KINDS: dict[str, Kind] = {
    "uplink.stuck": Kind(
        "critical", "The uplink is up, registered, with signal and a connected bearer, yet "
        "nothing passes for `[uplink] window`: a stuck modem (the uplink ladder's case).",
        problem=True),
    "uplink.no_coverage": Kind(
        "warning", "The modem has no coverage (not registered, searching, or no signal): "
        "nothing local helps; no rung is ever tried for it.", problem=True),
    "uplink.modem_absent": Kind(
        "critical", "The uplink's modem is gone from ModemManager (or ModemManager does not "
        "answer) for `[uplink] modem_absent_after`: a firmware crash, a driver or "
        "ModemManager fault; the ladder restarts ModemManager, then re-authorizes the USB "
        "device (docs/runbook.md).", problem=True),
    "uplink.modem_failed": Kind(
        "critical", "ModemManager marks the modem `failed` (`detail.modem.failed_reason`) "
        "for a reason no SIM change explains; the ladder restarts ModemManager, then "
        "re-authorizes the USB device (docs/runbook.md).", problem=True),
    "uplink.registration_denied": Kind(
        "critical", "The network refuses to register the modem (`detail.modem.reject_cause`"
        ": a 3GPP reject cause): a SIM, subscription or data plan the operator refuses. At "
        "most one radio off/on an hour; then only a person can fix it.", problem=True),
    "uplink.down": Kind(
        "warning", "The uplink interface is down or gone, has no address or no default "
        "route, the modem is not ready (a missing or locked SIM: `detail.modem.not_ready` "
        "and the message name the fix), or the agent cannot tell why nothing passes "
        "(`detail.reason`).",
        problem=True),
    "uplink.recovered": Kind("info", "The uplink carries traffic again."),
    FAILOVER_EVENT: Kind(
        "warning", "The default route moved to another uplink interface; `detail` names "
        "`from`, `to`, their costs and the `cause` (`carrier_lost`, `route_withdrawn`, "
        "`address_lost`, `operator`, `link_gone`, `preferred`: the fail-back)."),
    "uplink.plan_forecast": Kind(
        "warning", "The billing period's data usage reached `[uplink] plan_warn` percent of "
        "`plan`, or at the last 24 h's rate it will pass the plan before the period ends "
        "(`detail`: used, forecast, `runs_out_on`). Once a period."),
    "uplink.plan_exceeded": Kind(
        "critical", "The billing period's data usage reached `[uplink] plan_exceeded` percent "
        "of `plan`. Once a period."),
}

register(Registration(NAME, _build, names=_names, doc=__doc__ or "", kinds=KINDS,
                      alert=_alert, validate=_validate, reasons=REASONS,
                      default_enabled=True, role="uplink"))
