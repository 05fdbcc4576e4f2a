"""The check registry: one module per check, one ``register`` call each.

A check only *observes*: ``run()`` returns a :class:`~edgeheal.model.CheckResult` and never
sleeps for its own cadence, debounces, alerts or remediates — the supervisor
(:mod:`edgeheal.agent.supervisor`) times it, enforces its timeout, debounces its result, records
duration and success, and publishes the snapshot. A check that also needs a long-running
task (the offload enforcer's link-event listener, the alert connection) exposes
``serve()``; the supervisor runs it as a named, supervised task next to the check.

Adding a check = one new module here that calls :func:`register` with its
:class:`Registration` (factory, the names it creates, its alert kinds and their mapping, its
settings rules, its closed table of reasons), plus its name in :data:`BUILTIN`; see
``docs/contributing.md``.
Modules import their heavy dependencies (pyroute2, paho) inside the factory, so a
disabled check costs no memory.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from edgeheal.model import Context, Kind, State

if TYPE_CHECKING:
    from edgeheal.config import CheckSettings, Config
    from edgeheal.model import CheckResult, CheckStatus

BUILTIN = ("offload", "wireguard", "mqtt", "uplink", "pmtu", "control")
"""Check modules loaded by the agent, in display order."""


@runtime_checkable
class Check(Protocol):
    """One observer. ``name`` is unique and is the URL part of ``/probe/{name}``.

    ``settings`` is read-only here, so a check may keep its own section's type
    (``self.settings = ctx.config.clock`` is a :class:`ClockSettings`) and still be a
    ``Check``: the agent only reads the common keys."""

    name: str

    @property
    def settings(self) -> CheckSettings: ...

    async def run(self) -> CheckResult: ...


@runtime_checkable
class Serving(Protocol):
    """A check that also owns a long-running task (run as ``edgeheal.serve.<name>``)."""

    async def serve(self) -> None: ...


Factory = Callable[[Context], list[Check]]
Validator = Callable[["Config"], None]
"""Settings rules of one check module beyond the generic ones (``fail_after``,
``timeout``, ... are checked for every check by the config package). Raises
:class:`~edgeheal.config.ConfigError` naming the key path, never a secret value."""
AlertMap = Callable[["CheckStatus"], tuple[str, str]]
"""A status that left ``ok`` -> (the problem's alert kind, its recovery kind)."""


def _no_rules(config: Config) -> None:
    return None


def generic_alert(status: CheckStatus) -> tuple[str, str]:
    return "check.failed", "check.recovered"


@dataclass(frozen=True, slots=True)
class Registration:
    """Everything the layers above need to know about one check module."""

    module: str
    """The module's name (``offload``), also its config section."""
    factory: Factory
    names: Callable[[Config], tuple[str, ...]]
    """The check names this module creates for a config (``/probe/{name}``, alert
    routing); the factory must create no other."""
    doc: str = ""
    kinds: Mapping[str, Kind] = field(default_factory=dict)
    """Alert kinds this module's checks raise, ``<module>.<event>`` -> :class:`Kind`;
    the alert table, ``docs/alerts.md`` and the alert schema's enum are built from them."""
    alert: AlertMap = generic_alert
    validate: Validator = _no_rules
    reasons: tuple[str, ...] = ()
    """The closed table of reasons this module's checks report (its docstring explains
    them); ``edgeheal_check_reason`` exports exactly these, plus the supervisor's own
    (``pending``, ``check_error``, ``check_timeout``) and ``other``."""
    default_enabled: bool = False
    """Whether the module's checks run on a node whose configuration has no section of its
    name. A new check ships off: an upgrade must not start probing a fleet that never asked
    for it. The shipped checks (offload, wireguard, mqtt, uplink) are on, as they always were
    (uplink still watches nothing without ``[uplink] interfaces``)."""
    role: str = ""
    """What the layers above know this module as (``tunnel``, ``uplink``, ``offload``), so
    that they ask :func:`role` and never import a check module by name. One module a role."""
    reason_states: Mapping[str, State] = field(default_factory=dict)
    """Each reason and the one state it maps to, for the layers that decide on reasons."""
    vocabulary: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Named sets of reasons or causes the role's readers decide on (the tunnel's
    ``send_failing`` reason, the causes that mean the uplink is gone)."""

    def reasons_in(self, state: State) -> frozenset[str]:
        """The reasons that map to ``state``."""
        return frozenset(r for r, s in self.reason_states.items() if s is state)


_REGISTRY: dict[str, Registration] = {}


def register(registration: Registration) -> None:
    """Register a check module (called once, at the bottom of the module)."""
    _REGISTRY[registration.module] = registration


def registrations() -> list[Registration]:
    for name in BUILTIN:
        importlib.import_module(f"edgeheal.checks.{name}")
    return [_REGISTRY[name] for name in BUILTIN if name in _REGISTRY]


def role(name: str) -> Registration:
    """The module registered for role ``name``; a missing role is a programming error."""
    found = [reg for reg in registrations() if reg.role == name]
    if len(found) != 1:
        raise LookupError(f"{len(found)} check modules registered for role {name!r}")
    return found[0]


def build(ctx: Context) -> list[Check]:
    checks: list[Check] = []
    for reg in registrations():
        if not reg.default_enabled and reg.module not in ctx.config.sections:
            continue  # a check that ships off: its section turns it on
        checks.extend(c for c in reg.factory(ctx) if c.settings.enabled)
    return checks


def validate(config: Config) -> None:
    """Every registered check module's own settings rules."""
    for reg in registrations():
        reg.validate(config)


def kinds() -> dict[str, Kind]:
    """The alert kinds of every registered check module."""
    out: dict[str, Kind] = {}
    for reg in registrations():
        out.update(reg.kinds)
    return out


def reasons(config: Config, name: str) -> tuple[str, ...]:
    """The reason table of check ``name`` (empty for a check no module registers)."""
    for reg in registrations():
        if name in reg.names(config):
            return reg.reasons
    return ()


def alert_kinds(config: Config, name: str, status: CheckStatus) -> tuple[str, str]:
    """(problem kind, recovery kind) for check ``name`` that left ``ok``."""
    for reg in registrations():
        if name in reg.names(config):
            return reg.alert(status)
    return generic_alert(status)
