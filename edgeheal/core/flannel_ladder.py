"""The remediation policy: a pure decision over the snapshot and the action history.

``decide(view, history, now, settings) -> [Action]`` answers "should Flannel be restarted
now?" without doing I/O or reading a clock, so every rung and every safeguard is a row in
a table-driven test (tests/remediation/test_policy.py). The actor
(:mod:`edgeheal.agent.remediation`) builds the :class:`TunnelView` from the snapshot, runs the
chosen remedy, and records what happened back into the :class:`History`, which it persists
(:mod:`edgeheal.agent.remediation.history`).

What the policy knows of the layers below, and why: the tunnel-path and direct-path MQTT
targets come from the configuration, grouped by :func:`edgeheal.core.path_verdict.by_path` (the one
projection of the snapshot onto the two paths). The WireGuard and offload checks are read
by their names, :data:`edgeheal.checks.wireguard.NAME` and
:data:`edgeheal.checks.offload.NAME` (one constant each, in the check that owns it): the
WireGuard check's state *and reason* are the restart rung's evidence (the reasons below are
that check's vocabulary), and the offload state is recorded when the policy declines to
act on a degraded tunnel. Which remedies exist is not the policy's business: the view's
``mode`` is the resolved remedy, or :data:`NO_REMEDY`.

The ladder (first matching rule wins):

1. the tunnel is healthy (WireGuard ``ok`` and no tunnel-path MQTT target failing):
   nothing to do; if the circuit is open or earlier restarts did not cure, ``close_circuit``
   (not within ``startup_grace`` of the agent's start: :func:`edgeheal.core.safeguards.may_close`).
2. ``degraded`` tunnel (``rekey_failing``): ``watch``, never a restart. The session still
   carries traffic and the incident's cause (TX checksum offload) is cured by the offload
   enforcer alone; the action records the offload check's state.
3. a *failed* tunnel: WireGuard ``failed`` with reason ``stalled``/``dead``/
   ``never_connected`` (or ``no_peers``/``interface_missing``: Flannel lost the peers or
   the device it manages, which a restart rebuilds), ``send_failing``, or a tunnel-path
   MQTT target ``failed`` while every direct-path target is ``ok`` in a run begun after
   that failure (and the failing target ran since WireGuard was last ok again: see
   :func:`awaiting`; the actor hastens what it waits for). Anything else
   (``unknown``, not yet measured) is no evidence: no action.
3b. ``send_failing`` (the device cannot send: a keepalive was due and did not leave) is
   never a restart, whatever the safeguards say; the check's ``detail.cause`` decides the
   ``skip`` reason and the message:

   =====================================  ======================  ========================
   cause                                  skip reason             why no restart
   =====================================  ======================  ========================
   ``no_address``/``no_route``/           ``uplink_down``         the uplink is gone; a
   ``link_down``/``no_endpoint``                                  new device sends through
                                                                  the same missing route
   ``local``                              ``local_send_failure``  route, link and address
                                                                  are fine: something on
                                                                  this host drops the
                                                                  packets (a firewall
                                                                  rule), and a restart
                                                                  does not remove it
   anything else (``unknown``)            ``send_failing``        the host's routing or
                                                                  firewall, not Flannel's
                                                                  state
   =====================================  ======================  ========================

   The evidence for ``local``: the lab's output-drop case (nftables ``drop`` in the edge
   namespace's output hook, ``sendmsg`` -> EPERM) keeps failing across a device
   re-creation, which is what a Flannel restart does to ``flannel-wg``; the rule is not
   Flannel's (Flannel's own rules accept 51820). The alert (``wireguard.send_failing``)
   carries the cause; the direct-path target tells the rest.
4. a failed tunnel passes the safeguards in this order, each a ``skip`` with its reason:
   ``paused`` (operator), ``circuit_open``, ``fleet_hold`` (a valid fleet-wide hold on
   ``<topic_prefix>/fleet/hold`` holds: a hub fault fails every node's tunnel at once and
   no node's restart can cure it; the view's ``fleet_hold`` says it), ``direct_path_down``
   (a direct-path target fails too: the uplink or the cloud is down, a restart cannot
   help), ``uplink_settling``
   (the direct path came back less than ``uplink_settle`` ago: an outage stalls the tunnel
   too, so give it that long to recover by itself; found in the lab's uplink-outage
   scenario, where restarting on the uplink's return "healed" an outage), ``mode_none``,
   ``startup_grace`` (agent or node started less than ``startup_grace`` ago),
   ``cooldown`` (last restart too recent), ``budget_exhausted`` (``max_per_hour`` restarts
   in the last sliding hour). Before the time gates, ``give_up_after`` restarts in a row
   that did not cure open the circuit (``open_circuit``).
5. the first restart of an episode (no restart in a row yet) waits a random fraction of
   ``restart_jitter``, drawn once when it is first due (``watch`` with reason
   ``restart_jitter`` and :attr:`~edgeheal.core.safeguards.Action.until`; the actor keeps it
   in :attr:`History.jitter_until`). Why: a hub fault fails every edge's tunnel in the same
   second, and every other gate (``startup_grace``, ``uplink_settle``, ``cooldown``) ends
   at the same moment on every node too; without it N nodes would delete N pods or restart
   N k3s-agents against one K3s server in the same second. It comes last, after every gate,
   so no gate re-synchronises the fleet after it. The fraction comes from the caller's
   random source (``rand``): the decision stays a function of its inputs.
   With the first rung (below) on, the wait comes before the rung: the rung's fixed verify
   bound then carries each node's spread on to its restarts.
6. otherwise ``restart`` (``dry_run`` marks it: the actor says everything, does nothing).
   **The first rung** (``[remediation.rebind]``, opt-in): when the view offers one
   (``first_rung``: a ``pre-restart`` remedy usable on this node), the tunnel's reason is
   one of its ``unanswered`` reasons (``stalled``/``dead``: a peer that had a session and
   is no longer answered) — or a tunnel-path target fails while the WireGuard check is
   ``ok`` or unanswered (the lab's ``stale-nat``: the MQTT probe's timeout comes before
   the check's ``rx_stall_after``) —, the uplink check (if any) is ``ok`` and no attempt
   of this failure has failed yet (``failures_in_row == 0``), the ``restart`` names that rung
   (``Action.rung``) and the actor runs it instead of the restart remedy. It passes every
   safeguard above, and counts like a restart for the circuit and the budget; if it does
   not cure, the streak is 1 and the next decision is the restart, which does *not* wait
   ``cooldown`` after the rung (the cooldown is between restarts: the rung touched nothing
   Flannel owns, and making the restart wait would only lengthen the outage).

The safeguards of step 4 that are not about the tunnel's evidence (``paused``,
``circuit_open``, ``open_circuit``, ``startup_grace``, ``cooldown``, ``budget_exhausted``)
and the :class:`History` they read are :mod:`edgeheal.core.safeguards`'s, one implementation shared
with the uplink ladder (:mod:`edgeheal.core.uplink_ladder`); this module re-exports the vocabulary.

**Time.** ``now`` is the agent's monotonic clock; every time in the :class:`History` is on
that timeline (or None for an earlier boot's entry). The :class:`History` holds *every*
piece of state a decision reads besides the snapshot — restart records, the streak, the
circuit, a pause, whether the direct path has had an outage — so an agent restarted on the
same boot decides exactly as the one before it would have. How it survives restarts and
clock steps is :mod:`edgeheal.agent.remediation.history`'s docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgeheal import checks
from edgeheal.core import safeguards as ladder
from edgeheal.core.path_verdict import by_path
from edgeheal.core.safeguards import (  # re-exported: the Flannel ladder's vocabulary since day one
    CURED,
    KEEP,
    WINDOW,
    Action,
    ActionKind,
    History,
    Limits,
    Record,
)
from edgeheal.model import CheckStatus, Snapshot, State

if TYPE_CHECKING:
    from edgeheal.config import Config, RemediationSettings

NO_REMEDY = "none"
"""The view's ``mode`` when there is nothing to restart on this node (alert only)."""
_TUNNEL = checks.role("tunnel")
WIREGUARD = _TUNNEL.module
"""The tunnel's check, as the snapshot names it (the module registered as ``tunnel``)."""
OFFLOAD = checks.role("offload").module
(SEND_FAILING,) = _TUNNEL.vocabulary["send_failing"]
"""The tunnel's reason for a device that cannot send; never a restart (rung 3b)."""
FAILED_REASONS = _TUNNEL.reasons_in(State.FAILED) - {SEND_FAILING}
"""The tunnel's reasons that mean it carries nothing: the restart rung (stalled, dead,
never_connected, no_peers, interface_missing). ``no_peers`` and ``interface_missing`` are
Flannel's own state gone wrong (it lost the peers or the device it manages): exactly what a
restart rebuilds from the cluster's data."""
DEGRADED_REASONS = _TUNNEL.reasons_in(State.DEGRADED)
UPLINK_CAUSES = _TUNNEL.vocabulary["uplink_causes"]
"""``send_failing`` causes that mean the uplink is gone (the tunnel check's own table)."""
UNANSWERED = frozenset(f"wireguard_{r}" for r in _TUNNEL.vocabulary["unanswered"])
"""Failures the first rung answers: a watched peer no longer answered (stalled, dead)."""
UPLINK = checks.role("uplink").module


