"""The uplink ladder's decision: a pure function over the snapshot and the ladder's history.

Why a second ladder, and why so careful: a stuck modem (registered, signal, an active
bearer, yet nothing passes: a stale data session, a PDP context the network dropped, a
firmware hang) stays stuck until someone power-cycles the box. The local remedies — a new
data session, a bounced interface, a re-enumerated USB device, a reboot — are cheap when
the modem is the problem and harmful when it is not: they cut a working link, race the
manager that owns the modem, or reboot a node that only had no coverage. So the ladder acts
on four verdicts of the ``uplink`` check only — ``stuck``, ``modem_absent``,
``modem_failed``, ``registration_denied`` — each with its own rungs (:data:`RUNGS_FOR`),
and only when the agent's other evidence agrees: every direct-path MQTT target failed too
(one broker's outage is not the uplink's; the check's own second probe answering already
means not stuck).

``decide(view, history, now, settings) -> [Action]`` (first matching rule wins):

1. the uplink check is ``ok``: nothing to do; after rungs that did not cure (or an open
   circuit) ``close_circuit`` (reason ``uplink_healthy``).
2. ``no_coverage``, ``no_address``, ``no_route``, ``link_down``: ``skip`` with that reason
   (said once per episode): nothing local helps a cell without coverage, and an address, a
   route or a link that is gone is the modem manager's (or the operator's) business, not a
   reason to reset a modem that may be re-registering right now. **Never a rung.**
3. any other state (``unknown``: the agent cannot tell, e.g. no ModemManager, or a SIM a
   person must fix; or not yet measured): no rung. When the direct path fails meanwhile:
   ``skip`` ``uplink_unknown``.
4. ``stuck``, ``modem_absent``, ``modem_failed``, ``registration_denied`` pass, each a
   ``skip`` with its reason: ``paused``, ``circuit_open`` (shared,
   :func:`edgeheal.core.safeguards.held`); ``direct_path_ok`` (a direct-path target is not
   failed: the uplink carries traffic); ``stuck_window`` (for ``stuck`` and
   ``registration_denied``: so, with every direct-path target failed, for less than
   ``act_after``); ``no_rung`` (no usable rung on this node for this verdict, or only
   ``sim-switch``, which is never an episode's first rung: :func:`episode_rungs`); then the
   shared :func:`edgeheal.core.safeguards.throttled` (``open_circuit`` once
   ``min(give_up_after, the verdict's usable rungs)`` rungs in a row did not cure,
   ``startup_grace``, ``cooldown``, ``budget_exhausted``); for the ``reboot`` rung
   ``reboot_once_a_day``; for a ``radio-cycle`` on ``registration_denied``
   ``denied_once_an_hour`` (a ``radio-cycle`` for a denial in the last hour).
5. otherwise ``restart`` with ``rung`` = the verdict's usable rung at index
   ``failures_in_row``: one rung up per attempt that did not cure (``dry_run`` marks it).
   A denial has one rung — two where ``sim-switch`` is configured (the other SIM is what
   a refused SIM needs) — so one ``radio-cycle`` (and that switch) that did not cure
   opens the circuit: the critical alert says a person is needed, and nothing heavier
   (no USB reset, no reboot) is ever tried.

**The reboot gates.** Off unless configured (the rung is not usable without
``reboot = true``); never within ``startup_grace`` of boot (the shared grace counts from
the later of agent start and boot); at most once a day: no reboot attempt on this boot in
the last 24 h, and — because a reboot starts a new boot, whose monotonic timeline cannot
place the old entry — a reboot recorded on an earlier boot blocks the rung until this boot
is a day old (the time since that reboot is at least this boot's uptime; the wall clock is
not trusted on a box without an RTC). Conservative by construction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgeheal import checks
from edgeheal.core import safeguards as ladder
from edgeheal.core.path_verdict import by_path
from edgeheal.core.safeguards import Action, History, Limits, Wording
from edgeheal.model import Snapshot, State

if TYPE_CHECKING:
    from edgeheal.config import Config, UplinkLadderSettings

REBOOT = "reboot"
"""The rung the once-a-day gate applies to."""
RADIO_CYCLE = "radio-cycle"
SIM_SWITCH = "sim-switch"
"""The rung that is never an episode's first (:func:`decide`)."""
DAY = 86400.0
HOUR = 3600.0
RUNGS_FOR: Mapping[str, tuple[str, ...]] = {
    "stuck": ("modem-reconnect", RADIO_CYCLE, "link-bounce", "driver-rebind",
              "usb-reauthorize", SIM_SWITCH, REBOOT),
    "modem_absent": ("modemmanager-restart", "driver-rebind", "usb-reauthorize", REBOOT),
    "modem_failed": ("modemmanager-restart", "driver-rebind", "usb-reauthorize", REBOOT),
    "registration_denied": (RADIO_CYCLE, SIM_SWITCH),
}
"""Which rungs may act on which verdict (the policy's table; their order on a node is
``[remediation.uplink] rungs``, filtered by this). A stuck session wants a new session
first, then the radio, the link, the USB device; a modem that vanished or failed wants
its manager restarted (ModemManager re-probes every modem on start), then the USB device;
a refused registration gets one radio off/on (a network that refuses again is the
operator's to fix) and never anything heavier: a reboot does not buy credit.

The two opt-in rungs: ``driver-rebind`` (the uplink's USB interface driver unbound and
bound again) is lighter than ``usb-reauthorize`` — one interface's driver re-initialises
(for ``qmi_wwan`` or ``cdc_mbim`` both the net device and the control port that hung),
the device is not re-enumerated and its other interfaces (GNSS, AT ports) stay — so it
comes before it, for a stuck session and for a modem ModemManager lost or marked failed
(whose control port hangs while the net device stays). ``sim-switch`` (the other SIM slot
primary) is what cures a SIM the network refuses or a plan that carries nothing, which no
local reset cures: for ``registration_denied`` after the one radio off/on, and for
``stuck`` after the local rungs and before a reboot (a reboot keeps the same SIM). Never
for ``modem_absent``/``modem_failed``: the modem is gone or broken, not its SIM."""
ACT_AFTER_FOR = frozenset({"stuck", "registration_denied"})
"""Verdicts that wait ``act_after`` before the first rung: silence may end by itself, and
a denial may be a congested cell's passing refusal. ``modem_absent`` already waited
``[uplink] modem_absent_after``; ``modem_failed`` is ModemManager's final word on that
modem object."""
DENIED_EVERY = HOUR
"""At most one ``radio-cycle`` this often for ``registration_denied``."""
NO_RUNG_REASONS = frozenset({"no_coverage", "no_address", "no_route", "link_down"})
"""Uplink verdicts the ladder never acts on, and says so."""
WORDING = Wording(attempts="rungs", subject="the uplink")

