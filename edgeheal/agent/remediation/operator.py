"""What operators do and see: the control-socket commands and the ``/status`` view.

Why these exist: an operator working on a node (or on the uplink) must be able to hold the
remediator without stopping the agent's monitoring, and release the circuit after fixing
what made restarts useless — ``remediation.pause`` (``{"for": "30m"}`` or indefinite),
``remediation.resume`` and ``remediation.reset`` on the root-only control socket
(``edgeheal remediation ...``; the uplink ladder's are ``remediation.uplink.*``,
``edgeheal remediation ... --ladder uplink``, the control ladder's
``remediation.control.*``, ``--ladder control``). Each change goes through the actor's
persisted history, so a pause survives an agent restart. Every answer is the same view
``/status`` shows under ``remediation`` (``uplink_remediation``, ``control_remediation``):
mode and why, circuit, streak, budget, pause, the last decision and the recent attempts.

A pause is bounded (issue 17): ``{"for": ...}`` must be a duration from
:data:`PAUSE_MIN` to :data:`PAUSE_MAX` (30 days; longer means "until resumed", which is
what the argument-less pause is for), and anything else is refused before the history is
touched, so nothing is applied or persisted. A persisted pause outside the bound (written by
an older version, or by hand) is dropped at start with a warning instead of overflowing the
date arithmetic of this view on every ``/status``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from edgeheal.core import safeguards as ladder
from edgeheal.model import rfc3339

if TYPE_CHECKING:
    from edgeheal.agent.remediation.flannel_actor import Remediator

log = logging.getLogger("edgeheal.remediation.operator")  # the name operators grep for

VIEW_ACTIONS = 20
"""Recent attempts shown in ``/status``, newest first."""
PAUSE_MIN = 1.0
"""Shortest timed pause, seconds."""
PAUSE_MAX = 30 * 86400.0
"""Longest timed pause, seconds (30 days); for longer, pause until resumed."""


def pause_seconds(raw: object) -> float | None:
    """The length of a pause from ``{"for": raw}``: ``None`` (until resumed) for a missing or
    empty value, else a duration within [PAUSE_MIN, PAUSE_MAX]; raise :class:`ValueError`
    saying what is accepted. Shared by the CLI (exit 2) and the control handler."""
    from edgeheal.config import format_duration, parse_duration

    if raw is None or raw == "":
        return None
    seconds = parse_duration(raw)
    if not PAUSE_MIN <= seconds <= PAUSE_MAX:
        raise ValueError(f"a pause lasts {format_duration(PAUSE_MIN)} to "
                         f"{format_duration(PAUSE_MAX)}, got {format_duration(seconds)} "
                         "(without a duration it lasts until `edgeheal remediation resume`)")
    return seconds


def register(actor: Remediator) -> None:
    """Register the commands on the actor's context (its control socket)."""
    async def pause(args: Mapping[str, Any]) -> Any:
        from edgeheal.config import format_duration

        seconds = pause_seconds(args.get("for"))  # ValueError: refused, nothing stored
        await actor.persist(actor.history.paused_for(actor.clock(), seconds))
        how = "until resumed" if seconds is None else f"for {format_duration(seconds)}"
        log.warning("remediation paused %s by the operator", how)
        return view(actor)

    async def resume(args: Mapping[str, Any]) -> Any:
        await actor.persist(actor.history.resumed())
        log.warning("remediation resumed by the operator")
        return view(actor)

    async def reset(args: Mapping[str, Any]) -> Any:
        await actor.persist(actor.history.closed())
        actor.announced.clear()
        log.warning("remediation circuit reset by the operator")
        return view(actor)

    _drop_unbounded_pause(actor)
    actor.ctx.control(f"{actor.COMMANDS}.pause", pause)
    actor.ctx.control(f"{actor.COMMANDS}.resume", resume)
    actor.ctx.control(f"{actor.COMMANDS}.reset", reset)


def _drop_unbounded_pause(actor: Remediator) -> None:
    """A persisted timed pause longer than PAUSE_MAX from now (or not a number) is dropped
    with a warning: it can only come from an older version or a hand-edited file."""
    until = actor.history.paused_until
    if until is None or until == math.inf:
        return
    left = until - actor.clock()
    if math.isfinite(left) and left <= PAUSE_MAX:
        return
    log.warning("remediation: the persisted pause (%s s from now) is outside the %d-day "
                "limit; dropped, remediation is not paused", f"{left:.3g}",
                int(PAUSE_MAX // 86400))
    actor.store(actor.history.resumed())


def view(actor: Remediator) -> dict[str, Any]:
    """The JSON-ready ``/status`` view (``extras["remediation"]``)."""
    now = actor.clock()
    history, settings = actor.history, actor.settings
    paused: str | None = None
    if history.paused(now):
        until = history.paused_until
        assert until is not None  # noqa: S101
        # clamped: a bound was checked when the pause was set and at start; never let a
        # value that slipped through crash the view (OverflowError) on every /status
        paused = ("indefinite" if until == math.inf
                  else rfc3339(actor.wall() + timedelta(
                      seconds=min(max(until - now, 0.0), PAUSE_MAX))))
    last = actor.last
    return {
        "mode": actor.mode,
        "why": actor.mode_why,
        "configured_mode": actor.configured_mode,
        "dry_run": settings.dry_run,
        "circuit": "open" if history.circuit_open else "closed",
        "failures_in_row": history.failures_in_row,
        "budget_left": ladder.budget_left(history, now, ladder.Limits.of(settings)),
        "paused_until": paused,
        "busy": actor.busy,
        "last_decision": None if last is None else {
            "action": last.kind, "reason": last.reason, "message": last.message},
        "actions": [r.to_json() for r in reversed(history.records)][:VIEW_ACTIONS],
    }