@dataclass(frozen=True, slots=True)
class TunnelView:
    """What the policy reads from the snapshot: only states and reasons (pure input)."""

    mode: str
    """The resolved remedy's mode, or :data:`NO_REMEDY`."""
    wireguard: State | None = None
    """The WireGuard check's effective state; None when absent or not run yet."""
    wireguard_reason: str = ""
    wireguard_cause: str = ""
    """For ``send_failing``: why the device cannot send (the check's ``detail.cause``)."""
    tunnel_mqtt: Mapping[str, State] = field(default_factory=dict)
    direct_mqtt: Mapping[str, State] = field(default_factory=dict)
    offload: State | None = None
    offload_reason: str = ""
    started_mono: float = 0.0
    """When the agent started (monotonic)."""
    booted_mono: float = -math.inf
    """When the node booted, on the monotonic timeline (``now - CLOCK_BOOTTIME``)."""
    direct_ok_since: float = -math.inf
    """Since when every direct-path target has been ok (monotonic; -inf: no target)."""
    fleet_hold: str = ""
    """A fleet hold that holds now, as people read it ("" when none)."""
    first_rung: str = ""
    """The mode of the rung tried before a restart, usable on this node ("": none)."""
    uplink: State | None = None
    """The uplink check's effective state; None when absent or not run yet."""
    awaiting: tuple[str, ...] = ()
    """MQTT targets whose fresh result ``tunnel_mqtt_failed`` still waits for (see
    :func:`awaiting`); while any is named, that failure is no evidence yet."""

    @property
    def healthy(self) -> bool:
        """WireGuard ok (when watched) and no tunnel-path target failing, with evidence."""
        if self.wireguard is None and not self.tunnel_mqtt:
            return False
        if self.wireguard is not None and self.wireguard is not State.OK:
            return False
        return all(s.serving for s in self.tunnel_mqtt.values())

    @property
    def degraded(self) -> bool:
        return self.wireguard is State.DEGRADED and self.wireguard_reason in DEGRADED_REASONS

    def failure(self) -> str | None:
        """The reason the tunnel counts as failed (a restart rung), or None."""
        if self.wireguard is State.FAILED and (self.wireguard_reason in FAILED_REASONS
                                               or self.wireguard_reason == SEND_FAILING):
            return f"wireguard_{self.wireguard_reason}"
        failing = [n for n, s in self.tunnel_mqtt.items() if s is State.FAILED]
        if failing and self.direct_mqtt and not self.awaiting and all(
                s is State.OK for s in self.direct_mqtt.values()):
            return "tunnel_mqtt_failed"
        return None

    @property
    def direct_down(self) -> bool:
        """A direct-path target is failing or unknown: the uplink or the cloud is down."""
        return any(not s.serving for s in self.direct_mqtt.values())


