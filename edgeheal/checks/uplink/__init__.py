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

Cost: a netlink read was a dump of every link, address and route of the host (on a K3s
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edgeheal.boundaries.modemmanager.readings import Modem, ModemError
from edgeheal.checks import Check, Registration, register
from edgeheal.checks.uplink_failover import EVENT as FAILOVER_EVENT
from edgeheal.checks.uplink_failover import Failover
from edgeheal.model import CheckResult, CheckStatus, Context, Event, Kind, State

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric

    from edgeheal.boundaries.kernel.interfaces import Interface
    from edgeheal.config import CheckSettings, Config, UplinkSettings

log = logging.getLogger(__name__)

NAME = "uplink"
REASONS = ("ok", "stuck", "no_coverage", "no_address", "no_route", "link_down", "silent",
           "modem_not_ready", "modem_absent", "modem_failed", "registration_denied")
"""Every reason the verdict gives (``edgeheal_check_reason``'s closed table)."""
REGISTERED = frozenset({"home", "roaming"})
"""3GPP registration states with service."""
NOT_READY = frozenset({"failed", "unknown", "initializing", "locked", "disabled",
                       "disabling", "enabling"})
"""MMModemState names of a modem that is not (yet) usable: not coverage, not stuck."""
NO_SERVICE = frozenset({"enabled", "searching"})
"""MMModemState names of a modem that is enabled but has no network."""
NOT_SILENCE = frozenset({"no_coverage", "link_down", "no_address", "no_route",
                         "modem_not_ready", "modem_absent", "modem_failed",
                         "registration_denied"})
"""Verdicts that explain the silence: it counts towards ``stuck`` only from the end of
the last of them, so the first run after coverage returns (the modem registered again,
the first packet not yet in) is not ``stuck`` for the whole outage."""
SIM_FIXES = {
    "sim-missing": ("sim_missing", "no SIM: insert one (or select a slot that holds one)"),
    "sim-error": ("sim_error", "the SIM is unusable (permanently locked or faulty): replace "
                  "it or unlock it with its PUK"),
    "esim-without-profiles": ("esim_without_profiles",
                              "the eSIM has no profile: provision one"),
}
"""``StateFailedReason`` names that a person must fix at the SIM: (detail, the fix)."""
REFRESH = 60.0
"""Seconds the fast path may go without a netlink read: the bound on noticing a lost
address or default route while traffic still flows (silence dumps at once)."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """One run's observations (pure input of :func:`judge`)."""

    interfaces: tuple[Interface, ...]
    modem: Modem | None
    """The uplink's modem (None: not asked, no ModemManager, or no modem)."""
    modem_note: str
    """Why there is no modem ("ModemManager not running: ..."), or ""."""
    silent_for: float
    """Seconds nothing has passed (0: traffic now)."""
    probe: str
    """The second probe's last answer (``ok``, ``timeout``, an errno name) or "" (none)."""
    absent_for: float = 0.0
    """Seconds the modem seen on the uplink has been missing (0: not missing)."""
    absent_after: float = math.inf
    """``[uplink] modem_absent_after``."""


def judge(ev: Evidence, window: float) -> CheckResult:
    """The verdict (pure; the table in the module docstring)."""
    detail: dict[str, Any] = {
        "interfaces": {i.name: {"oper": i.oper.lower(), "carrier": i.carrier,
                                "addresses": len(i.addresses),
                                "default_route": i.default_route} for i in ev.interfaces},
        "silent_seconds": round(ev.silent_for, 1)}
    if ev.probe:
        detail["probe"] = ev.probe
    m = ev.modem
    if m is not None:
        bearer = next((b for b in m.bearers if b.connected), None)
        detail["modem"] = {"state": m.state, "registration": m.registration,
                           "signal_quality": m.signal_quality,
                           "bearer_connected": bearer is not None,
                           "bearer_interface": bearer.interface if bearer else ""}
        if m.state == "failed":
            detail["modem"]["failed_reason"] = m.failed_reason
        if m.unlock_required not in ("none", "unknown"):
            detail["modem"]["unlock_required"] = m.unlock_required
        if m.reject_cause:
            detail["modem"]["reject_cause"] = m.reject_cause
    elif ev.modem_note:
        detail["modem"] = {"note": ev.modem_note}
    if m is None and ev.absent_for and ev.absent_for >= ev.absent_after:
        why = ev.modem_note or "no modem"
        return CheckResult(State.FAILED, "modem_absent", (
            f"the uplink's modem is gone for {ev.absent_for:.0f}s ({why}): longer than a "
            "re-enumeration takes"), detail)
    if m is not None:
        early = _modem_verdict(m, detail)
        if early is not None:
            return early
    if not ev.interfaces:
        return CheckResult(State.FAILED, "link_down", "no uplink interface exists", detail)
    up = [i for i in ev.interfaces if i.carries]
    if not up:
        states = ", ".join(f"{i.name} {i.oper.lower()}"
                           + ("" if i.carrier else " no carrier") for i in ev.interfaces)
        return CheckResult(State.FAILED, "link_down", f"uplink down ({states})", detail)
    if m is not None:
        if m.state in NOT_READY:
            return CheckResult(State.UNKNOWN, "modem_not_ready",
                               f"the modem is {m.state}", detail)
        no_reg = bool(m.registration) and m.registration not in REGISTERED
        if no_reg or m.state in NO_SERVICE or (m.signal_recent and m.signal_quality == 0):
            why = (f"registration {m.registration}" if no_reg
                   else f"modem {m.state}" if m.state in NO_SERVICE else "no signal")
            return CheckResult(State.FAILED, "no_coverage",
                               f"no coverage ({why}, signal {m.signal_quality}%)", detail)
    addressed = [i for i in up if i.addresses]
    if not addressed:
        return CheckResult(State.FAILED, "no_address",
                           f"{', '.join(i.name for i in up)}: no address", detail)
    if not any(i.default_route for i in addressed):
        return CheckResult(State.FAILED, "no_route",
                           f"no default route through {', '.join(i.name for i in addressed)}",
                           detail)
    if ev.silent_for < window:
        return CheckResult(State.OK, "ok", "the uplink carries traffic" if not ev.silent_for
                           else f"silent for {ev.silent_for:.0f}s (stuck after "
                           f"{window:g}s)", detail)
    what = "the probe fails" if ev.probe else "rx flat"
    if m is None:
        return CheckResult(State.UNKNOWN, "silent", (
            f"nothing passes for {ev.silent_for:.0f}s ({what}), and without the modem's "
            f"state the agent cannot tell no coverage from a stuck modem"), detail)
    if not any(b.connected for b in m.bearers):
        return CheckResult(State.UNKNOWN, "silent", (
            f"nothing passes for {ev.silent_for:.0f}s ({what}); the modem has no connected "
            "bearer (its manager is reconnecting?)"), detail)
    return CheckResult(State.FAILED, "stuck", (
        f"stuck: nothing passes for {ev.silent_for:.0f}s ({what}) although the modem is "
        f"{m.registration or m.state} with signal {m.signal_quality}% and a connected "
        "bearer"), detail)


def _modem_verdict(m: Modem, detail: dict[str, Any]) -> CheckResult | None:
    """The verdicts the modem's own report decides before the link's (module docstring)."""
    if m.state == "failed":
        sim = SIM_FIXES.get(m.failed_reason)
        if sim is not None:
            detail["modem"]["not_ready"] = sim[0]
            return CheckResult(State.UNKNOWN, "modem_not_ready",
                               f"the modem failed: {sim[1]}", detail)
        return CheckResult(State.FAILED, "modem_failed", (
            f"ModemManager marks the modem failed (reason {m.failed_reason}): a firmware or "
            "driver fault ModemManager does not recover from by itself"), detail)
    if m.state == "locked":
        lock = m.unlock_required if m.unlock_required not in ("none", "unknown") else "a PIN"
        detail["modem"]["not_ready"] = "sim_locked"
        return CheckResult(State.UNKNOWN, "modem_not_ready", (
            f"the SIM is locked ({lock}): unlock it (`mmcli -i SIM --pin=...`, or the PIN in "
            "the connection's settings); no rung can"), detail)
    if m.registration == "denied":
        cause = f", reject cause {m.reject_cause} {m.reject_name}" if m.reject_cause else ""
        return CheckResult(State.FAILED, "registration_denied", (
            f"the network denies registration{cause}: a SIM, subscription or plan the "
            "operator refuses (out of credit, barred, not provisioned)"), detail)
    return None


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
        self._sysfs = sysfs
        """Where the fast path reads (``auto``: ``/sys/class/net``, or with ``netns`` none,
        since another namespace's sysfs is not this process's to read; tests that mount
        one pass it); None: no fast path."""
        self._mm = modem_manager
        self._rx: int | None = None
        self._passed = ctx.clock()
        """When traffic last passed (monotonic); the start counts as traffic."""
        self._probe = ""
        self._explained = False
        """The last verdict explained the silence (``NOT_SILENCE``)."""
        self._full: tuple[Interface, ...] | None = None
        """The last netlink read (addresses and default routes come from it)."""
        self._full_at = -math.inf
        self._seen: tuple[tuple[Any, ...], ...] = ()
        """sysfs's view of the links at that read: what must not have moved since."""
        self.dumps = 0
        """Netlink reads so far (tests and benchmarks count them)."""
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

    async def _interfaces(self, now: float) -> tuple[Interface, ...]:
        """The uplink interfaces: from sysfs plus the last netlink read's addresses and
        routes when nothing moved, else a fresh netlink read (see the module docstring)."""
        # pyroute2 only with the check on
        from edgeheal.boundaries.kernel import interfaces as ifstate

        root = (None if self.netns else ifstate.SYSFS) if self._sysfs == "auto" \
            else self._sysfs
        fast = ifstate.links(self.uplink.interfaces, root) if root is not None else ()
        seen = tuple((k.name, k.index, k.oper, k.admin_up, k.carrier, k.carrier_changes)
                     for k in fast)
        full = self._full
        if (full is not None and fast and seen == self._seen
                and now - self._full_at < REFRESH
                and sum(k.rx_packets for k in fast) != self._rx
                and self._probe in ("", "ok")
                and any(i.carries and i.addresses and i.default_route for i in full)):
            by_index = {i.index: i for i in full}
            return tuple(dataclasses.replace(by_index[k.index], rx_packets=k.rx_packets,
                                             tx_packets=k.tx_packets, rx_bytes=k.rx_bytes,
                                             tx_bytes=k.tx_bytes) for k in fast)
        interfaces = await ifstate.read(self.uplink.interfaces, netns=self.netns,
                                        names=tuple(k.name for k in fast) or None)
        self.dumps += 1
        same = [(i.name, i.index) for i in interfaces] == [(k.name, k.index) for k in fast]
        # sysfs of another namespace (names, indices differ) never vouches for this one
        self._full, self._full_at, self._seen = interfaces, now, seen if same else ()
        return interfaces

    async def run(self) -> CheckResult:
        from edgeheal.boundaries.kernel import interfaces as ifstate

        now = self.ctx.clock()
        interfaces = await self._interfaces(now)
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
                indices = {i.index for i in self._full or ()}
                if ev.route or ev.ifindex in indices or matches(ev.ifname,
                                                                self.uplink.interfaces):
                    log.debug("uplink event %s on %s", ev.event, ev.ifname or ev.ifindex,
                              extra={"check": NAME})
                    self._moved()

    def _moved(self) -> None:
        """Something moved: the next run reads netlink (not sysfs alone), and runs now."""
        self._full = None
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
