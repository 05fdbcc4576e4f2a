"""What every remediation ladder shares: the action vocabulary, the history, the safeguards.

Why a module of its own: edgeheal has three ladders — Flannel's
(:mod:`edgeheal.core.flannel_ladder`: restart Flannel when the tunnel is broken), the uplink's
(:mod:`edgeheal.core.uplink_ladder`: reconnect, bounce, re-authorize, reboot when the modem is
stuck) and the control path's (:mod:`edgeheal.core.control_ladder`: restart the K3s agent that
has lost its server). They decide on different evidence, but the safeguards that keep an
automatic remedy from making things worse must be
*one* implementation, not two copies drifting apart: an operator pause, the circuit that
opens after ``give_up_after`` attempts in a row that did not cure, ``startup_grace`` after
the agent or the node started, the ``cooldown`` between attempts and the ``max_per_hour``
budget over a sliding hour. This module holds them as pure functions over the
:class:`History` (the state each actor persists, :mod:`edgeheal.agent.remediation.history`), so
each ladder's ``decide`` is "its own evidence gates, then the shared safeguards" and both
are table-tested with an injected clock.

The safeguards come in two groups because each ladder puts its own evidence gates between
them (Flannel's order is unchanged from before this module existed):

- :func:`held` — an operator ``paused`` the ladder, or the ``circuit_open``: nothing the
  evidence says matters, a human has the last word;
- :func:`throttled` — ``open_circuit`` (``give_up_after`` attempts in a row did not cure),
  ``startup_grace``, ``cooldown``, ``budget_exhausted``;
- :func:`jittered` — after every gate, the first attempt of an episode waits a random
  part of ``restart_jitter`` (the Flannel and the control ladders: a fault on the hub's or
  the server's side reaches every node in the same second).

Pure: no I/O, no clock; ``now`` is the agent's monotonic clock and every time in the
:class:`History` is on that timeline (None for an earlier boot's entry).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from edgeheal.model import State

WINDOW = 3600.0
"""The sliding window of ``max_per_hour``, seconds."""
KEEP = 50
"""History entries kept (the newest); older ones cannot matter to any window."""

ActionKind = Literal["restart", "skip", "watch", "open_circuit", "close_circuit"]
CURED: frozenset[str] = frozenset({"recovered"})


@dataclass(frozen=True, slots=True)
class Action:
    """What a ladder wants done now. ``reason`` is a short code; ``message`` is for people;
    ``rung`` names the remedy to act with when the ladder has several (the uplink's), ""
    when the actor's one selected remedy is meant (Flannel's)."""

    kind: ActionKind
    reason: str
    message: str = ""
    dry_run: bool = False
    rung: str = ""
    until: float | None = None
    """For a ``watch`` that waits (``restart_jitter``): when the attempt may go ahead
    (monotonic); the actor keeps it in :attr:`History.jitter_until`."""


@dataclass(frozen=True, slots=True)
class Record:
    """One attempt. ``mono`` is on the current process's monotonic timeline, or
    None for entries of an earlier boot (display only; see the module docstring)."""

    mono: float | None
    wall: str
    mode: str
    reason: str
    result: str
    """``recovered``, ``not_recovered``, ``failed``, ``config_problem``, ``dry_run``;
    ``in_progress`` is persisted *before* the remedy runs, so an agent killed mid-restart
    still counts the attempt (cooldown, budget, circuit); it reads back as
    ``interrupted``."""
    duration: float
    target: str = ""
    action: str = "restart"

    def to_json(self) -> dict[str, Any]:
        return {"time": self.wall, "action": self.action, "mode": self.mode,
                "reason": self.reason, "result": self.result,
                "duration_seconds": round(self.duration, 3), "target": self.target}


class _DirectView(Protocol):
    @property
    def direct_mqtt(self) -> Mapping[str, State]: ...


@dataclass(frozen=True, slots=True)
class History:
    records: tuple[Record, ...] = ()
    failures_in_row: int = 0
    """Attempts in a row that did not cure (reset when healthy). On the uplink ladder it
    is also the rung the next attempt uses: one rung up per attempt that did not cure."""
    circuit_open: bool = False
    paused_until: float | None = None
    """Monotonic end of an operator pause; ``math.inf`` for an indefinite one."""
    direct_was_down: bool = False
    """A direct-path target has *failed* on this boot (an outage, not the first connection's
    ``unknown``). Until then the direct path's first ``ok`` is the agent starting, not the
    uplink coming back, and ``uplink_settle`` does not apply."""
    jitter_until: float | None = None
    """The first attempt of this failure episode waits until then (monotonic; drawn once
    per episode, :func:`edgeheal.core.flannel_ladder.decide`); None: not drawn. Cleared by
    an attempt and by a healthy reading."""

    def restarts_within(self, now: float, window: float = WINDOW) -> list[Record]:
        """Attempts (dry runs included) in ``(now - window, now]`` on this boot."""
        return [r for r in self.records if r.mono is not None and now - r.mono < window]

    def last_restart(self, *, besides: str = "") -> Record | None:
        """The newest attempt of this boot (``besides``: not counting that mode's)."""
        dated = [r for r in self.records if r.mono is not None
                 and not (besides and r.mode == besides)]
        return max(dated, key=lambda r: r.mono or 0.0) if dated else None

    def paused(self, now: float) -> bool:
        return self.paused_until is not None and now < self.paused_until

    # --- pure updates -------------------------------------------------------------------

    def with_record(self, record: Record) -> History:
        """Add an attempt; a real attempt that did not cure counts toward the circuit.
        An ``in_progress`` attempt counts as not cured until :meth:`finished` says so (if it
        cured, the healthy state clears the streak anyway)."""
        in_row = self.failures_in_row
        if record.result in CURED:
            in_row = 0
        elif record.result != "dry_run":
            in_row += 1
        return replace(self, records=(*self.records, record)[-KEEP:], failures_in_row=in_row,
                       jitter_until=None)

    def finished(self, record: Record) -> History:
        """Replace the ``in_progress`` attempt started at ``record.mono`` by its outcome."""
        for i in range(len(self.records) - 1, -1, -1):
            old = self.records[i]
            if old.result == "in_progress" and old.mono == record.mono:
                records = (*self.records[:i], record, *self.records[i + 1:])
                in_row = 0 if record.result in CURED else self.failures_in_row
                return replace(self, records=records, failures_in_row=in_row)
        return self.with_record(record)

    def opened(self) -> History:
        return replace(self, circuit_open=True)

    def closed(self) -> History:
        """Healthy again, or an operator reset: circuit closed, streak cleared."""
        return replace(self, circuit_open=False, failures_in_row=0)

    def paused_for(self, now: float, seconds: float | None) -> History:
        return replace(self, paused_until=math.inf if seconds is None else now + seconds)

    def resumed(self) -> History:
        return replace(self, paused_until=None)

    def waiting_until(self, until: float | None) -> History:
        """The episode's first attempt waits until ``until`` (None: the wait is over)."""
        return self if until == self.jitter_until else replace(self, jitter_until=until)

    def saw(self, view: _DirectView) -> History:
        """Note what the view says about the direct path (``self`` when nothing changes)."""
        if self.direct_was_down or not any(s is State.FAILED
                                           for s in view.direct_mqtt.values()):
            return self
        return replace(self, direct_was_down=True)


@dataclass(frozen=True, slots=True)
class Limits:
    """The numbers the shared safeguards read (each ladder's settings provide them)."""

    cooldown: float
    max_per_hour: int
    startup_grace: float
    give_up_after: int

    @classmethod
    def of(cls, settings: Any) -> Limits:
        """From any settings object with the four fields (duck-typed: config stays below)."""
        return cls(float(settings.cooldown), int(settings.max_per_hour),
                   float(settings.startup_grace), int(settings.give_up_after))


@dataclass(frozen=True, slots=True)
class Wording:
    """How a ladder's messages name its attempts and what they cure."""

    attempts: str = "restarts"
    subject: str = "the tunnel"
    attempt: str = "restart"
    """One attempt (the restart jitter's message)."""
    act: str = "restart"
    """The verb of an attempt (the restart jitter's message)."""


FLANNEL = Wording()


def held(history: History, now: float, failure: str,
         wording: Wording = FLANNEL) -> Action | None:
    """An operator pause or an open circuit: ``skip`` with that reason, else None."""
    if history.paused(now):
        until = ("until resumed" if history.paused_until == math.inf
                 else f"for {history.paused_until - now:.0f}s more"  # type: ignore[operator]
                 )
        return Action("skip", "paused", f"{failure}: remediation paused {until}")
    if history.circuit_open:
        return Action("skip", "circuit_open",
                      f"{failure}: circuit open after {history.failures_in_row} "
                      f"{wording.attempts} that did not cure; a human is needed")
    return None


def may_close(now: float, started_mono: float, limits: Limits) -> bool:
    """Whether a healthy reading may close the circuit and clear the streak: not within
    ``startup_grace`` of the agent's own start. A check's first readings after the agent
    was restarted (kill -9 mid-attempt, a crash) are no evidence of a cure: the WireGuard
    check's first reading of a device with a young handshake says ``ok`` (one reading
    shows no stall), the uplink check counts its start as traffic. Closing on them would
    clear the streak and allow attempts beyond ``give_up_after``. Nothing else waits: a
    healthy reading never acts, it only keeps the streak until the grace is over."""
    return now - started_mono >= limits.startup_grace


def throttled(history: History, now: float, failure: str, limits: Limits, *,
              started_mono: float, booted_mono: float,
              wording: Wording = FLANNEL, no_cooldown_after: str = "") -> Action | None:
    """``open_circuit``, ``startup_grace``, ``cooldown`` or ``budget_exhausted`` (in that
    order), else None: the attempt may go ahead. ``no_cooldown_after``: a mode whose
    attempts start no cooldown (the Flannel ladder's first rung, before its restart)."""
    if history.failures_in_row >= limits.give_up_after:
        return Action("open_circuit", failure,
                      f"{failure}: {history.failures_in_row} {wording.attempts} in a row did "
                      f"not cure it; no more {wording.attempts} until {wording.subject} is "
                      "healthy or a reset")
    grace_end = max(started_mono, booted_mono) + limits.startup_grace
    if now < grace_end:
        return Action("skip", "startup_grace",
                      f"{failure}: within startup grace ({grace_end - now:.0f}s left)")
    last = history.last_restart(besides=no_cooldown_after)
    if last is not None and last.mono is not None and now - last.mono < limits.cooldown:
        return Action("skip", "cooldown",
                      f"{failure}: cooldown ({limits.cooldown - (now - last.mono):.0f}s "
                      "left)")
    recent = history.restarts_within(now)
    if len(recent) >= limits.max_per_hour:
        oldest = min(r.mono for r in recent if r.mono is not None)
        return Action("skip", "budget_exhausted",
                      f"{failure}: {len(recent)} {wording.attempts} in the last hour (max "
                      f"{limits.max_per_hour}); next in {WINDOW - (now - oldest):.0f}s")
    return None


def jittered(history: History, now: float, failure: str, jitter: float, *,
             rand: Callable[[], float] | None, wording: Wording = FLANNEL) -> Action | None:
    """The episode's first attempt waits its drawn fraction of ``jitter`` (``watch``
    ``restart_jitter`` with :attr:`Action.until`), else None: the attempt may go ahead.

    Drawn once per episode from ``rand`` (a float in [0, 1); None draws 0: no wait) when
    the attempt is first due and kept in :attr:`History.jitter_until` by the actor; not
    for a later attempt of the same episode (``failures_in_row``: ``cooldown`` spaces
    those), nor with ``jitter`` 0. Each ladder calls it after every other gate, so no gate
    lines a fleet that failed in the same second up again."""
    if history.failures_in_row or jitter <= 0:
        return None  # not the first attempt of the episode, or no jitter configured
    until = history.jitter_until
    if until is None:
        fraction = min(max(rand() if rand is not None else 0.0, 0.0), 1.0)
        until = now + fraction * jitter
    if now >= until:
        return None
    return Action("watch", "restart_jitter",
                  f"{failure}: the first {wording.attempt} of this episode waits "
                  f"{until - now:.0f}s more (a random part of restart_jitter {jitter:g}s, "
                  f"so a fleet failing at once does not {wording.act} at once)", until=until)


def budget_left(history: History, now: float, limits: Limits) -> int:
    return max(0, limits.max_per_hour - len(history.restarts_within(now)))
