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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from edgeheal.model import Context

if TYPE_CHECKING:
    from edgeheal.config import CheckSettings
    from edgeheal.model import CheckResult

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
