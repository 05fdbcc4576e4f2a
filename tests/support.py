"""What every test folder shares: a bounded poller, one fake clock, one context builder.

One copy of each, so a fix (a poller that returns the value it waited for, a clock whose
wall time follows its monotonic time) reaches every test at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from edgeheal import config as cfg
from edgeheal.model import Context, Event, Snapshot

T = TypeVar("T")

WALL0 = datetime(2026, 12, 2, 20, 0, tzinfo=UTC)
"""The wall time a :class:`Clock` shows at its starting monotonic time."""


async def until(predicate: Callable[[], T], *, within: float = 10.0, every: float = 0.02,
                what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy and return that; bounded in
    count and time (no bare sleeps). Fails naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    for _ in range(int(within / every) + 2):
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(every)
    raise AssertionError(f"{what} not reached within {within:g}s")


@dataclass
class Clock:
    """Monotonic time under the test's control, with a wall clock that follows it.

    ``step`` advances the clock on every read, so a loop waiting for a deadline ends after a
    bounded number of reads. ``wall()`` is ``WALL0`` plus the time elapsed since ``start``,
    plus any :meth:`step_wall` jumps (an NTP step moves the wall clock only)."""

    now: float = 1000.0
    step: float = 0.0
    start: float = 1000.0
    wall0: datetime = WALL0
    jumped: float = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def step_wall(self, seconds: float) -> None:
        self.jumped += seconds

    def wall(self) -> datetime:
        return self.wall0 + timedelta(seconds=self.now - self.start + self.jumped)


@dataclass
class Harness:
    """A context and what flowed out of it: emitted events and control handlers."""

    ctx: Context
    clock: Clock
    events: list[Event] = field(default_factory=list)
    handlers: dict[str, Callable[[Mapping[str, Any]], Awaitable[Any]]] = field(
        default_factory=dict)


def context(toml: str = "", *, clock: Clock | None = None,
            registry: CollectorRegistry | None = None,
            snapshot: Callable[[], Snapshot] | None = None,
            config: cfg.Config | None = None) -> Harness:
    """A :class:`~edgeheal.model.Context` over ``toml`` (or ``config``) with a fake clock;
    events and control handlers are collected in the returned harness."""
    clock = clock or Clock()
    conf = config if config is not None else cfg.loads(toml)
    empty = Snapshot(node=conf.node, checks={}, started_mono=clock.now, taken_mono=clock.now)
    harness = Harness(ctx=None, clock=clock)  # type: ignore[arg-type]
    harness.ctx = Context(config=conf, registry=registry or CollectorRegistry(),
                          clock=clock, wall=clock.wall,
                          snapshot=snapshot or (lambda: empty),
                          emit=harness.events.append, control=harness.handlers.__setitem__)
    return harness
