"""What operators do and see: the control-socket commands and the ``/status`` view.

Why these exist: an operator working on a node (or on the uplink) must be able to hold the
remediator without stopping the agent's monitoring, and release the circuit after fixing
what made restarts useless — ``remediation.pause`` (``{"for": "30m"}`` or indefinite),
``remediation.resume`` and ``remediation.reset`` on the root-only control socket
(``edgeheal remediation ...``). Each change goes through the actor's persisted history, so
a pause survives an agent restart. Every answer is the same view ``/status`` shows under
``remediation``: mode and why, circuit, streak, budget, pause, the last decision and the
recent attempts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from edgeheal import policy
from edgeheal.model import rfc3339

if TYPE_CHECKING:
    from edgeheal.remediation.actor import Remediator

log = logging.getLogger(__name__)

VIEW_ACTIONS = 20
"""Recent attempts shown in ``/status``, newest first."""


def register(actor: Remediator) -> None:
    """Register the commands on the actor's context (its control socket)."""
    async def pause(args: Mapping[str, Any]) -> Any:
        from edgeheal.config import format_duration, parse_duration  # noqa: PLC0415

        raw = args.get("for")
        seconds = None if raw in (None, "") else parse_duration(raw)
        actor.store(actor.history.paused_for(actor.clock(), seconds))
        how = "until resumed" if seconds is None else f"for {format_duration(seconds)}"
        log.warning("remediation paused %s by the operator", how)
        return view(actor)

    async def resume(args: Mapping[str, Any]) -> Any:
        actor.store(actor.history.resumed())
        log.warning("remediation resumed by the operator")
        return view(actor)

    async def reset(args: Mapping[str, Any]) -> Any:
        actor.store(actor.history.closed())
        actor.announced.clear()
        log.warning("remediation circuit reset by the operator")
        return view(actor)

    actor.ctx.control("remediation.pause", pause)
    actor.ctx.control("remediation.resume", resume)
    actor.ctx.control("remediation.reset", reset)


def view(actor: Remediator) -> dict[str, Any]:
    """The JSON-ready ``/status`` view (``extras["remediation"]``)."""
    now = actor.clock()
    history, settings = actor.history, actor.settings
    paused: str | None = None
    if history.paused(now):
        until = history.paused_until
        assert until is not None  # noqa: S101
        paused = ("indefinite" if until == math.inf
                  else rfc3339(actor.wall() + timedelta(seconds=until - now)))
    last = actor.last
    return {
        "mode": actor.mode,
        "why": actor.mode_why,
        "configured_mode": settings.mode,
        "dry_run": settings.dry_run,
        "circuit": "open" if history.circuit_open else "closed",
        "failures_in_row": history.failures_in_row,
        "budget_left": policy.budget_left(history, now, settings),
        "paused_until": paused,
        "busy": actor.busy,
        "last_decision": None if last is None else {
            "action": last.kind, "reason": last.reason, "message": last.message},
        "actions": [r.to_json() for r in reversed(history.records)][:VIEW_ACTIONS],
    }