SKIP_REASONS = ("no_coverage", "no_address", "no_route", "link_down", "uplink_unknown",
                "paused", "circuit_open", "direct_path_ok", "stuck_window", "no_rung",
                "startup_grace", "cooldown", "budget_exhausted", "reboot_once_a_day",
                "denied_once_an_hour")
"""Every ``skip`` reason :func:`decide` gives (the metrics count each from 0; a test keeps
this list in step with the function's source)."""

UPLINK = checks.role("uplink").module
"""The uplink check, as the snapshot names it (the module registered as ``uplink``)."""


@dataclass(frozen=True, slots=True)
class UplinkView:
    """What the decision reads (pure input)."""

    rungs: tuple[str, ...]
    """The usable rungs on this node, in escalation order."""
    uplink: State | None = None
    """The ``uplink`` check's effective state; None when absent or not run yet."""
    reason: str = ""
    since: float = -math.inf
    """Since when (monotonic) the check has had this state and reason."""
    direct_mqtt: Mapping[str, State] = field(default_factory=dict)
    direct_failed_since: float | None = None
    """Since when every direct-path target has been failed (None: not all failed)."""
    started_mono: float = 0.0
    booted_mono: float = -math.inf


def view_of(snapshot: Snapshot, config: Config, *, rungs: tuple[str, ...],
            booted_mono: float = -math.inf, reason_since: float = -math.inf) -> UplinkView:
    """Project a snapshot onto what the decision reads (pure). ``reason_since``: since when
    the check's *reason* has been what it is (the caller tracks it; the snapshot's
    ``since_mono`` is when the *state* began, and a ``stuck`` right after a failed
    ``no_coverage`` would otherwise inherit the whole outage and skip ``act_after``)."""
    status = snapshot.checks.get(UPLINK)
    completed = status is not None and status.completed
    paths = by_path(snapshot, config)
    direct = paths.statuses["direct"]
    failed = [s.since_mono for s in direct.values() if s.state is State.FAILED]
    return UplinkView(
        rungs=rungs,
        uplink=status.state if status is not None and completed else None,
        reason=status.reason if status is not None and completed else "",
        since=max(status.since_mono, reason_since) if status is not None and completed
        else -math.inf,
        direct_mqtt=paths.states("direct"),
        direct_failed_since=max(failed) if direct and len(failed) == len(direct) else None,
        started_mono=snapshot.started_mono, booted_mono=booted_mono)


