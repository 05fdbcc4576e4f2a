"""The vocabulary every part of edgeheal speaks: states, check results, statuses, the snapshot.

Defined once, frozen, and used everywhere. A check *observes* and returns a
:class:`CheckResult`; the supervisor debounces results into a :class:`CheckStatus`
(see :mod:`edgeheal.core.debounce`); the agent publishes one immutable :class:`Snapshot`
of all statuses, and everything else (HTTP, metrics, alerts, remediation) reads
that snapshot and nothing else.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from edgeheal.base.compat import UTC

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from edgeheal.config import Config


class State(enum.Enum):
    """The state of one check. Ordered by badness: ok < degraded < unknown < failed.

    ``unknown`` ranks worse than ``degraded`` because we cannot vouch for the thing
    at all (the check crashed, timed out or lacks a privilege), and readiness treats
    it like ``failed``; it ranks better than ``failed`` because nothing *proved* a fault.
    """

    OK = "ok"
    DEGRADED = "degraded"
    UNKNOWN = "unknown"
    FAILED = "failed"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def serving(self) -> bool:
        """True for the states a probe answers 200 for (ok, degraded)."""
        return self in (State.OK, State.DEGRADED)

    @staticmethod
    def worst(states: list[State] | tuple[State, ...]) -> State:
        return max(states, key=_RANK.__getitem__, default=State.OK)


_RANK = {State.OK: 0, State.DEGRADED: 1, State.UNKNOWN: 2, State.FAILED: 3}


class ExitCode(enum.IntEnum):
    """One exit-code table for every command (documented in docs/cli.md)."""

    OK = 0
    """Success; the checked condition holds (healthy, ready, every feature off)."""
    CONDITION_FALSE = 1
    """The command ran, and the condition it checks is false."""
    USAGE = 2
    """Usage or configuration error. systemd must not restart on it."""
    ENVIRONMENT = 3
    """The environment lacks something: agent unreachable, privilege or program missing."""


def _frozen(detail: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(detail or {}))


@dataclass(frozen=True, slots=True)
class CheckResult:
    """What one run of a check observed. ``reason`` comes from the check's closed table."""

    state: State
    reason: str
    message: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", _frozen(self.detail))


@dataclass(frozen=True, slots=True)
class CheckStatus:
    """The debounced, effective status of one check, as served on /status.

    ``state``/``reason``/``message`` are *effective* (debounced). ``observed`` is the
    latest raw result, which may differ while a change waits for its debounce.
    ``since_mono`` is the monotonic time the effective state began (all logic uses it);
    ``since`` is the wall-clock rendering of that moment, for humans only.
    """

    name: str
    state: State
    reason: str
    message: str
    since: datetime
    since_mono: float
    detail: Mapping[str, Any]
    required: bool
    runs: int = 0
    observed: CheckResult | None = None
    streak: int = 0
    """Consecutive raw results that disagree with the effective state (debounce progress)."""
    last_run_mono: float | None = None
    last_duration: float | None = None

    @property
    def completed(self) -> bool:
        return self.runs > 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "state": self.state.value,
            "reason": self.reason,
            "message": self.message,
            "since": rfc3339(self.since),
            "detail": dict(self.detail),
            "required": self.required,
            "runs": self.runs,
        }
        if self.observed is not None and (
            self.observed.state is not self.state or self.observed.reason != self.reason
        ):
            out["observed"] = {
                "state": self.observed.state.value,
                "reason": self.observed.reason,
                "streak": self.streak,
            }
        if self.last_duration is not None:
            out["duration_seconds"] = round(self.last_duration, 6)
        return out


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The agent's whole view at one moment. Replaced, never mutated."""

    node: str
    checks: Mapping[str, CheckStatus]
    started_mono: float
    taken_mono: float
    round_complete: bool = False
    """True once every enabled check has completed at least one run."""
    extras: Mapping[str, Any] = field(default_factory=dict)
    """Verdicts derived from the checks alone (the ``path`` verdict), JSON-ready. Never an
    actor's view: the actors read this snapshot, so what they show lives in ``/status``."""
    version: int = 0
    """Counts the agent's publications; a reader that has seen version N awaits
    ``Context.changed(N, timeout)`` for the next one."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "checks", MappingProxyType(dict(self.checks)))
        object.__setattr__(self, "extras", _frozen(self.extras))

    @property
    def failing_required(self) -> list[CheckStatus]:
        return [
            s
            for s in self.checks.values()
            if s.required and (not s.completed or not s.state.serving)
        ]

    @property
    def ready(self) -> bool:
        return self.round_complete and not self.failing_required

    @property
    def overall(self) -> State:
        return State.worst([s.state for s in self.checks.values()])

    def summary(self) -> str:
        """One line for systemd's STATUS= and the log."""
        if not self.round_complete:
            return "starting: first round of checks in progress"
        bad = [f"{s.name}={s.state.value}({s.reason})" for s in self.checks.values()
               if s.state is not State.OK]
        head = "ready" if self.ready else "NOT READY"
        return f"{head}; " + (", ".join(bad) if bad else f"all {len(self.checks)} checks ok")


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Event:
    """Something a check or actor did or saw that is not a state change (e.g. a drift
    correction). The alert subsystem turns events into alerts; the log records them."""

    kind: str
    """Dotted, ``<check or subsystem>.<event>``; from the closed table in ``alerts``."""
    message: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    correlation: str = ""


