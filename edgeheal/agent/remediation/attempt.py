"""One attempt of a ladder: run the remedy within its bound, verify the cure, record it.

Why apart from the actor (:class:`~edgeheal.agent.remediation.flannel_actor.Remediator`):
the actor reads the snapshot, decides and carries out every decision; a ``restart`` is the
one decision that waits (minutes, on a remedy and then on the checks), and what it waits
for, how long, and what it records before and after is this module's. The actor's *ladder
hooks* (``remedy_for``, ``before``, ``verified_by``, ``cured``) say what it means for one
ladder; the steps are the same for every ladder. An attempt sees its actor through
:class:`Ladder`, what it reads and does there.

An attempt: run the remedy (which returns once the replacement pod is Ready or the unit
active again, or raises :class:`~edgeheal.remedies.RemedyError`), bounded by the remedy's
own limit plus :data:`RESTART_MARGIN` (:func:`restart_bound`), then verify recovery within
:func:`verify_timeout` from the snapshot: a fresh ``ok`` of every check the ladder is
verified by (the Flannel ladder: the WireGuard result, with fresh handshake and rx growing,
and every tunnel-path MQTT target), each *observed after* the restart completed. The
attempt is persisted *before* the remedy runs (an agent killed mid-restart still counts
it) and again with its result (``recovered``, ``not_recovered``, ``failed``,
``config_problem``, ``interrupted`` or ``dry_run``), counted in
``edgeheal_remediations_total{ladder,action,result}`` and timed in
``edgeheal_remediation_duration_seconds{ladder}``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from edgeheal import remedies
from edgeheal.base import compat
from edgeheal.core.flannel_ladder import Action, History, Record
from edgeheal.model import Context, Snapshot, State, rfc3339
from edgeheal.remedies import Remedy, RemedyError

if TYPE_CHECKING:
    from edgeheal.agent.remediation.reporting import NodeReporter
    from edgeheal.config import Config

log = logging.getLogger("edgeheal.remediation.actor")  # the name operators grep for

VERIFY_HASTEN_EVERY = 5.0
"""While verifying a restart, ask for the checks that lack a fresh ``ok`` this often (the
agent bounds hastened runs on its own as well)."""
RESTART_MARGIN = 120.0
"""Added to a remedy's own limit (its ready/job timeout) for the calls around it; a remedy
stuck past both is abandoned and the attempt counts as failed."""


class Ladder(Protocol):
    """What an attempt reads and does through its ladder's actor (the
    :class:`~edgeheal.agent.remediation.flannel_actor.Remediator` and its subclasses)."""

    LADDER: ClassVar[str]
    KIND: ClassVar[str]
    WHAT: ClassVar[str]
    SUBJECT: ClassVar[str]
    NODE_EVENTS: ClassVar[Mapping[str, str]]
    ctx: Context
    config: Config
    settings: Any
    clock: Callable[[], float]
    wall: Callable[[], datetime]
    tick: float
    history: History
    busy: str | None
    restarts: Any
    duration: Any
    reporter: NodeReporter

    def remedy_for(self, action: Action) -> tuple[Remedy | None, str]: ...
    async def before(self, action: Action, detail: dict[str, Any],
                     correlation: str) -> str: ...
    async def _apply(self, action: Action) -> None: ...
    def store(self, history: History) -> None: ...
    async def persist(self, history: History) -> None: ...
    def verified_by(self) -> tuple[str, ...]: ...
    def cured(self, snap: Snapshot, name: str, since: float) -> bool: ...
    def _emit(self, kind: str, message: str, detail: Mapping[str, Any],
              correlation: str = "") -> None: ...


async def restart(actor: Ladder, action: Action) -> None:
    """Carry out ``action`` (a ``restart``) for ``actor``'s ladder, from the record before
    to the record after."""
    began, wall = actor.clock(), actor.wall()
    correlation = uuid.uuid4().hex[:12]
    remedy, mode = actor.remedy_for(action)
    counted, done = _wording(actor, action, mode)
    detail: dict[str, Any] = {"mode": mode, "reason": action.reason}
    if action.dry_run or remedy is None:
        _dry_run(actor, action, mode=mode, counted=counted, record=Record(
            mono=began, wall=rfc3339(wall), mode=mode, reason=action.reason,
            result="dry_run", duration=0.0), detail={**detail, "dry_run": True},
            correlation=correlation)
        return
    refused = await actor.before(action, detail, correlation)
    if refused:
        await actor._apply(Action("skip", refused, f"{action.message}: not done: "
                                  f"{refused}"))
        return
    actor.busy = action.reason
    log.warning("remediation: restarting %s (%s): %s", actor.WHAT, mode, action.message)
    # persisted before acting: an agent killed mid-restart still counts this attempt
    await actor.persist(actor.history.with_record(Record(
        mono=began, wall=rfc3339(wall), mode=mode, reason=action.reason,
        result="in_progress", duration=0.0)))
    target, result = "", "failed"
    try:
        try:
            async with compat.timeout(restart_bound(actor.config, actor.LADDER, mode)):
                outcome = await remedy.restart()
        except RemedyError as err:
            result = "config_problem" if err.config_problem else "failed"
            actor._emit(f"{actor.KIND}.failed", f"restart failed: {err}",
                        {**detail, "result": result}, correlation)
            log.error("remediation: restart failed (%s): %s", result, err)
            return
        except Exception as err:  # the bound struck, or a remedy's bug: never a crash loop
            actor._emit(f"{actor.KIND}.failed", _unfinished(actor, err, mode),
                        {**detail, "result": "failed"}, correlation)
            return
        target = outcome.target
        actor._emit(f"{actor.KIND}.restarted", f"{done} {target}: {action.message}",
                    {**detail, "target": target}, correlation)
        actor.reporter.event(actor.NODE_EVENTS["acted"],
                             f"edgeheal {done} {target} ({action.reason})", warning=True)
        ready = actor.clock()
        recovered = await verify(actor, ready, verify_timeout(actor.config, actor.settings,
                                                               mode))
        result = "recovered" if recovered else "not_recovered"
        if recovered:
            actor._emit(f"{actor.KIND}.recovered",
                        f"{actor.SUBJECT} recovered {actor.clock() - ready:.1f}s after "
                        f"{target} was back", {**detail, "target": target}, correlation)
            actor.reporter.event(actor.NODE_EVENTS["recovered"],
                                 f"{actor.SUBJECT} recovered after the restart",
                                 warning=False)
        else:
            actor._emit(f"{actor.KIND}.failed",
                        f"{done} {target}, but {actor.SUBJECT} did not recover within "
                        f"{verify_timeout(actor.config, actor.settings, mode):g}s",
                        {**detail, "target": target, "result": result}, correlation)
    except asyncio.CancelledError:
        # the agent is stopping, during the restart or while verifying it: neither
        # cured nor failed
        result = "interrupted"
        raise
    finally:
        duration = actor.clock() - began
        actor.busy = None
        actor.duration.observe(duration)
        actor.restarts.labels(action=counted, result=result).inc()
        await actor.persist(actor.history.finished(Record(
            mono=began, wall=rfc3339(wall), mode=mode, reason=action.reason,
            result=result, duration=duration, target=target)))
        log.info("remediation: restart %s after %.1fs (%s)", result, duration,
                 target or "no target")


def _dry_run(actor: Ladder, action: Action, *, mode: str, counted: str, record: Record,
             detail: dict[str, Any], correlation: str) -> None:
    """A dry run (or no remedy): said, counted and recorded; nothing is done."""
    log.warning("remediation DRY RUN: would restart %s (%s): %s", actor.WHAT, mode,
                action.message)
    actor.restarts.labels(action=counted, result="dry_run").inc()
    actor.store(actor.history.with_record(record))
    actor._emit(f"{actor.KIND}.skipped", f"dry run: {action.message}", detail, correlation)


def _wording(actor: Ladder, action: Action, mode: str) -> tuple[str, str]:
    """The counter's ``action`` label and the verb of the messages: ``restart`` and
    "restarted", or the first rung's mode and "<mode>:"."""
    if action.rung and actor.LADDER == remedies.FLANNEL:
        return action.rung, f"{mode}:"
    return "restart", "restarted"


