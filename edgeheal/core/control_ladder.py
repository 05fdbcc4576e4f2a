"""The control ladder's decision: a pure function over the snapshot and the ladder's history.

Why a third ladder: a K3s agent that has lost its server — a heartbeat that stopped, a
local load balancer that accepts and never forwards after an outage (k3s-io/k3s#11349,
#10506), an address changed under the running agent (k3s-io/k3s#2827) — stays so until
someone restarts ``k3s-agent``; the restart keeps the workloads running (K3s's unit has
``KillMode=process``: containerd's shims and the pods survive the agent). It is also the
one remedy that must never run for nothing: a restart while the uplink is down cannot
reach the server either, and costs a re-registration and a Flannel re-sync when the link
returns. So the ladder acts on the ``control`` check's healable verdicts only (the
check's ``healable`` vocabulary: ``heartbeat_stale``, ``balancer_stuck``,
``node_ip_changed``, and ``not_ready`` once it has persisted past ``not_ready_window``),
never on ``server_unreachable``, never while the direct path or the uplink is down and
never while another ladder is acting.

``decide(view, history, now, limits) -> [Action]`` (first matching rule wins):

1. the control check is ``ok``: nothing to do; after restarts that did not cure (or an
   open circuit) ``close_circuit`` (reason ``control_healthy``), not within the grace.
2. ``server_unreachable``: ``skip`` ``server_unreachable`` — the path is down; **never a
   restart**.
3. any other verdict that is not healable (``unknown``: confirming, the API unreadable,
   forbidden; not measured yet): nothing.
4. the shared :func:`edgeheal.core.safeguards.held`: ``paused``, ``circuit_open``; then
   ``fleet_hold``: a valid fleet-wide hold (``[fleet] hold``, the view's ``fleet_hold``)
   holds, as it holds the Flannel ladder. A fault on the server's side (a K3s server
   restarted or overloaded, its load balancer) stales every node's Lease at once with
   each node's direct handshake fine: N agent restarts against a server already in
   trouble, none of which can cure it.
5. ``path_down``: a direct-path MQTT target is failed, or the uplink check is failed — the
   agent's trouble may be the path's, which the check's handshake may have missed
   between its reads.
6. ``other_ladder``: the Flannel or the uplink ladder is acting (the caller says which).
7. ``verdict_window``: the verdict has held for less than ``act_after`` (``not_ready``:
   ``not_ready_window``; a node coming back from an outage turns Ready by itself).
8. the shared :func:`edgeheal.core.safeguards.throttled`: ``open_circuit``,
   ``startup_grace``, ``cooldown``, ``budget_exhausted``.
9. the shared :func:`edgeheal.core.safeguards.jittered`: the episode's first restart
   (no restart in a row yet) waits a random part of ``restart_jitter``, drawn once from the
   caller's random source (``rand``) when it is first due (``watch`` ``restart_jitter``
   with ``until``; the actor keeps it in the history); after every other gate, so none of
   them lines the fleet up again. An ``ok`` check ends the episode's wait
   (:func:`episode_over`).
10. otherwise ``restart`` (``rung`` empty: the actor's one remedy, the K3s unit's restart
   over D-Bus that the registry provides); for ``balancer_stuck`` the action's ``reason``
   tells the actor to clear the agent's load-balancer state first.

Pure: no I/O, no clock; ``now`` is the agent's monotonic clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgeheal import checks
from edgeheal.core import safeguards as ladder
from edgeheal.core.path_verdict import by_path
from edgeheal.core.safeguards import Action, History, Limits, Wording
from edgeheal.model import Snapshot, State

if TYPE_CHECKING:
    from edgeheal.config import Config

NOT_READY = "not_ready"
CLEAR_BALANCER = frozenset({"balancer_stuck"})
"""Verdicts whose restart clears the agent's load-balancer state file first."""
WORDING = Wording(attempts="agent restarts", subject="the control path",
                  attempt="agent restart", act="restart its agent")
SKIP_REASONS = ("server_unreachable", "paused", "circuit_open", "fleet_hold", "path_down",
                "other_ladder", "verdict_window", "startup_grace", "cooldown",
                "budget_exhausted")
"""Every ``skip`` reason :func:`decide` gives (a test keeps it in step with the source)."""


