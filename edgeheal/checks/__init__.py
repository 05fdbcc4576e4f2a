"""The check registry: one module per check, one ``register`` call each.

A check only *observes*: ``run()`` returns a :class:`~edgeheal.model.CheckResult` and never
sleeps for its own cadence, debounces, alerts or remediates — the supervisor
(:mod:`edgeheal.agent`) times it, enforces its timeout, debounces its result, records
duration and success, and publishes the snapshot. A check that also needs a long-running
task (the offload enforcer's link-event listener, the alert connection) exposes
``serve()``; the supervisor runs it as a named, supervised task next to the check.

Adding a check = one new module here that calls :func:`register`, plus its name in
:data:`BUILTIN`. Modules import their heavy dependencies (pyroute2, paho) inside the
factory, so a disabled check costs no memory.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from edgeheal.config import CheckSettings, Config
    from edgeheal.model import CheckResult, Snapshot

BUILTIN = ("offload", "wireguard", "mqtt")
"""Check modules loaded by the agent, in display order."""


@runtime_checkable
class Check(Protocol):
    """One observer. ``name`` is unique and is the URL part of ``/probe/{name}``."""

    name: str
    settings: CheckSettings

    async def run(self) -> CheckResult: ...


@runtime_checkable
class Serving(Protocol):
    """A check that also owns a long-running task (run as ``edgeheal.serve.<name>``)."""

    async def serve(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Event:
    """Something a check or actor did or saw that is not a state change (e.g. a drift
    correction). The alert subsystem turns events into alerts; the log records them."""

    kind: str
    """Dotted, ``<check or subsystem>.<event>``; from the closed table in ``alerts``."""
    message: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    correlation: str = ""


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


Factory = Callable[[Context], list[Check]]


@dataclass(frozen=True, slots=True)
class Registration:
    module: str
    factory: Factory
    doc: str


_REGISTRY: dict[str, Registration] = {}


def register(module: str, factory: Factory, doc: str = "") -> None:
    """Register a check module's factory. The factory returns zero or more checks
    (zero when the section is disabled or has nothing to watch)."""
    _REGISTRY[module] = Registration(module, factory, doc)


def registrations() -> list[Registration]:
    for name in BUILTIN:
        importlib.import_module(f"edgeheal.checks.{name}")
    return [_REGISTRY[name] for name in BUILTIN if name in _REGISTRY]


def build(ctx: Context) -> list[Check]:
    checks: list[Check] = []
    for reg in registrations():
        checks.extend(c for c in reg.factory(ctx) if c.settings.enabled)
    return checks