def view_of(snapshot: Snapshot, config: Config, *, mode: str,
            booted_mono: float = -math.inf, direct_was_down: bool = True,
            fleet_hold: str = "", first_rung: str = "") -> TunnelView:
    """Project a snapshot onto what the policy reads (pure). ``direct_was_down``: see
    :attr:`History.direct_was_down`."""
    def state(name: str) -> CheckStatus | None:
        status = snapshot.checks.get(name)
        return status if status is not None and status.completed else None

    wg, off, up = state(WIREGUARD), state(OFFLOAD), state(UPLINK)
    paths = by_path(snapshot, config)
    # A tunnel-path target without a result yet is unknown, not absent: else an agent
    # restarted by kill -9 whose WireGuard check's first reading says ok (one reading shows
    # no stall) while the target's first connect is still timing out would see a healthy
    # tunnel, close the circuit and clear the streak: restarts beyond give_up_after.
    tunnel = {n: State.UNKNOWN for n in paths.names["tunnel"] if n in snapshot.checks}
    tunnel |= paths.states("tunnel")
    direct = paths.states("direct")
    direct_since = [s.since_mono for s in paths.statuses["direct"].values()
                    if s.state is State.OK]
    return TunnelView(
        direct_ok_since=max(direct_since) if direct_was_down and direct_since and len(
            direct_since) == len(direct) else -math.inf,
        mode=mode,
        wireguard=wg.state if wg else None, wireguard_reason=wg.reason if wg else "",
        wireguard_cause=(str(wg.detail.get("cause") or "")
                         if wg and wg.reason == SEND_FAILING else ""),
        tunnel_mqtt=tunnel, direct_mqtt=direct,
        offload=off.state if off else None, offload_reason=off.reason if off else "",
        started_mono=snapshot.started_mono, booted_mono=booted_mono, fleet_hold=fleet_hold,
        first_rung=first_rung, uplink=up.state if up else None,
        awaiting=awaiting(paths.statuses["tunnel"], paths.statuses["direct"], wg))


