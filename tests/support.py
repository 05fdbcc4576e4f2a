"""What every test folder shares: a bounded poller, one fake clock, one context builder.

One copy of each, so a fix (a poller that returns the value it waited for, a clock whose
wall time follows its monotonic time) reaches every test at once.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from edgeheal import config as cfg
from edgeheal.base.compat import UTC
from edgeheal.model import Context, Event, Snapshot

T = TypeVar("T")

WALL0 = datetime(2026, 12, 2, 20, 0, tzinfo=UTC)
"""The wall time a :class:`Clock` shows at its starting monotonic time."""


def _failure(what: str, within: float, last: object,
             report: Callable[[Any], str] | None) -> AssertionError:
    extra = f"\n{report(last)}" if report is not None else ""
    return AssertionError(f"{what} not reached within {within:g}s (last: {last!r}){extra}")


async def until(probe: Callable[[], T | Awaitable[T]], *, holds: Callable[[T], object] = bool,
                within: float = 10.0, every: float = 0.02, what: str = "condition",
                report: Callable[[T], str] | None = None) -> T:
    """Call ``probe`` until ``holds`` its value (by default: the value is truthy) and return
    that value. The one poller of the suite: bounded in count and time (no bare sleeps),
    failing after ``within`` seconds with ``what``, the last value and ``report(last)``.

    ``probe`` may return an awaitable (``lambda: asyncio.to_thread(blocking)`` polls a
    blocking call; a check's ``step`` drives a check), which is awaited. :func:`wait_until`
    is the same for code that does not run on an event loop."""
    deadline = time.monotonic() + within
    value: Any = None
    for _ in range(int(within / every) + 2):
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if holds(value):
            return value  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(every)
    raise _failure(what, within, value, report)


def wait_until(probe: Callable[[], T], *, holds: Callable[[T], object] = bool,
               within: float = 10.0, every: float = 0.02, what: str = "condition",
               report: Callable[[T], str] | None = None) -> T:
    """:func:`until` for a thread that may block (the QEMU bed, a subprocess's output)."""
    deadline = time.monotonic() + within
    value: Any = None
    for _ in range(int(within / every) + 2):
        value = probe()
        if holds(value):
            return value  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            break
        time.sleep(every)
    raise _failure(what, within, value, report)


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
    conf = config if config is not None else cfg.loads_generic(toml)
    empty = Snapshot(node=conf.node, checks={}, started_mono=clock.now, taken_mono=clock.now)
    harness = Harness(ctx=None, clock=clock)  # type: ignore[arg-type]
    harness.ctx = Context(config=conf, registry=registry or CollectorRegistry(),
                          clock=clock, wall=clock.wall,
                          snapshot=snapshot or (lambda: empty),
                          emit=harness.events.append, control=harness.handlers.__setitem__)
    return harness