def _unfinished(actor: Ladder, err: Exception, mode: str) -> str:
    """What a restart that ended with ``err`` (not a RemedyError) says in its alert."""
    if isinstance(err, compat.TimeoutErrors):
        return (f"restart did not finish within "
                f"{restart_bound(actor.config, actor.LADDER, mode):g}s")
    log.error("remediation: the %s remedy failed unexpectedly", mode, exc_info=err)
    return (f"restart failed: unexpected {type(err).__name__} in the {mode} remedy (a "
            "bug; see the log)")


def restart_bound(config: Config, ladder: str, mode: str) -> float:
    """An outer bound on one restart (a stuck remedy must not hang the actor): the
    remedy's own limit from its registration (unknown ``mode``: the longest of
    ``ladder``'s), plus :data:`RESTART_MARGIN`."""
    reg = remedies.by_mode(mode, None)
    regs = [reg] if reg is not None else remedies.registrations(ladder)
    return max((r.restart_bound(config) for r in regs), default=0.0) + RESTART_MARGIN


def verify_timeout(config: Config, settings: Any, mode: str) -> float:
    """How long to wait for the cure after ``mode``'s remedy: its own bound, else the
    ladder's ``verify_timeout`` (``settings``: the ladder's)."""
    reg = remedies.by_mode(mode, None)
    if reg is not None and reg.verify_bound is not None:
        return reg.verify_bound(config)
    return float(settings.verify_timeout)


async def verify(actor: Ladder, since: float, within: float) -> bool:
    """Fresh ok results for every check ``actor`` is verified by, after ``since``."""
    deadline = since + within
    wanted = actor.verified_by()
    asked = -math.inf
    while actor.clock() < deadline:
        snap = actor.ctx.snapshot()
        names = [n for n in wanted if n in snap.checks]
        if names and all(actor.cured(snap, n, since) for n in names):
            return True
        if actor.clock() - asked >= VERIFY_HASTEN_EVERY:
            # without this a healthy-looking tunnel-path probe waits its full interval
            # (60 s by default) before it runs after the restart: verification would
            # take as long as verify_timeout allows, found by the lab's --field run
            asked = actor.clock()
            for name in names:
                if not fresh_ok(snap, name, since):
                    actor.ctx.hasten(name)
        await actor.ctx.changed(snap.version, actor.tick)
    return False


def fresh_ok(snap: Snapshot, name: str, since: float) -> bool:
    """Check ``name``'s last run, after ``since``, observed ``ok``."""
    status = snap.checks[name]
    return (status.observed is not None and status.observed.state is State.OK
            and status.last_run_mono is not None and status.last_run_mono > since)
