"""Debounce, in one place: raw check results -> the effective status everyone acts on.

A pure function of (previous status, new result, now); the supervisor calls it after every
run. Rules (scenarios as numbered comments in ``tests/agent/test_debounce.py``):

1. The first result of a check becomes effective at once: there is nothing to debounce
   against, and before it the check is simply "not completed" (the node is not ready).
2. A *worsening* (a result ranked worse than the effective state, see ``State.rank``)
   becomes effective only after ``fail_after`` consecutive results worse than the effective
   state; the new state is the *least* bad among those last ``fail_after`` results ("at least
   that bad"), so ok, failed, degraded with ``fail_after=2`` settles on degraded.
3. An *improvement* clears only after ``recover_after`` consecutive results better than the
   effective state; the new state is the *worst* among them.
4. A result in the same state as the effective one resets the streak. If its reason
   differs (``stalled`` -> ``dead``, both failed), the reason, message and detail are
   updated at once and ``since`` is kept: ``since`` is when the *state* began; reasons are
   explanations of a state, and alerts and remediation key on the state.
5. ``detail`` always shows the latest observation; ``observed`` carries the raw result so
   /status shows a change that is waiting for its debounce.

Time is the monotonic ``now`` passed in; the wall-clock ``wall`` only renders ``since``.
A wall-clock step therefore cannot fire or clear anything.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from edgeheal.model import CheckResult, CheckStatus, State


def initial(name: str, *, required: bool, now: float, wall: datetime) -> CheckStatus:
    """The status of a check that has not completed a run yet."""
    return CheckStatus(name=name, state=State.UNKNOWN, reason="pending",
                       message="no result yet", since=wall, since_mono=now, detail={},
                       required=required)


def advance(status: CheckStatus, result: CheckResult, *, now: float, wall: datetime,
            fail_after: int, recover_after: int, history: tuple[CheckResult, ...] = (),
            ) -> tuple[CheckStatus, tuple[CheckResult, ...]]:
    """Fold one raw result into the status. ``history`` is the recent raw results (newest
    last) that the caller keeps and passes back; returns the new status and history."""
    keep = max(fail_after, recover_after)
    history = (*history, result)[-keep:]
    base = dataclasses.replace(status, runs=status.runs + 1, observed=result,
                               detail=result.detail, last_run_mono=now)

    if not status.completed:  # rule 1
        return _become(base, result, now, wall, first=True), history

    current = status.state
    if result.state is current:  # rule 4
        return dataclasses.replace(base, reason=result.reason, message=result.message,
                                   streak=0), history

    worse = result.state.rank > current.rank
    needed = fail_after if worse else recover_after
    tail = history[-needed:]
    agree = len(tail) == needed and all(
        (r.state.rank > current.rank) if worse else (r.state.rank < current.rank)
        for r in tail)
    if not agree:
        streak = _streak(history, current, worse)
        return dataclasses.replace(base, streak=streak), history
    # rules 2 and 3: the mildest (worsening) or worst (improvement) of the agreeing tail;
    # among equals the newest, whose reason and message then explain the state.
    pick = min if worse else max
    target = pick(reversed(tail), key=lambda r: r.state.rank)
    return _become(base, target, now, wall), history


def _streak(history: tuple[CheckResult, ...], current: State, worse: bool) -> int:
    n = 0
    for r in reversed(history):
        if (r.state.rank > current.rank) if worse else (r.state.rank < current.rank):
            n += 1
        else:
            break
    return n


def _become(base: CheckStatus, result: CheckResult, now: float, wall: datetime, *,
            first: bool = False) -> CheckStatus:
    changed = first or result.state is not base.state
    return dataclasses.replace(
        base, state=result.state, reason=result.reason, message=result.message, streak=0,
        since=wall if changed else base.since,
        since_mono=now if changed else base.since_mono)
