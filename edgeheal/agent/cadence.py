"""When a check runs next: frugal in health, quick in doubt. Pure, apart from the wake-up.

Why apart from the supervisor: the schedule is a decision (:func:`next_due`) with its own
table of scenarios (``tests/agent/test_cadence.py``), and the supervisor only carries it
out. A healthy check runs every ``interval``; after a result that is not ok, or while the
effective state is not ok, a check with a ``retry_interval`` runs again that long after its
last run ended, for :data:`QUICK_RETRY_FOR` at most.
"""

from __future__ import annotations

import asyncio
import dataclasses

from edgeheal.model import CheckResult, CheckStatus, State

__all__ = ["QUICK_RETRY_FOR", "Cadence", "in_doubt", "next_due"]

QUICK_RETRY_FOR = 300.0
"""Seconds a check in doubt is re-run at its ``retry_interval``; past it, at its
``interval`` (the field's outages last 30 s to 2 min; a target that stays down for hours
must not cost a probe every few seconds)."""


def in_doubt(result: CheckResult, status: CheckStatus) -> bool:
    """The raw result or the effective state (after debouncing) is not ok."""
    return result.state is not State.OK or status.state is not State.OK


def next_due(*, began: float, ended: float, interval: float, retry: float | None,
             doubt_since: float | None, quick_for: float = QUICK_RETRY_FOR) -> float:
    """When the next run starts (monotonic seconds), after a run from ``began`` to
    ``ended``: ``interval`` after it began; in doubt (``doubt_since`` set, less than
    ``quick_for`` ago) at most ``retry`` after it ended."""
    due = began + interval
    if retry is not None and doubt_since is not None and ended - doubt_since < quick_for:
        due = min(due, ended + retry)
    return due


@dataclasses.dataclass
class Cadence:
    """A check loop's scheduling state (the supervisor's, not the check's)."""

    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    doubt_since: float | None = None
