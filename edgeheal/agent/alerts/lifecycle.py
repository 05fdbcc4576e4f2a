"""The problem lifecycle: when a check's problem opens, changes, repeats and closes.

Why transitions and not results: a failing probe every 5 s must not become an alert every
5 s. Why a pure function: these rules are the contract subscribers build on (one
``correlation`` per problem, reminders, a recovery still sent after a restart), and as a
function of (open problems, observations, ``now``) they are tested row by row without a
broker, an outbox or a clock (``tests/alerts/test_lifecycle.py``). :func:`step` reads no
clock and does no I/O; the engine raises the alerts it returns, persists the state and
builds each alert's ``detail`` from the snapshot.

The rules, per completed check, in snapshot order:

1. ``ok`` with no open problem: nothing.
2. Not ``ok``, no open problem, and no verdict yet (reason in :data:`NOT_YET`): nothing.
3. Otherwise leaving ``ok`` *opens* a problem: one alert; its correlation is its own id
   (minted when the engine raises it: :func:`opened` binds it to the problem).
4. The same state and kind again: nothing (a new reason alone is not a change).
5. A change of state or kind while the problem lasts (``rekey_failing`` -> ``dead``): one
   more alert with the problem's correlation.
6. Every ``reminder_interval`` since the last alert of the problem, a ``reminder``.
7. Back to ``ok``: the problem's recovery alert, same correlation; the problem closes.
8. Problems restored from the outbox (a restart) continue: their first observation with
   the same kind raises nothing (not even a due reminder) and takes the new state
   silently; a different kind is a change (5); ``ok`` closes them (7).
9. ``required``: an alert of an optional check is a warning; so is a ``check.failed``
   problem that is not ``failed``; a recovery is as required as its check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from edgeheal.base import statefile
from edgeheal.base.statefile import StateFileError
from edgeheal.model import State

NOT_YET = ("pending", "connecting")
"""Reasons that mean "no verdict yet": they never open a problem."""

Phase = Literal["open", "change", "reminder", "recover"]


@dataclass(frozen=True, slots=True)
class Observation:
    """One completed check's effective (debounced) status, as the lifecycle reads it."""

    check: str
    state: State
    reason: str
    message: str
    since: str
    """When the state began (RFC 3339): an opened problem's ``opened``."""
    required: bool = True
    kind: str = ""
    """The problem's alert kind for this status (unused when ``ok``)."""
    recovery: str = ""
    """The kind of the alert that closes it."""


@dataclass(frozen=True, slots=True)
class Problem:
    correlation: str
    kind: str
    recovery: str
    state: str
    reason: str
    opened: str
    last_sent: float
    """Monotonic time of the problem's last alert (not persisted: a restart resets it)."""

    def to_json(self) -> dict[str, Any]:
        return {"correlation": self.correlation, "kind": self.kind, "recovery": self.recovery,
                "state": self.state, "reason": self.reason, "opened": self.opened}


@dataclass(frozen=True, slots=True)
class Problems:
    """The open problems, by check name."""

    open: Mapping[str, Problem] = field(default_factory=dict)
    restored: frozenset[str] = frozenset()
    """Restored from the outbox and not yet observed in this run (rule 8)."""


@dataclass(frozen=True, slots=True)
class Raise:
    """One alert to raise."""

    check: str
    phase: Phase
    kind: str
    message: str
    correlation: str
    """The problem's; empty for the alert that opens it (its own id)."""
    opened: str
    """The problem's ``opened`` for ``detail.opened``; empty for the opening alert."""
    required: bool

    @property
    def reminder(self) -> bool:
        return self.phase == "reminder"


@dataclass(frozen=True, slots=True)
class Step:
    state: Problems
    alerts: tuple[Raise, ...]
    changed: bool
    """The persisted record (:func:`record`) changed: save it."""


def step(state: Problems, observations: Iterable[Observation], *, now: float,
         reminder_interval: float) -> Step:
    """The new open problems and the alerts to raise, in order, for ``observations``."""
    problems = dict(state.open)
    restored = set(state.restored)
    alerts: list[Raise] = []
    changed = False
    for ob in observations:
        name, problem = ob.check, problems.get(ob.check)
        was_restored = name in restored
        restored.discard(name)
        if ob.state is State.OK:
            if problem is not None:  # 7
                del problems[name]
                alerts.append(Raise(name, "recover", problem.recovery,
                                    f"{name}: ok again ({ob.message or ob.reason})",
                                    problem.correlation, problem.opened, ob.required))
                changed = True
            continue  # 1
        if problem is None and ob.reason in NOT_YET:
            continue  # 2
        required = ob.required and (ob.state is State.FAILED or ob.kind != "check.failed")
        message = f"{name}: {ob.state.value} ({ob.reason}): {ob.message}"
        if problem is None:  # 3
            alerts.append(Raise(name, "open", ob.kind, message, "", "", required))
            problems[name] = Problem("", ob.kind, ob.recovery, ob.state.value, ob.reason,
                                     ob.since, now)
            changed = True
        elif problem.kind != ob.kind or problem.state != ob.state.value:
            changed = True
            if was_restored and problem.kind == ob.kind:  # 8
                problems[name] = replace(problem, state=ob.state.value, reason=ob.reason)
                continue
            alerts.append(Raise(name, "change", ob.kind, message, problem.correlation,
                                problem.opened, required))  # 5
            problems[name] = replace(problem, kind=ob.kind, state=ob.state.value,
                                     reason=ob.reason, last_sent=now)
        elif not was_restored and now - problem.last_sent >= reminder_interval:  # 4, 6, 8
            alerts.append(Raise(name, "reminder", ob.kind, f"still {message}",
                                problem.correlation, problem.opened, required))
            problems[name] = replace(problem, last_sent=now)
    return Step(Problems(problems, frozenset(restored)), tuple(alerts), changed)


def opened(state: Problems, check: str, correlation: str) -> Problems:
    """``state`` with the problem of ``check`` (just opened) bound to ``correlation``, the id
    of its opening alert."""
    problems = dict(state.open)
    problems[check] = replace(problems[check], correlation=correlation)
    return Problems(problems, state.restored)


def record(state: Problems) -> str:
    """The persisted form of the open problems (JSON)."""
    return json.dumps({name: p.to_json() for name, p in state.open.items()}, sort_keys=True)


def restore(raw: str, *, now: float) -> Problems:
    """The open problems of a :func:`record` ("" for none), all of them restored (rule 8),
    their reminders counted from ``now``. Raises :class:`StateFileError` (a ValueError)
    saying what is wrong with anything :func:`record` does not write."""
    if not raw:
        return Problems()
    what = "the open-problems record"
    fields = set(Problem.__dataclass_fields__) - {"last_sent"}
    problems = {}
    for name, doc in statefile.parse(raw, what=what).items():
        if not isinstance(doc, dict) or set(doc) != fields:
            raise StateFileError(what, f"the problem of {str(name)[:40]!r} is not an "
                                 f"object with the fields {', '.join(sorted(fields))}")
        if not all(isinstance(v, str) for v in doc.values()):
            raise StateFileError(what, f"the problem of {str(name)[:40]!r} has a field "
                                 "that is not a string")
        problems[name] = Problem(last_sent=now, **doc)
    return Problems(problems, frozenset(problems))
