"""The remediation actor: runs the pure policy and carries out what it decides.

Why an actor apart from the policy: deciding must be pure and testable
(:mod:`edgeheal.core.flannel_ladder`), while doing — restarting Flannel through the chosen remedy,
waiting for the replacement, verifying the tunnel, persisting the history, telling people —
is I/O. The actor reads only the published snapshot (never a check directly) and
re-evaluates on every snapshot change and at least every second.

A restart: run the remedy (which returns once the replacement pod is Ready or the unit
active again, or raises :class:`~edgeheal.remedies.RemedyError`), bounded by the remedy's
own limit plus :data:`RESTART_MARGIN`, then verify recovery within ``verify_timeout`` from
the snapshot: a WireGuard result ``ok`` (fresh handshake, rx growing: the check's own
definition) and an ``ok`` result of every tunnel-path MQTT target, each *observed after*
the restart completed. The attempt is persisted *before* the remedy runs (an agent killed
mid-restart still counts it) and again with its result (``recovered``, ``not_recovered``,
``failed``, ``config_problem`` or ``dry_run``), counted in
``edgeheal_remediations_total{ladder,action,result}`` and timed in
``edgeheal_remediation_duration_seconds{ladder}`` (:mod:`edgeheal.agent.remediation.metrics`,
which also exports the circuit, pause, streak and budget as gauges).

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
(:class:`edgeheal.agent.remediation.uplink_actor.UplinkRemediator`) is this class with its own
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
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from edgeheal import remedies
from edgeheal.agent.remediation import modes, operator
from edgeheal.agent.remediation.history import HISTORY_FILE, Store, Timeline, boot_id, boottime
from edgeheal.agent.remediation.metrics import KNOWN, RESTART_RESULTS, LadderMetrics
from edgeheal.agent.remediation.reporting import NodeReporter
from edgeheal.base import compat
from edgeheal.core import flannel_ladder as policy
from edgeheal.core.flannel_ladder import Action, History, Record
from edgeheal.core.path_verdict import targets
from edgeheal.model import Context, Event, Snapshot, State, rfc3339
from edgeheal.remedies import Remedy, RemedyError

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
VERIFY_HASTEN_EVERY = 5.0
"""While verifying a restart, ask for the checks that lack a fresh ``ok`` this often (the
agent bounds hastened runs on its own as well)."""
RESTART_MARGIN = 120.0
"""Added to a remedy's own limit (its ready/job timeout) for the calls around it; a remedy
stuck past both is abandoned and the attempt counts as failed."""


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
        return policy.decide(view, self.history, self.clock(), self.settings,
                             rand=self.rng.random)

    def remedy_for(self, action: Action) -> tuple[Remedy | None, str]:
        """*ladder hook*: the remedy an action uses, and its mode name."""
        if action.rung:
            first = self.first if self.first is not None and (
                self.first.mode == action.rung) else None
            return first, action.rung
        return self.remedy, self.mode

    async def before(self, action: Action, detail: Mapping[str, Any],
                     correlation: str) -> str:
        """*ladder hook*: the last word before a remedy runs: "" to go ahead, or why not
        (then nothing is recorded or done; the reason is a skip)."""
        return ""

    async def _apply(self, action: Action) -> None:
        if action.kind == "restart":
            await self._restart(action)
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

    # --- a restart -------------------------------------------------------------------------

    async def _restart(self, action: Action) -> None:
        began, wall = self.clock(), self.wall()
        correlation = uuid.uuid4().hex[:12]
        remedy, mode = self.remedy_for(action)
        counted, done = self._wording(action, mode)
        detail: dict[str, Any] = {"mode": mode, "reason": action.reason}
        if action.dry_run or remedy is None:
            log.warning("remediation DRY RUN: would restart %s (%s): %s", self.WHAT, mode,
                        action.message)
            self.restarts.labels(action=counted, result="dry_run").inc()
            self.store(self.history.with_record(Record(
                mono=began, wall=rfc3339(wall), mode=mode, reason=action.reason,
                result="dry_run", duration=0.0)))
            self._emit(f"{self.KIND}.skipped", f"dry run: {action.message}",
                       {**detail, "dry_run": True}, correlation)
            return
        refused = await self.before(action, detail, correlation)
        if refused:
            await self._apply(Action("skip", refused, f"{action.message}: not done: "
                                     f"{refused}"))
            return
        self.busy = action.reason
        log.warning("remediation: restarting %s (%s): %s", self.WHAT, mode, action.message)
        # persisted before acting: an agent killed mid-restart still counts this attempt
        await self.persist(self.history.with_record(Record(
            mono=began, wall=rfc3339(wall), mode=mode, reason=action.reason,
            result="in_progress", duration=0.0)))
        target, result = "", "failed"
        try:
            try:
                async with compat.timeout(self.restart_bound(mode)):
                    outcome = await remedy.restart()
            except RemedyError as err:
                result = "config_problem" if err.config_problem else "failed"
                self._emit(f"{self.KIND}.failed", f"restart failed: {err}",
                           {**detail, "result": result}, correlation)
                log.error("remediation: restart failed (%s): %s", result, err)
                return
            except Exception as err:  # the bound struck, or a remedy's bug: never a crash loop
                self._emit(f"{self.KIND}.failed", self._unfinished(err, mode),
                           {**detail, "result": "failed"}, correlation)
                return
            target = outcome.target
            self._emit(f"{self.KIND}.restarted", f"{done} {target}: {action.message}",
                       {**detail, "target": target}, correlation)
            self.reporter.event(self.NODE_EVENTS["acted"],
                                f"edgeheal {done} {target} ({action.reason})", warning=True)
            ready = self.clock()
            recovered = await self._verify(ready, self.verify_timeout(mode))
            result = "recovered" if recovered else "not_recovered"
            if recovered:
                self._emit(f"{self.KIND}.recovered",
                           f"{self.SUBJECT} recovered {self.clock() - ready:.1f}s after "
                           f"{target} was back", {**detail, "target": target}, correlation)
                self.reporter.event(self.NODE_EVENTS["recovered"],
                                    f"{self.SUBJECT} recovered after the restart",
                                    warning=False)
            else:
                self._emit(f"{self.KIND}.failed",
                           f"{done} {target}, but {self.SUBJECT} did not recover within "
                           f"{self.verify_timeout(mode):g}s",
                           {**detail, "target": target, "result": result}, correlation)
        except asyncio.CancelledError:
            # the agent is stopping, during the restart or while verifying it: neither
            # cured nor failed
            result = "interrupted"
            raise
        finally:
            duration = self.clock() - began
            self.busy = None
            self.duration.observe(duration)
            self.restarts.labels(action=counted, result=result).inc()
            await self.persist(self.history.finished(Record(
                mono=began, wall=rfc3339(wall), mode=mode, reason=action.reason,
                result=result, duration=duration, target=target)))
            log.info("remediation: restart %s after %.1fs (%s)", result, duration,
                     target or "no target")

    def _wording(self, action: Action, mode: str) -> tuple[str, str]:
        """The counter's ``action`` label and the verb of the messages: ``restart`` and
        "restarted", or the first rung's mode and "<mode>:"."""
        if action.rung and self.LADDER == remedies.FLANNEL:
            return action.rung, f"{mode}:"
        return "restart", "restarted"

    def _unfinished(self, err: Exception, mode: str) -> str:
        """What a restart that ended with ``err`` (not a RemedyError) says in its alert."""
        if isinstance(err, compat.TimeoutErrors):
            return f"restart did not finish within {self.restart_bound(mode):g}s"
        log.error("remediation: the %s remedy failed unexpectedly", mode, exc_info=err)
        return (f"restart failed: unexpected {type(err).__name__} in the {mode} remedy (a "
                "bug; see the log)")

    def restart_bound(self, mode: str | None = None) -> float:
        """An outer bound on one restart (a stuck remedy must not hang the actor): the
        remedy's own limit from its registration, plus :data:`RESTART_MARGIN`."""
        reg = remedies.by_mode(mode or self.mode, None)
        regs = [reg] if reg is not None else remedies.registrations(self.LADDER)
        return max((r.restart_bound(self.config) for r in regs), default=0.0) + RESTART_MARGIN

    def verify_timeout(self, mode: str) -> float:
        """How long to wait for the cure after ``mode``'s remedy: its own bound, else the
        ladder's ``verify_timeout``."""
        reg = remedies.by_mode(mode, None)
        if reg is not None and reg.verify_bound is not None:
            return reg.verify_bound(self.config)
        return float(self.settings.verify_timeout)

    def verified_by(self) -> tuple[str, ...]:
        """*ladder hook*: the checks whose fresh ``ok`` means the remedy cured."""
        return (policy.WIREGUARD, *targets(self.config, "tunnel"))

    async def _verify(self, since: float, within: float) -> bool:
        """Fresh ok results for every :meth:`verified_by` check, after ``since``."""
        deadline = since + within
        wanted = self.verified_by()
        asked = -math.inf
        while self.clock() < deadline:
            snap = self.ctx.snapshot()
            names = [n for n in wanted if n in snap.checks]
            if names and all(_fresh_ok(snap, n, since) for n in names):
                return True
            if self.clock() - asked >= VERIFY_HASTEN_EVERY:
                # without this a healthy-looking tunnel-path probe waits its full interval
                # (60 s by default) before it runs after the restart: verification would
                # take as long as verify_timeout allows, found by the lab's --field run
                asked = self.clock()
                for name in names:
                    if not _fresh_ok(snap, name, since):
                        self.ctx.hasten(name)
            await self.ctx.changed(snap.version, self.tick)
        return False

    def _emit(self, kind: str, message: str, detail: Mapping[str, Any],
              correlation: str = "") -> None:
        self.ctx.emit(Event(kind, message, dict(detail), correlation))


def _fresh_ok(snap: Snapshot, name: str, since: float) -> bool:
    status = snap.checks[name]
    return (status.observed is not None and status.observed.state is State.OK
            and status.last_run_mono is not None and status.last_run_mono > since)
