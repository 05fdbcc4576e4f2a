"""When checks run: frugal in health, quick in doubt, and at once when another check asks.

Scenarios for :func:`edgeheal.agent.cadence.next_due` (times are an injected monotonic clock):

1. Healthy: the next run starts ``interval`` after the last one began, nothing sooner.
2. In doubt (a result or the effective state not ok): ``retry_interval`` after the last
   run ended, never later than the interval would have it.
3. A check without ``retry_interval`` keeps its interval in doubt too.
4. After ``QUICK_RETRY_FOR`` of doubt the interval is back (a long outage must not cost a
   probe every few seconds).

The supervisor tests run a real agent with scripted checks and assert what must happen
(run counts, states) within bounds with slack.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from edgeheal.agent.cadence import QUICK_RETRY_FOR, in_doubt, next_due
from edgeheal.config import CheckSettings
from edgeheal.model import CheckResult, State
from tests.agent.fakes import ScriptedCheck, failed, ok
from tests.agent.support import running_agent
from tests.support import Clock, until


@pytest.mark.parametrize(("began", "ended", "interval", "retry", "doubt_since", "due"), [
    (100.0, 100.5, 60.0, 2.0, None, 160.0),      # 1 healthy: interval from the start
    (100.0, 105.0, 60.0, 2.0, 100.0, 107.0),     # 2 first failure (a 5 s timeout): +2 s
    (100.0, 100.1, 60.0, 2.0, 40.0, 102.1),      # 2 still failing a minute later
    (100.0, 100.1, 1.0, 2.0, 100.0, 101.0),      # 2 never later than the interval
    (100.0, 105.0, 60.0, None, 100.0, 160.0),    # 3 no retry_interval: the interval
    (400.0, 405.0, 60.0, 2.0, 400.0 - QUICK_RETRY_FOR, 460.0),  # 4 quick window over
    (400.0, 405.0, 60.0, 2.0, 405.1 - QUICK_RETRY_FOR, 407.0),  # 4 just inside it
])
def test_the_next_run_is_due(*, began: float, ended: float, interval: float,
                             retry: float | None, doubt_since: float | None,
                             due: float) -> None:
    assert next_due(began=began, ended=ended, interval=interval, retry=retry,
                    doubt_since=doubt_since) == pytest.approx(due)


def test_a_fault_is_confirmed_in_seconds_and_a_recovery_seen_in_seconds() -> None:
    """Walk a probe target through a blackhole with an injected clock: 60 s interval, 5 s
    timeout, retry 2 s, fail_after 2. Healthy runs are 60 s apart; from the first failing
    probe to the second one takes timeout + retry, not another interval."""
    from edgeheal.core import debounce

    clock = Clock(now=0.0, start=0.0)
    status = debounce.initial("t", required=True, now=clock.now, wall=clock.wall())
    history: tuple[CheckResult, ...] = ()
    doubt_since: float | None = None
    broken = (130.0, 200.0)  # the path is dead from 130 s to 200 s
    starts, became = [], {}
    for _ in range(200):  # bounded
        began = clock.now
        if began > 300:
            break
        starts.append(began)
        dead = broken[0] <= began < broken[1]
        clock.advance(5.0 if dead else 0.01)  # a dead path costs the whole timeout
        result = CheckResult(State.FAILED if dead else State.OK, "timeout" if dead else "ok")
        status, history = debounce.advance(status, result, now=clock.now, wall=clock.wall(),
                                           fail_after=2, recover_after=2, history=history)
        became.setdefault(status.state, clock.now)
        if status.state is State.OK and State.FAILED in became:
            became.setdefault("recovered", clock.now)  # type: ignore[call-overload]
        doubt_since = (None if not in_doubt(result, status)
                       else began if doubt_since is None else doubt_since)
        clock.now = max(clock.now, next_due(began=began, ended=clock.now, interval=60.0,
                                            retry=2.0, doubt_since=doubt_since))
    assert starts[:3] == [0.0, 60.0, 120.0]  # healthy: one probe a minute
    # the first probe inside the outage starts at 180 s (the 60 s cadence); the second
    # one 5 s + 2 s later: failed at 192 s, 62 s after the cut with no help from a
    # suspicion (the WireGuard check's hasten makes the first probe come much sooner)
    assert became[State.FAILED] == pytest.approx(180 + 5 + 2 + 5)
    # probes keep coming every 7 s while it is down, so the repair at 200 s is seen at
    # the first probe after it and confirmed 2 s later
    recovered = became["recovered"]  # type: ignore[index]
    assert 200 < recovered <= 200 + 7 + 2 + 0.1
    after = [s for s in starts if s > recovered]
    assert after
    assert after[0] >= recovered + 60 - 5  # healthy again: back to the minute


def test_in_doubt_means_the_result_or_the_effective_state_is_not_ok() -> None:
    from edgeheal.core import debounce

    clock = Clock()
    status = debounce.initial("t", required=False, now=clock.now, wall=clock.wall())
    status, _ = debounce.advance(status, ok(), now=clock.now, wall=clock.wall(),
                                 fail_after=2, recover_after=2)
    assert not in_doubt(ok(), status)
    assert in_doubt(failed(), status)  # raw failure, effective state still ok
    status, _ = debounce.advance(status, failed(), now=clock.now, wall=clock.wall(),
                                 fail_after=1, recover_after=2)
    assert in_doubt(ok(), status)  # raw ok, effective state still failed


async def test_a_healthy_check_runs_at_its_interval_and_nothing_more(tmp_path: Path) -> None:
    check = ScriptedCheck("c", CheckSettings(interval=30.0, retry_interval=0.1), [ok()])
    async with running_agent(tmp_path, [check]) as agent:
        await until(lambda: check.runs >= 1)
        await until(lambda: agent.agent.snapshot.round_complete, what="first round")
        await asyncio.sleep(1.0)  # a healthy steady state: no extra run
        assert check.runs == 1


async def test_hasten_runs_a_check_now_bounded_by_the_spacing(tmp_path: Path) -> None:
    check = ScriptedCheck("c", CheckSettings(interval=30.0), [ok()])
    other = ScriptedCheck("other", CheckSettings(interval=30.0), [ok()])
    async with running_agent(tmp_path, [check, other], hasten_spacing=0.3) as agent:
        await until(lambda: check.runs == 1 and other.runs == 1)
        ctx = agent.agent.ctx
        ctx.hasten("no-such-check")  # ignored, never raises
        ctx.hasten("c")
        await until(lambda: check.runs == 2, within=3.0)
        assert other.runs == 1  # only the check asked for
        # a storm of requests for 1.5 s: at most one run per spacing after each run
        loop_end = time.monotonic() + 1.5
        while time.monotonic() < loop_end:
            ctx.hasten("c")
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)  # the last request may still be waiting for its spacing
        assert 3 <= check.runs <= 2 + 1.5 / 0.3 + 2
        runs = check.runs
        await asyncio.sleep(0.8)  # no request: no run
        assert check.runs == runs


async def test_a_failing_check_is_retried_quickly_to_failed_and_back(tmp_path: Path) -> None:
    broken = {"now": False}
    step = lambda: failed("timeout") if broken["now"] else ok()  # noqa: E731
    check = ScriptedCheck("t", CheckSettings(interval=30.0, retry_interval=0.1,
                                             fail_after=2, recover_after=2,
                                             required=True), [step])
    async with running_agent(tmp_path, [check], hasten_spacing=0.05) as agent:
        await until(lambda: check.runs == 1)
        await until(lambda: agent.agent.snapshot.round_complete, what="first round")
        broken["now"] = True
        agent.agent.ctx.hasten("t")  # a suspicion: the first failing run now
        await until(lambda: agent.agent.snapshot.checks["t"].state is State.FAILED,
                          within=3.0)  # not 30 s: the second failure is a quick retry
        code, _ = await agent.get("/probe/t")
        assert code == 503
        failing_runs = check.runs
        await asyncio.sleep(0.5)
        assert check.runs > failing_runs  # still re-checked quickly while failed
        broken["now"] = False
        await until(lambda: agent.agent.snapshot.checks["t"].state is State.OK,
                          within=3.0)
        code, _ = await agent.get("/probe/t")
        assert code == 200
        runs = check.runs
        await asyncio.sleep(0.8)
        assert check.runs == runs  # healthy again: back to the 30 s interval


async def test_hasten_is_ignored_while_a_check_is_in_doubt(tmp_path: Path) -> None:
    check = ScriptedCheck("t", CheckSettings(interval=30.0), [failed()])
    async with running_agent(tmp_path, [check], hasten_spacing=0.05) as agent:
        await until(lambda: check.runs == 1)
        for _ in range(5):
            agent.agent.ctx.hasten("t")
            await asyncio.sleep(0.1)
        assert check.runs == 1  # failing without a retry_interval: its interval governs
