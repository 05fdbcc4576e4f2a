"""The remediation actor: runs the pure policy and carries out what it decides.

Why an actor apart from the policy: deciding must be pure and testable
(:mod:`edgeheal.core.flannel_ladder`), while doing — restarting Flannel through the chosen remedy,
waiting for the replacement, verifying the tunnel, persisting the history, telling people —
is I/O. The actor reads only the published snapshot (never a check directly) and
re-evaluates on every snapshot change and at least every second.

A restart is one attempt (:mod:`~edgeheal.agent.remediation.attempt`): the remedy run
within its bound, the cure verified from the snapshot, the attempt persisted before and
after, counted and timed (:mod:`edgeheal.agent.remediation.metrics`, which also exports the
circuit, pause, streak and budget as gauges).

Events (alerts): ``remediation.restarted``, ``.recovered``, ``.failed``, ``.skipped``
(once per failure episode and skip reason, not every second), ``.circuit_open``; the same
moments go to the Node (:mod:`edgeheal.agent.remediation.reporting`).

**The first rung.** A ``pre-restart`` remedy (``rebind``, opt-in) is resolved with the
restart remedy and offered to the policy (``TunnelView.first_rung``); a decision that names
it (``Action.rung``) runs it in place of the restart remedy, with the same records, events
and verification, waiting at most that remedy's own ``verify_bound``. Its attempts are
counted as ``action=<its mode>`` (each (mode, result) at 0 from the start when it can exist
in this configuration).

**One actor for every ladder.** The uplink ladder
(:class:`edgeheal.agent.remediation.uplink_actor.UplinkRemediator`) and the control ladder
(:class:`edgeheal.agent.remediation.control_actor.ControlRemediator`) are this class with their own
evidence: it overrides the hooks marked *ladder hook* (what to decide on, which remedy a
decision uses, what recovery means, the alert kinds' prefix, the control commands' and the
history file's names) and inherits everything else — the persisted history written before
and after every attempt, dry-run, skips said once per episode, the circuit, pause/resume/
reset, the counters (``ladder`` label) and the ``/status`` view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from edgeheal import remedies
from edgeheal.agent.remediation import attempt, modes, operator
from edgeheal.agent.remediation.history import HISTORY_FILE, Store, Timeline, boot_id, boottime
from edgeheal.agent.remediation.metrics import KNOWN, RESTART_RESULTS, LadderMetrics
from edgeheal.agent.remediation.reporting import NodeReporter
from edgeheal.core import flannel_ladder as policy
from edgeheal.core.flannel_ladder import Action, History
from edgeheal.core.path_verdict import targets
from edgeheal.model import Context, Event, Snapshot, rfc3339
from edgeheal.remedies import Remedy

if TYPE_CHECKING:
    from edgeheal.base.statefile import Newer
    from edgeheal.boundaries.kube import KubeClient

log = logging.getLogger("edgeheal.remediation.actor")  # the name operators grep for

TICK = 0.2
"""The longest wait for a new snapshot (``ctx.changed``) before the time-based gates are
looked at again, seconds: a new snapshot wakes the actor at once."""
EVALUATE_EVERY = 1.0
"""Evaluate at least this often even without a snapshot change (time-based gates)."""
REPROBE_EVERY = 60.0
"""``auto`` with nothing found: probe again this often."""

class Remediator:
    LADDER: ClassVar[str] = "flannel"
    """*ladder hook*: the ``ladder`` label, and the ladder the remedies are registered in."""
    KIND: ClassVar[str] = "remediation"
    """*ladder hook*: the alert kinds' prefix (``<KIND>.restarted``, ...)."""
    COMMANDS: ClassVar[str] = "remediation"
    """*ladder hook*: the control commands' prefix (``<COMMANDS>.pause``, ...)."""
    HISTORY: ClassVar[str] = HISTORY_FILE
    NODE_EVENTS: ClassVar[Mapping[str, str]] = {
        "acted": "FlannelRestarted", "recovered": "FlannelRecovered",
        "skipped": "RemediationSkipped", "circuit_open": "RemediationCircuitOpen"}
    WHAT: ClassVar[str] = "Flannel"
    SUBJECT: ClassVar[str] = "the tunnel"
    COUNTED: ClassVar[tuple[tuple[str, str], ...]] = KNOWN
    OBEYS_FLEET_HOLD: ClassVar[bool] = True
    """*ladder hook*: a fleet hold (``[fleet] hold``) stops this ladder (the uplink's: no)."""
    """*ladder hook*: the (action, result) pairs counted, each at 0 from the start."""

    def __init__(self, ctx: Context, *, remedy_factory: modes.RemedyFactory | None = None,
                 kube: KubeClient | None = None,
                 boot_clock: Callable[[], float] = boottime, boot: str | None = None,
                 tick: float = TICK, settings: Any = None,
                 rng: random.Random | None = None) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.settings = settings if settings is not None else ctx.config.remediation
        self.clock, self.wall, self.boot_clock, self.tick = ctx.clock, ctx.wall, boot_clock, tick
        self._kube = kube
        self.rng = rng or random.Random()  # noqa: S311 - restart jitter, not security
        self._make = remedy_factory or modes.factory(self.config, self.kube, self.LADDER)
        self._make_first = remedy_factory or modes.factory(self.config, self.kube,
                                                           remedies.PRE_RESTART)
        self.first: Remedy | None = None
        """The rung tried before a restart, usable on this node (None: none)."""
        self.first_why = ""
        self._store = Store(self.config.agent.state_dir,
                            Timeline(boot_id=boot or boot_id(),
                                     offset=boot_clock() - self.clock()), name=self.HISTORY)
        self.history = self._store.load()
        if self._store.reset is not None:  # a damaged history must be said, not just logged
            reset = self._store.reset
            self._emit("agent.state_reset", f"state file {reset.file} was unusable "
                       f"({reset.reason}); started afresh", reset.detail())
        if self._store.newer is not None:  # a downgrade: the file waits, untouched
            self._emit("agent.state_newer", self._store.newer.describe(),
                       self._store.newer.detail())
        self.selection = modes.initial(self.configured_mode)
        self.last: Action | None = None
        self.busy: str | None = None
        self.yield_to: Callable[[], tuple[str, ...]] = lambda: ()
        """The other ladders whose action this one waits out (the agent sets it: the
        Flannel and uplink ladders wait while the control ladder restarts the K3s agent,
        whose embedded Flannel re-creates the tunnel meanwhile)."""
        self._refused_seen: object = None
        self.announced: set[tuple[str, str]] = set()
        """(kind, reason) of skips and watches said once in this failure episode."""
        self.reporter = NodeReporter(self.config, self.kube)
        metrics = LadderMetrics(ctx.registry, self.LADDER, self,
                                self.COUNTED + self.counted_rungs())
        self.restarts, self.duration = metrics.restarts, metrics.duration
        operator.register(self)

    # --- state -----------------------------------------------------------------------------

    @property
    def state_newer(self) -> Newer | None:
        """The history file is of a newer format (kept in memory, never written), or None."""
        return self._store.newer

    @property
    def remedy(self) -> Remedy | None:
        return self.selection.remedy

    @property
    def mode(self) -> str:
        return self.selection.mode

    @property
    def mode_why(self) -> str:
        return self.selection.why

    @property
    def configured_mode(self) -> str:
        return str(self.settings.mode)

    def store(self, history: History) -> None:
        """Adopt ``history`` and persist it, off the loop (an error is logged, not raised);
        :meth:`persist` where it must be on disk before going on."""
        self.history = history
        self._store.save(history)

    async def persist(self, history: History) -> None:
        """:meth:`store`, and wait (the loop serving) until it is on disk."""
        self.store(history)
        await self._store.written()

    def kube(self) -> KubeClient:
        """The shared Kubernetes client (remedies, Events, the condition), made on first use."""
        if self._kube is None:
            from edgeheal.boundaries.kube import KubeClient

            assert self.config.kubernetes is not None  # noqa: S101 - checked by callers
            self._kube = KubeClient(self.config.kubernetes, wall=self.wall)
        return self._kube

    def view(self) -> dict[str, Any]:
        view = operator.view(self)
        if self.config.fleet.hold and self.OBEYS_FLEET_HOLD:
            view["fleet_hold"] = self.fleet_hold() or None
        return view

    async def resolve(self) -> None:
        """Pick the remedy (``auto``: probe in registry order) and say why; and the rung
        before it."""
        self.selection = await modes.resolve(self.config, self._make, self.selection)
        await self.resolve_first()

    def counted_rungs(self) -> tuple[tuple[str, str], ...]:
        """*ladder hook*: the first rungs' (mode, result) pairs that can occur here."""
        return tuple((reg.mode, result)
                     for reg in remedies.registrations(remedies.PRE_RESTART)
                     if not reg.unavailable(self.config) for result in RESTART_RESULTS)

    async def resolve_first(self) -> None:
        """The first usable ``pre-restart`` remedy (registry order), or none."""
        first, why = None, []
        for reg in remedies.registrations(remedies.PRE_RESTART):
            if reg.unavailable(self.config):
                continue
            remedy = self._make_first(reg.mode)
            if remedy is None:
                continue
            availability = await modes.probe(remedy)
            why.append(f"{reg.mode}: {availability.why}")
            if availability.usable:
                first = remedy
                break
        text = "; ".join(why)
        if (first, text) != (self.first, self.first_why) and why:
            log.info("remediation: first rung %s (%s)",
                     first.mode if first is not None else "none", text)
        self.first, self.first_why = first, text

    # --- the loop --------------------------------------------------------------------------

    async def serve(self) -> None:
        await self.resolve()
        last_snap: Snapshot | None = None
        last_eval = -math.inf
        last_probe = self.clock()
        try:
            while True:
                now = self.clock()
                snap = self.ctx.snapshot()
                if snap is not last_snap or now - last_eval >= EVALUATE_EVERY:
                    last_snap, last_eval = snap, now
                    await self.evaluate(snap)
                if now - last_probe >= REPROBE_EVERY and self.reprobe_wanted():
                    last_probe = now
                    await self.resolve()
                elif now - last_probe >= REPROBE_EVERY and self.first_wanted():
                    last_probe = now  # the device may appear after the agent (Flannel)
                    await self.resolve_first()
                await self.ctx.changed(snap.version, self.tick)
        finally:
            self.reporter.cancel()
            if self._kube is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._kube.close(), 1.0)

    def reprobe_wanted(self) -> bool:
        """*ladder hook*: probe the remedies again (every :data:`REPROBE_EVERY`)."""
        return self.settings.mode == modes.AUTO and self.remedy is None

    def fleet_hold(self) -> str:
        """The fleet hold that holds now, as people read it ("": none); a refused message
        is alerted once (``fleet.hold_refused``) and otherwise ignored."""
        link = self.ctx.alert_link
        if not self.OBEYS_FLEET_HOLD or not self.config.fleet.hold or link is None:
            return ""
        heard = link.fleet_hold
        if heard is None:
            return ""
        if heard.refused:
            if heard is not self._refused_seen:
                self._refused_seen = heard
                self._emit("fleet.hold_refused", f"fleet hold refused: {heard.refused}",
                           {"why": heard.refused})
            return ""
        if not heard.holds(self.wall()) or heard.until is None:
            return ""
        by = f" by {heard.by}" if heard.by else ""
        return f"{heard.reason}{by}, until {rfc3339(heard.until)}"

    def first_wanted(self) -> bool:
        """A first rung can exist in this configuration but was not usable yet."""
        return self.first is None and bool(self.counted_rungs())

    def tunnel_view(self, snap: Snapshot) -> policy.TunnelView:
        view = policy.view_of(snap, self.config,
                              mode=self.mode if self.remedy is not None else policy.NO_REMEDY,
                              booted_mono=self.clock() - self.boot_clock(),
                              direct_was_down=self.history.direct_was_down,
                              fleet_hold=self.fleet_hold(),
                              first_rung=self.first.mode if self.first is not None else "")
        seen = policy.episode_over(view, self.history.saw(view))
        if seen is not self.history:
            self.store(seen)
        return view

    async def evaluate(self, snap: Snapshot) -> list[Action]:
        """One decision round (public for tests): decide, then carry it out."""
        actions = self.decide(snap)
        await self._store.written()  # what the decision read (the settle flag) is on disk
        if not actions or actions[0].kind in ("close_circuit", "restart"):
            self.announced.clear()  # a new failure episode announces its skips again
        for action in actions:
            self.last = action
            await self._apply(action)
        return actions

    def decide(self, snap: Snapshot) -> list[Action]:
        """*ladder hook*: the pure decision on this snapshot."""
        view = self.tunnel_view(snap)
        self.reporter.follow(view)
        for name in view.awaiting:  # the evidence a tunnel-path failure waits for, soon
            self.ctx.hasten(name)
        return policy.decide(view, self.history, self.clock(), self.settings,
                             rand=self.rng.random)

    def remedy_for(self, action: Action) -> tuple[Remedy | None, str]:
        """*ladder hook*: the remedy an action uses, and its mode name."""
        if action.rung:
            first = self.first if self.first is not None and (
                self.first.mode == action.rung) else None
            return first, action.rung
        return self.remedy, self.mode

    async def before(self, action: Action, detail: dict[str, Any],
                     correlation: str) -> str:
        """*ladder hook*: the last word before a remedy runs: "" to go ahead, or why not
        (then nothing is recorded or done; the reason is a skip). It may add to
        ``detail``, which the attempt's alerts carry (the control ladder says there what
        became of the load balancer's state file)."""
        return ""

    async def _apply(self, action: Action) -> None:
        if action.kind == "restart" and (acting := self.yield_to()):
            action = Action("skip", "other_ladder", (
                f"{action.message}: not done: the {', '.join(acting)} ladder is acting"))
        if action.kind == "restart":
            await attempt.restart(self, action)
        elif action.kind == "skip":
            if ("skip", action.reason) in self.announced:
                return
            self.announced.add(("skip", action.reason))
            log.warning("remediation skipped (%s): %s", action.reason, action.message)
            self.restarts.labels(action="skip", result=action.reason).inc()
            self._emit(f"{self.KIND}.skipped", action.message,
                       {"reason": action.reason, "mode": self.mode})
            self.reporter.event(self.NODE_EVENTS["skipped"], action.message, warning=False)
        elif action.kind == "watch":
            if action.until is not None and action.until != self.history.jitter_until:
                await self.persist(self.history.waiting_until(action.until))
            if ("watch", action.reason) not in self.announced:
                self.announced.add(("watch", action.reason))
                log.warning("remediation: %s", action.message)
        elif action.kind == "open_circuit":
            await self.persist(self.history.opened())  # the open circuit outlives a crash
            self.restarts.labels(action="open_circuit", result="opened").inc()
            log.critical("remediation circuit open: %s", action.message)
            self._emit(f"{self.KIND}.circuit_open", action.message,
                       {"reason": action.reason, "mode": self.mode,
                        "failures_in_row": self.history.failures_in_row})
            self.reporter.event(self.NODE_EVENTS["circuit_open"], action.message,
                                warning=True)
        elif action.kind == "close_circuit":
            was_open = self.history.circuit_open
            await self.persist(self.history.closed())
            self.restarts.labels(action="close_circuit", result="closed").inc()
            log.info("remediation: %s", action.message)
            if was_open:
                self._emit(f"{self.KIND}.recovered",
                           f"{self.SUBJECT} is healthy again; remediation circuit closed",
                           {"mode": self.mode, "circuit": "closed"})

    # --- what a restart must cure (its steps: :mod:`~edgeheal.agent.remediation.attempt`) --

    def verified_by(self) -> tuple[str, ...]:
        """*ladder hook*: the checks whose fresh ``ok`` means the remedy cured."""
        return (policy.WIREGUARD, *targets(self.config, "tunnel"))

    def cured(self, snap: Snapshot, name: str, since: float) -> bool:
        """*ladder hook*: check ``name`` shows the cure: a fresh ``ok`` result after
        ``since`` (the effective state may still be debouncing)."""
        return attempt.fresh_ok(snap, name, since)

    def _emit(self, kind: str, message: str, detail: Mapping[str, Any],
              correlation: str = "") -> None:
        self.ctx.emit(Event(kind, message, dict(detail), correlation))

