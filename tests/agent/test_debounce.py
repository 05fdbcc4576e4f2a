"""Debounce scenarios, as numbered rules in edgeheal.core.debounce. No real time passes:
``now`` is an injected monotonic value, ``wall`` an arbitrary (even stepping) wall clock."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from edgeheal.base.compat import UTC
from edgeheal.core import debounce
from edgeheal.model import CheckResult, CheckStatus, State

OK, DEG, UNK, FAIL = State.OK, State.DEGRADED, State.UNKNOWN, State.FAILED
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def feed(states: list[State], *, fail_after: int = 2, recover_after: int = 2,
         wall_step: float = 1.0) -> list[CheckStatus]:
    status = debounce.initial("c", required=True, now=0.0, wall=T0)
    history: tuple[CheckResult, ...] = ()
    out = []
    for i, state in enumerate(states, start=1):
        result = CheckResult(state, f"r_{state.value}", f"m{i}")
        status, history = debounce.advance(
            status, result, now=float(i), wall=T0 + timedelta(seconds=i * wall_step),
            fail_after=fail_after, recover_after=recover_after, history=history)
        out.append(status)
    return out


@pytest.mark.parametrize(("raw", "expected", "kw"), [
    # 1. the first result is effective at once
    ([FAIL], [FAIL], {}),
    # 2. one bad result among good ones never flips the state
    ([OK, FAIL, OK, OK], [OK, OK, OK, OK], {}),
    # 2. two consecutive bad results do (fail_after=2)
    ([OK, FAIL, FAIL], [OK, OK, FAIL], {}),
    # 2. "at least that bad": failed then degraded settles on degraded
    ([OK, FAIL, DEG], [OK, OK, DEG], {}),
    # 2. ... and escalates to failed once failed holds for fail_after runs
    ([OK, FAIL, DEG, FAIL, FAIL], [OK, OK, DEG, DEG, FAIL], {}),
    # 3. recovery needs recover_after good results
    ([FAIL, OK, FAIL, OK, OK], [FAIL, FAIL, FAIL, FAIL, OK], {}),
    # 3. partial recovery: failed -> degraded, degraded -> ok
    ([FAIL, DEG, DEG, OK, OK], [FAIL, FAIL, DEG, DEG, OK], {}),
    # unknown ranks between degraded and failed: it is a worsening from ok
    ([OK, UNK, UNK], [OK, OK, UNK], {}),
    # fail_after=1 / recover_after=1: no debounce at all
    ([OK, FAIL, OK], [OK, FAIL, OK], {"fail_after": 1, "recover_after": 1}),
    # a larger window
    ([OK, FAIL, FAIL, OK, FAIL, FAIL, FAIL], [OK, OK, OK, OK, OK, OK, FAIL],
     {"fail_after": 3}),
])
def test_debounce_follows_the_rules(raw: list[State], expected: list[State],
                                    kw: dict[str, int]) -> None:
    assert [s.state for s in feed(raw, **kw)] == expected


def test_a_change_of_reason_within_the_same_state_updates_at_once_and_keeps_since() -> None:
    status = debounce.initial("c", required=False, now=0.0, wall=T0)
    status, hist = debounce.advance(status, CheckResult(FAIL, "stalled", "a"), now=1.0,
                                    wall=T0, fail_after=2, recover_after=2)
    since = status.since
    status, hist = debounce.advance(status, CheckResult(FAIL, "dead", "b"), now=9.0,
                                    wall=T0 + timedelta(seconds=9), fail_after=2,
                                    recover_after=2, history=hist)
    assert (status.state, status.reason, status.message) == (FAIL, "dead", "b")
    assert status.since == since
    assert status.since_mono == 1.0


def test_pending_change_is_visible_as_observed() -> None:
    statuses = feed([OK, FAIL])
    doc = statuses[-1].to_json()
    assert doc["state"] == "ok"
    assert doc["observed"] == {"state": "failed", "reason": "r_failed", "streak": 1}


def test_a_wall_clock_step_changes_nothing_but_the_rendered_since() -> None:
    # wall time jumps back a year between runs (NTP sync on a box without RTC)
    normal = feed([OK, FAIL, FAIL, OK, OK])
    stepped = feed([OK, FAIL, FAIL, OK, OK], wall_step=-365 * 86400.0)
    assert [s.state for s in normal] == [s.state for s in stepped]
    assert [s.since_mono for s in normal] == [s.since_mono for s in stepped]


def test_since_marks_the_start_of_the_effective_state() -> None:
    statuses = feed([OK, FAIL, FAIL, FAIL])
    assert statuses[2].since_mono == 3.0
    assert statuses[3].since_mono == 3.0
    assert statuses[0].since_mono == 1.0