@dataclass(frozen=True, slots=True)
class FleetHold:
    """The last fleet-hold message the alert link received
    (:mod:`edgeheal.boundaries.mqtt.hold` parses it)."""

    reason: str
    until: datetime | None
    """When the hold ends by itself (UTC); None: released, or refused."""
    by: str = ""
    refused: str = ""
    """Why the message was not obeyed ("" when it is a valid hold or release)."""
    received: datetime | None = None

    def holds(self, now: datetime) -> bool:
        return not self.refused and self.until is not None and now < self.until


class AlertLinkState(Protocol):
    """What the kept-open broker connection says about itself (:class:`AlertLink`)."""

    @property
    def up(self) -> bool: ...

    @property
    def reason(self) -> str:
        """``ok`` when up; else the last failure's reason, or ``connecting``."""

    @property
    def message(self) -> str: ...

    @property
    def rtt_seconds(self) -> float | None:
        """CONNECT -> CONNACK of the current connection (when up)."""

    @property
    def connects(self) -> int: ...


class AlertLink(Protocol):
    """The kept-open connection to ``[alerts] target`` as a check reads it.

    The agent builds it once (:class:`edgeheal.boundaries.mqtt.link.Link`) and the alert engine runs
    it; the target's check only reads its state, so it needs no MQTT of its own."""

    @property
    def state(self) -> AlertLinkState: ...

    async def wait_change(self) -> None:
        """Return at the next change of :attr:`state`."""

    def confirm(self) -> None:
        """Ask the broker now (not at the next keepalive) whether the link still works;
        returns at once, :attr:`state` follows within the target's ``timeout``."""

    @property
    def fleet_hold(self) -> FleetHold | None:
        """The last fleet-hold message heard (``[fleet] hold``), None before any."""


async def _no_feed(version: int, at_most: float | None) -> None:
    """:attr:`Context.changed` without an agent: nothing is published, so wait ``at_most``."""
    await asyncio.sleep(at_most if at_most is not None else 3600.0)


@dataclass(frozen=True)
class Context:
    """What a check factory gets: settings, metrics, the clock, and the ways out."""

    config: Config
    registry: CollectorRegistry
    clock: Callable[[], float]
    """Monotonic seconds. All ages and windows use it; never the wall clock."""
    snapshot: Callable[[], Snapshot]
    """The latest published snapshot (read-only view of the other checks)."""
    emit: Callable[[Event], None]
    """Hand an event to the alert pipeline (non-blocking)."""
    control: Callable[[str, Callable[[Mapping[str, Any]], Awaitable[Any]]], None] = (
        lambda name, handler: None)
    """Register a handler on the root-only control socket (``edgeheal <cmd>``)."""
    hasten: Callable[[str], None] = lambda name: None
    """Ask the supervisor to run check ``name`` now instead of at its next interval: a
    suspicion one check raises is confirmed by another at once (e.g. WireGuard's silent rx
    by the tunnel-path MQTT probe). The agent bounds how often; unknown names are ignored."""
    wall: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    """The one wall clock (UTC), for what people read: timestamps in alerts, /status and
    persisted records. Never used for a decision."""
    alert_link: AlertLink | None = None
    """The connection to ``[alerts] target``, built once by the agent (None without one)."""
    changed: Callable[[int, float | None], Awaitable[None]] = field(default=_no_feed)
    """``await changed(version, at_most)``: return once a snapshot newer than ``version``
    is published, or after ``at_most`` seconds (None: no limit). The one way every actor
    follows the snapshot; without an agent (tests) it only waits the timeout."""


Severity = Literal["info", "warning", "critical"]


@dataclass(frozen=True, slots=True)
class Kind:
    severity: Severity
    doc: str
    problem: bool = False
    """Opens (or escalates) a problem that reminders repeat and a recovery clears."""