def awaiting(tunnel: Mapping[str, CheckStatus], direct: Mapping[str, CheckStatus],
             wireguard: CheckStatus | None) -> tuple[str, ...]:
    """The targets a tunnel-path failure waits to hear from again before it is evidence
    (pure). A direct-path target whose last run began before the tunnel-path failure was
    declared, or whose raw result is not ok (its debounce still shows ok): an uplink that
    drops fails the tunnel-path probe a moment before the direct one, and that is no
    Flannel fault (seen in the lab's modem-drops-ip, 0.1 s apart). A failing tunnel-path
    target whose last run began before WireGuard was ok again: its timeout may be from
    the tunnel's roaming (node-ip-changed); or whose latest run passed (recovering).
    Empty when nothing fails on the tunnel path."""
    failing = {n: s for n, s in tunnel.items() if s.state is State.FAILED}
    if not failing:
        return ()
    declared = max(s.since_mono for s in failing.values())
    stale = [n for n, s in direct.items() if _began(s) < declared
             or (s.observed is not None and s.observed.state is not State.OK)]
    if wireguard is not None and wireguard.state is State.OK:
        stale += [n for n, s in failing.items() if _began(s) < wireguard.since_mono]
    # a failing target whose latest run passed is recovering (its debounce still says
    # failed): after a hub fault the fleet hold is released on WireGuard's recovery while
    # the targets still wait out recover_after (bench/fleet.py saw restarts there)
    stale += [n for n, s in failing.items()
              if s.observed is not None and s.observed.state is State.OK and n not in stale]
    return tuple(sorted(stale))


def _began(status: CheckStatus) -> float:
    """When the status's last run began (monotonic; -inf: never ran)."""
    if status.last_run_mono is None:
        return -math.inf
    return status.last_run_mono - (status.last_duration or 0.0)