def decide(view: UplinkView, history: History, now: float,
           settings: UplinkLadderSettings) -> list[Action]:
    """The decision. Pure: same inputs, same answer; no I/O, no clock."""
    if view.uplink is State.OK:
        if (history.circuit_open or history.failures_in_row) and ladder.may_close(
                now, view.started_mono, Limits.of(settings)):
            return [Action("close_circuit", "uplink_healthy",
                           "the uplink is ok again: circuit closed, streak cleared")]
        return []
    if view.reason in NO_RUNG_REASONS and view.uplink is State.FAILED:
        return [Action("skip", view.reason, _why_not(view.reason))]
    if view.uplink is not State.FAILED or view.reason not in RUNGS_FOR:
        if view.direct_failed_since is not None:
            return [Action("skip", "uplink_unknown", (
                f"the direct path fails and the uplink check says {view.reason or 'nothing'}"
                f" ({view.uplink.value if view.uplink else 'not run'}): the agent cannot "
                "tell a stuck modem from no coverage, so no rung"))]
        return []
    failure = FAILURES[view.reason]
    held = ladder.held(history, now, failure, WORDING)
    if held is not None:
        return [held]
    if view.direct_failed_since is None:
        up = ", ".join(f"{n}={s.value}" for n, s in view.direct_mqtt.items()) or "none"
        return [Action("skip", "direct_path_ok", (
            f"{failure}, but not every direct-path target fails ({up}): traffic passes, "
            "or there is nothing to confirm the silence with; no rung"))]
    stuck_since = max(view.since, view.direct_failed_since)
    if view.reason in ACT_AFTER_FOR and now - stuck_since < settings.act_after:
        return [Action("skip", "stuck_window", (
            f"{failure}: {view.reason} with the direct path down for "
            f"{now - stuck_since:.0f}s; the first rung waits {settings.act_after:g}s (it "
            "may come back by itself)"))]
    rungs = episode_rungs(view.rungs, view.reason)
    if not rungs:
        return [Action("skip", "no_rung", (
            f"{failure}: no usable rung on this node for {view.reason} (it takes "
            f"{', '.join(RUNGS_FOR[view.reason])})"))]
    if rungs == (SIM_SWITCH,):
        return [Action("skip", "no_rung", (
            f"{failure}: sim-switch is the only usable rung for {view.reason}, and an "
            "episode's first rung is never a SIM switch (a gentler rung must have failed "
            "first); no rung"))]
    limits = Limits(settings.cooldown, settings.max_per_hour, settings.startup_grace,
                    min(settings.give_up_after, len(rungs)))
    throttled = ladder.throttled(history, now, failure, limits,
                                 started_mono=view.started_mono,
                                 booted_mono=view.booted_mono, wording=WORDING)
    if throttled is not None:
        return [throttled]
    rung = rungs[min(history.failures_in_row, len(rungs) - 1)]
    if rung == REBOOT:
        blocked = _reboot_blocked(history, now, view.booted_mono)
        if blocked:
            return [Action("skip", "reboot_once_a_day", f"{failure}: {blocked}")]
    if view.reason == "registration_denied" and rung == RADIO_CYCLE:
        last = [r.mono for r in history.records if r.mode == RADIO_CYCLE
                and r.reason == failure and r.result != "dry_run" and r.mono is not None
                and now - r.mono < DENIED_EVERY]
        if last:
            return [Action("skip", "denied_once_an_hour", (
                f"{failure}: the radio was cycled {now - max(last):.0f}s ago and the "
                "network refuses the modem again: a SIM, subscription or plan the operator "
                "must fix (at most one radio off/on an hour; nothing heavier helps)"))]
    verb = "would try" if settings.dry_run else "trying"
    step = rungs.index(rung) + 1
    return [Action("restart", failure,
                   f"{failure}: {verb} rung {step}/{len(rungs)} ({rung})",
                   dry_run=settings.dry_run, rung=rung)]


def episode_rungs(usable: tuple[str, ...], reason: str) -> tuple[str, ...]:
    """The rungs of one episode for verdict ``reason``: the usable ones it takes, in the
    configured order, except that ``sim-switch`` is never first (switching the SIM is the
    one rung that changes which subscription the node uses: a gentler rung must have been
    tried and failed first). Where it comes first it goes second."""
    rungs = tuple(r for r in usable if r in RUNGS_FOR[reason])
    if len(rungs) > 1 and rungs[0] == SIM_SWITCH:
        rungs = (rungs[1], SIM_SWITCH, *rungs[2:])
    return rungs


FAILURES = {"stuck": "uplink_stuck", "modem_absent": "modem_absent",
            "modem_failed": "modem_failed", "registration_denied": "registration_denied"}
"""The failure each verdict acts on, as actions, history records and alerts name it."""


def _reboot_blocked(history: History, now: float, booted_mono: float) -> str:
    """Why the reboot rung may not run now (at most once a day), or ""."""
    reboots = [r for r in history.records if r.mode == REBOOT and r.result != "dry_run"]
    recent = [r for r in reboots if r.mono is not None and now - r.mono < DAY]
    if recent:
        return "a reboot was already tried less than a day ago on this boot"
    uptime = now - booted_mono
    if any(r.mono is None for r in reboots) and uptime < DAY:
        return (f"edgeheal rebooted this node on an earlier boot; this boot is "
                f"{uptime / 3600:.1f}h old (a reboot at most once a day)")
    return ""


def _why_not(reason: str) -> str:
    return {
        "no_coverage": "the modem has no coverage (not registered, or no signal): nothing "
                       "local helps; no rung, only this alert",
        "no_address": "the uplink has no address: its manager is (re)connecting; no rung",
        "no_route": "the uplink has no default route: a configuration matter; no rung",
        "link_down": "the uplink interface is down or gone: no rung (a modem that "
                     "re-enumerates comes back by itself)",
    }[reason]


def budget_left(history: History, now: float, settings: UplinkLadderSettings) -> int:
    return ladder.budget_left(history, now, Limits.of(settings))