@dataclass(frozen=True, slots=True)
class ControlLimits:
    """The numbers the ladder reads (the future ``[remediation.control]`` section)."""

    act_after: float = 60.0
    """A healable verdict must hold this long (beyond the check's own debounce)."""
    not_ready_window: float = 300.0
    """``not_ready`` must hold this long: a node back from an outage turns Ready itself."""
    cooldown: float = 600.0
    max_per_hour: int = 2
    startup_grace: float = 300.0
    give_up_after: int = 3
    restart_jitter: float = 30.0
    """The first restart of an episode waits a random part of this (``[remediation]
    restart_jitter``, shared with the Flannel ladder); 0: no wait."""
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class ControlView:
    """What the decision reads (pure input)."""

    control: State | None = None
    """The ``control`` check's effective state; None when absent or not run yet."""
    reason: str = ""
    since: float = -math.inf
    """Since when (monotonic) the check has had this reason."""
    healable: frozenset[str] = frozenset()
    """The check's ``healable`` vocabulary."""
    direct_mqtt: Mapping[str, State] = field(default_factory=dict)
    uplink: State | None = None
    """The uplink check's effective state (None: no uplink check)."""
    busy: tuple[str, ...] = ()
    """The other ladders acting now (the caller asks their actors)."""
    fleet_hold: str = ""
    """A fleet hold that holds now, as people read it ("" when none)."""
    started_mono: float = 0.0
    booted_mono: float = -math.inf


def view_of(snapshot: Snapshot, config: Config, *, busy: tuple[str, ...] = (),
            booted_mono: float = -math.inf, reason_since: float = -math.inf,
            fleet_hold: str = "") -> ControlView:
    """Project a snapshot onto what the decision reads (pure); ``reason_since`` as in
    :func:`edgeheal.core.uplink_ladder.view_of`."""
    reg = checks.role("control")
    status = next((snapshot.checks[n] for n in reg.names(config) if n in snapshot.checks),
                  None)
    uplink = next((snapshot.checks[n] for n in checks.role("uplink").names(config)
                   if n in snapshot.checks and snapshot.checks[n].completed), None)
    completed = status is not None and status.completed
    return ControlView(
        control=status.state if status is not None and completed else None,
        reason=status.reason if status is not None and completed else "",
        since=max(status.since_mono, reason_since) if status is not None and completed
        else -math.inf,
        healable=reg.vocabulary.get("healable", frozenset()),
        direct_mqtt=by_path(snapshot, config).states("direct"),
        uplink=uplink.state if uplink is not None else None, busy=busy,
        fleet_hold=fleet_hold, started_mono=snapshot.started_mono, booted_mono=booted_mono)


def decide(view: ControlView, history: History, now: float, limits: ControlLimits, *,
           rand: Callable[[], float] | None = None) -> list[Action]:
    """The decision. Pure: same inputs, same answer; no I/O, no clock. ``rand`` is the
    random source of ``restart_jitter`` (a float in [0, 1)); None draws 0: no wait."""
    shared = Limits(limits.cooldown, limits.max_per_hour, limits.startup_grace,
                    limits.give_up_after)
    if view.control is State.OK:
        if (history.circuit_open or history.failures_in_row) and ladder.may_close(
                now, view.started_mono, shared):
            return [Action("close_circuit", "control_healthy",
                           "the agent reaches its server again: circuit closed, streak "
                           "cleared")]
        return []
    if view.reason == "server_unreachable":
        return [Action("skip", "server_unreachable", (
            "no K3s server answers directly: the path is down, and restarting the agent "
            "cannot reach it either; no restart"))]
    if view.control is not State.FAILED or view.reason not in view.healable:
        return []
    failure = f"control_{view.reason}"
    held = ladder.held(history, now, failure, WORDING)
    if held is not None:
        return [held]
    if view.fleet_hold:
        return [Action("skip", "fleet_hold", (
            f"{failure}: fleet hold ({view.fleet_hold}): no node restarts its K3s agent "
            "until it is released or expires"))]
    down = [n for n, s in view.direct_mqtt.items() if s is State.FAILED]
    if down or view.uplink is State.FAILED:
        what = ", ".join(down) if down else "the uplink check"
        return [Action("skip", "path_down", (
            f"{failure}, but the direct path is failing ({what}): the agent's trouble may "
            "be the path's; no restart"))]
    if view.busy:
        return [Action("skip", "other_ladder", (
            f"{failure}: the {', '.join(view.busy)} ladder is acting; not restarting the "
            "agent under it"))]
    window = limits.not_ready_window if view.reason == NOT_READY else limits.act_after
    if now - view.since < window:
        return [Action("skip", "verdict_window", (
            f"{failure} for {now - view.since:.0f}s; the restart waits {window:g}s (it "
            "may come back by itself)"))]
    throttled = ladder.throttled(history, now, failure, shared,
                                 started_mono=view.started_mono,
                                 booted_mono=view.booted_mono, wording=WORDING)
    if throttled is not None:
        return [throttled]
    waiting = ladder.jittered(history, now, failure, limits.restart_jitter, rand=rand,
                              wording=WORDING)
    if waiting is not None:
        return [waiting]
    verb = "would restart" if limits.dry_run else "restarting"
    extra = " (clearing its load-balancer state first)" if view.reason in CLEAR_BALANCER \
        else ""
    return [Action("restart", failure, f"{failure}: {verb} the K3s agent{extra}",
                   dry_run=limits.dry_run)]


def episode_over(view: ControlView, history: History) -> History:
    """An ``ok`` control check ends the episode: a drawn restart wait no longer applies."""
    return history.waiting_until(None) if view.control is State.OK else history