def decide(view: TunnelView, history: History, now: float,
           settings: RemediationSettings, *,
           rand: Callable[[], float] | None = None) -> list[Action]:
    """The decision. Pure: same inputs, same answer; no I/O, no clock. ``rand`` is the
    random source of ``restart_jitter`` (a float in [0, 1)); None draws 0: no wait (the
    table tests of the other rungs; the actor passes its own)."""
    if view.healthy:
        if (history.circuit_open or history.failures_in_row) and ladder.may_close(
                now, view.started_mono, Limits.of(settings)):
            return [Action("close_circuit", "tunnel_healthy",
                           "the tunnel is healthy again: circuit closed, streak cleared")]
        return []
    failure = view.failure()
    if failure is None:
        if view.degraded:
            offload = (f"offload {view.offload.value} ({view.offload_reason})"
                       if view.offload is not None else "offload not watched")
            return [Action("watch", view.wireguard_reason,
                           f"tunnel degraded ({view.wireguard_reason}): no restart; {offload}")]
        return []
    if failure == f"wireguard_{SEND_FAILING}":
        return [_send_failing(view)]
    held = ladder.held(history, now, failure)
    if held is not None:
        return [held]
    if view.fleet_hold:
        return [Action("skip", "fleet_hold", f"{failure}: fleet hold ({view.fleet_hold}): "
                       "no node restarts Flannel until it is released or expires")]
    if view.direct_down:
        down = ", ".join(f"{n}={s.value}" for n, s in view.direct_mqtt.items()
                         if not s.serving)
        return [Action("skip", "direct_path_down",
                       f"{failure}, but the direct path fails too ({down}): uplink or cloud "
                       "outage, a restart cannot help")]
    settle_end = view.direct_ok_since + settings.uplink_settle
    if now < settle_end:
        return [Action("skip", "uplink_settling",
                       f"{failure}: the direct path came back {now - view.direct_ok_since:.0f}s "
                       f"ago; the tunnel gets {settings.uplink_settle:g}s to recover by itself")]
    if view.mode == NO_REMEDY:
        return [Action("skip", "mode_none", f"{failure}: no remedy on this node (alert only)")]
    rung = _first_rung(view, history, failure)
    throttled = ladder.throttled(history, now, failure, Limits.of(settings),
                                 started_mono=view.started_mono, booted_mono=view.booted_mono,
                                 no_cooldown_after=view.first_rung if not rung else "")
    if throttled is not None:
        return [throttled]
    waiting = _jitter(history, now, failure, settings, rand)
    if waiting is not None:
        return [waiting]
    if rung:
        verb = "would try" if settings.dry_run else "try"
        return [Action("restart", failure, f"{failure}: {verb} {rung} before a Flannel "
                       "restart (a fresh WireGuard port)", dry_run=settings.dry_run,
                       rung=rung)]
    verb = "would restart" if settings.dry_run else "restart"
    return [Action("restart", failure, f"{failure}: {verb} Flannel ({view.mode})",
                   dry_run=settings.dry_run)]


def _jitter(history: History, now: float, failure: str, settings: RemediationSettings,
            rand: Callable[[], float] | None) -> Action | None:
    """Rung 5: the episode's first restart waits its drawn fraction of ``restart_jitter``
    (:func:`edgeheal.core.safeguards.jittered`, shared with the control ladder)."""
    return ladder.jittered(history, now, failure, settings.restart_jitter, rand=rand)


def episode_over(view: TunnelView, history: History) -> History:
    """A healthy tunnel ends the episode: a drawn restart wait no longer applies."""
    return history.waiting_until(None) if view.healthy else history


def _first_rung(view: TunnelView, history: History, failure: str) -> str:
    """The rung to try before the restart, or "" (rung 5's conditions)."""
    if not view.first_rung or history.failures_in_row or view.uplink not in (None, State.OK):
        return ""
    if failure in UNANSWERED:
        return view.first_rung
    unanswered = {r.removeprefix("wireguard_") for r in UNANSWERED}
    if failure == "tunnel_mqtt_failed" and (view.wireguard is State.OK
                                            or view.wireguard_reason in unanswered):
        return view.first_rung  # the device and its peers look fine: no answer through it
    return ""


def _send_failing(view: TunnelView) -> Action:
    """Rung 3b: the device cannot send; say why, never restart."""
    cause = view.wireguard_cause or "unknown"
    if cause in UPLINK_CAUSES:
        return Action("skip", "uplink_down", (
            f"wireguard_send_failing ({cause}): the uplink is gone, a Flannel restart "
            "cannot send through it; the direct-path target tells the rest"))
    if cause == "local":
        return Action("skip", "local_send_failure", (
            "wireguard_send_failing (local): route, link and address are fine but the "
            "tunnel's packets cannot leave this host (a local firewall rule?); a Flannel "
            "restart does not remove it"))
    return Action("skip", SEND_FAILING, (
        f"wireguard_send_failing ({cause}): the host cannot send the tunnel's packets; "
        "a Flannel restart does not change its routes or firewall"))


def budget_left(history: History, now: float, settings: RemediationSettings) -> int:
    return ladder.budget_left(history, now, Limits.of(settings))


__all__ = ["CURED", "KEEP", "WINDOW", "Action", "ActionKind", "History", "Record",
           "TunnelView", "budget_left", "decide", "episode_over", "view_of"]
