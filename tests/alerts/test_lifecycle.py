"""Problem lifecycle scenarios, as numbered rules in edgeheal.agent.alerts.lifecycle. No
engine, outbox or clock: ``now`` is a plain number, one check ``c`` (``reminder`` = 600 s)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgeheal.agent.alerts import lifecycle
from edgeheal.agent.alerts.lifecycle import Observation, Problem, Problems
from edgeheal.model import State

OK, DEG, UNK, FAIL = State.OK, State.DEGRADED, State.UNKNOWN, State.FAILED
REMIND = 600.0
SINCE = "2026-12-02T20:00:00.000Z"
KIND = {"dead": "c.dead", "stalled": "c.stalled"}
"""The kind a reason maps to (as a check module's alert map would); others: check.failed."""


def ob(state: State, reason: str = "", *, required: bool = True) -> Observation:
    reason = reason or state.value
    kind = KIND.get(reason, "check.failed")
    recovery = "check.recovered" if kind == "check.failed" else "c.recovered"
    return Observation("c", state, reason, f"m-{reason}", SINCE, required, kind, recovery)


def restored(state: State, reason: str) -> Problems:
    """``c`` open before a restart (its first opening alert had id ``R``)."""
    o = ob(state, reason)
    problem = Problem("R", o.kind, o.recovery, state.value, reason, SINCE, last_sent=0.0)
    return Problems({"c": problem}, frozenset({"c"}))


def run(start: Problems, feed: list[tuple[float, Observation]]) -> tuple[
        list[tuple[str, str, str]], list[bool], Problems]:
    """(phase, kind, correlation) of every alert, ``changed`` per step, the final state;
    each opening alert is given the id ``A<n>`` as the engine gives it the alert's id."""
    state, raised, changed = start, [], []
    for now, observation in feed:
        step = lifecycle.step(state, [observation], now=now, reminder_interval=REMIND)
        state = step.state
        for r in step.alerts:
            raised.append((r.phase, r.kind, r.correlation))
            if r.phase == "open":
                state = lifecycle.opened(state, r.check, f"A{len(raised)}")
        changed.append(step.changed)
    return raised, changed, state


FRESH = Problems()


@pytest.mark.parametrize(("start", "feed", "alerts", "changed"), [
    # 1. ok without an open problem raises nothing
    (FRESH, [(0, ob(OK)), (1, ob(OK))], [], [False, False]),
    # 2. no verdict yet (pending, connecting) opens nothing
    (FRESH, [(0, ob(UNK, "pending")), (1, ob(UNK, "connecting"))], [], [False, False]),
    # 3. leaving ok opens a problem: one alert, correlated to itself
    (FRESH, [(0, ob(OK)), (1, ob(FAIL, "dead"))], [("open", "c.dead", "")], [False, True]),
    # 3. an unknown verdict that is not "no verdict yet" opens one too
    (FRESH, [(0, ob(UNK, "check_timeout"))], [("open", "check.failed", "")], [True]),
    # 4. the same state and kind again: nothing, even with another reason and message
    (FRESH, [(0, ob(FAIL, "x")), (1, ob(FAIL, "x")), (2, ob(FAIL, "y"))],
     [("open", "check.failed", "")], [True, False, False]),
    # 5. a change of kind while it lasts: one more alert, the problem's correlation
    (FRESH, [(0, ob(DEG, "stalled")), (1, ob(FAIL, "dead"))],
     [("open", "c.stalled", ""), ("change", "c.dead", "A1")], [True, True]),
    # 5. a change of state, same kind
    (FRESH, [(0, ob(DEG, "x")), (1, ob(FAIL, "x"))],
     [("open", "check.failed", ""), ("change", "check.failed", "A1")], [True, True]),
    # 5. "no verdict yet" once a problem is open is a change like any other
    (FRESH, [(0, ob(FAIL, "x")), (1, ob(UNK, "pending"))],
     [("open", "check.failed", ""), ("change", "check.failed", "A1")], [True, True]),
    # 6. a reminder once reminder_interval has passed since the last alert, not before
    (FRESH, [(0, ob(FAIL, "dead")), (599, ob(FAIL, "dead")), (600, ob(FAIL, "dead")),
             (1199, ob(FAIL, "dead")), (1200, ob(FAIL, "dead"))],
     [("open", "c.dead", ""), ("reminder", "c.dead", "A1"), ("reminder", "c.dead", "A1")],
     [True, False, False, False, False]),
    # 6. a change resets the reminder's count
    (FRESH, [(0, ob(DEG, "stalled")), (500, ob(FAIL, "dead")), (600, ob(FAIL, "dead")),
             (1100, ob(FAIL, "dead"))],
     [("open", "c.stalled", ""), ("change", "c.dead", "A1"), ("reminder", "c.dead", "A1")],
     [True, True, False, False]),
    # 7. back to ok: the recovery of the problem's kind, same correlation; then nothing
    (FRESH, [(0, ob(FAIL, "dead")), (1, ob(OK)), (2, ob(OK))],
     [("open", "c.dead", ""), ("recover", "c.recovered", "A1")], [True, True, False]),
    # 7. a new problem after a recovery is a new correlation
    (FRESH, [(0, ob(FAIL, "x")), (1, ob(OK)), (2, ob(FAIL, "x"))],
     [("open", "check.failed", ""), ("recover", "check.recovered", "A1"),
      ("open", "check.failed", "")], [True, True, True]),
    # 8. restored, same kind and state: silent, even with a reminder due ...
    (restored(FAIL, "dead"), [(REMIND * 10, ob(FAIL, "dead"))], [], [False]),
    # 8. ... and reminders resume from the restart on
    (restored(FAIL, "dead"), [(0, ob(FAIL, "dead")), (REMIND, ob(FAIL, "dead"))],
     [("reminder", "c.dead", "R")], [False, False]),
    # 8. restored, same kind, other state: taken silently (and saved)
    (restored(DEG, "x"), [(0, ob(FAIL, "x")), (1, ob(FAIL, "x"))], [], [True, False]),
    # 8. restored, another kind: a change, with the restored correlation
    (restored(DEG, "stalled"), [(0, ob(FAIL, "dead"))], [("change", "c.dead", "R")],
     [True]),
    # 8. restored, only the first observation is special: a later change is raised
    (restored(DEG, "x"), [(0, ob(DEG, "x")), (1, ob(FAIL, "x"))],
     [("change", "check.failed", "R")], [False, True]),
    # 8. restored, ok: the recovery is still sent
    (restored(FAIL, "dead"), [(0, ob(OK))], [("recover", "c.recovered", "R")], [True]),
    # 8. restored, no verdict yet (same kind): taken silently like any other state
    (restored(FAIL, "x"), [(0, ob(UNK, "pending"))], [], [True]),
])
def test_the_lifecycle_follows_the_rules(
        start: Problems, feed: list[tuple[float, Observation]],
        alerts: list[tuple[str, str, str]], changed: list[bool]) -> None:
    assert run(start, feed)[:2] == (alerts, changed)


@pytest.mark.parametrize(("observation", "required"), [
    # 9. a required check's failure is required
    (ob(FAIL, "x"), True),
    # 9. a check.failed problem short of failed is not (a warning)
    (ob(DEG, "x"), False),
    (ob(UNK, "check_timeout"), False),
    # 9. a problem with its own kind is required whatever its state
    (ob(DEG, "stalled"), True),
    # 9. an optional check's alerts never are
    (ob(FAIL, "dead", required=False), False),
])
def test_required_follows_the_state_the_kind_and_the_check(
        observation: Observation, required: bool) -> None:
    step = lifecycle.step(FRESH, [observation], now=0, reminder_interval=REMIND)
    assert [a.required for a in step.alerts] == [required]


def test_a_recovery_is_as_required_as_its_check() -> None:
    state = run(FRESH, [(0, ob(DEG, "x"))])[2]
    for required in (True, False):
        step = lifecycle.step(state, [ob(OK, required=required)], now=1,
                              reminder_interval=REMIND)
        assert [(a.phase, a.required) for a in step.alerts] == [("recover", required)]


def test_messages_and_opened_say_what_the_subscriber_reads() -> None:
    first = lifecycle.step(FRESH, [ob(FAIL, "dead")], now=0, reminder_interval=REMIND)
    (opening,) = first.alerts
    assert (opening.message, opening.opened, opening.reminder) == ("c: failed (dead): m-dead",
                                                                  "", False)
    state = lifecycle.opened(first.state, "c", "A1")
    assert state.open["c"] == Problem("A1", "c.dead", "c.recovered", "failed", "dead",
                                      SINCE, 0.0)
    (reminder,) = lifecycle.step(state, [ob(FAIL, "dead")], now=REMIND,
                                 reminder_interval=REMIND).alerts
    assert (reminder.message, reminder.opened, reminder.reminder) == (
        "still c: failed (dead): m-dead", SINCE, True)
    (recovery,) = lifecycle.step(state, [replace(ob(OK), message="")], now=1,
                                 reminder_interval=REMIND).alerts
    assert (recovery.message, recovery.opened) == ("c: ok again (ok)", SINCE)


def test_checks_are_independent_and_raised_in_snapshot_order() -> None:
    a, b = replace(ob(FAIL, "x"), check="a"), replace(ob(FAIL, "dead"), check="b")
    step = lifecycle.step(FRESH, [b, a], now=0, reminder_interval=REMIND)
    assert [(r.check, r.kind) for r in step.alerts] == [("b", "c.dead"), ("a", "check.failed")]
    after = lifecycle.step(step.state, [replace(ob(OK), check="a")], now=1,
                           reminder_interval=REMIND)
    assert [r.check for r in after.alerts] == ["a"]
    assert set(after.state.open) == {"b"}


def test_the_record_restores_every_open_problem_as_restored() -> None:
    state = run(FRESH, [(0, ob(FAIL, "dead"))])[2]
    again = lifecycle.restore(lifecycle.record(state), now=42.0)
    assert again.open == {"c": replace(state.open["c"], last_sent=42.0)}
    assert again.restored == {"c"}
    assert lifecycle.restore("", now=0) == Problems()
    for bad in ("{", '{"c": {"kind": "x"}}'):
        with pytest.raises((ValueError, TypeError)):
            lifecycle.restore(bad, now=0)


def test_the_step_leaves_its_input_state_alone() -> None:
    state = restored(FAIL, "dead")
    lifecycle.step(state, [ob(OK)], now=0, reminder_interval=REMIND)
    assert set(state.open) == {"c"}
    assert state.restored == {"c"}
