"""Remedies: actors that restart Flannel, one module per way of doing it, one registry.

The pure policy (:mod:`edgeheal.core.flannel_ladder`) decides *whether* to act; a remedy only knows
*how*: ``pod`` deletes this node's Flannel pod through the Kubernetes API, ``k3s-service``
restarts the k3s/k3s-agent unit over systemd's D-Bus API. Each boundary error is turned
into :class:`RemedyError` with ``config_problem=True`` when a human must fix permissions or
settings (401/403, polkit denial) rather than wait for a retry.

Why a registry (like :mod:`edgeheal.checks`): the layers above — the remediation actor,
config validation, the docs — must not list remedy modes. Each remedy module ends with one
:func:`register` call giving its mode name, its factory, how long one of its restarts may
take, whether it can exist in a configuration at all (``pod`` needs ``[kubernetes]``), a doc
line and its own settings rules. Whether it can act *on this node* is the remedy's
``probe()``, asked at run time. :data:`BUILTIN` is also ``mode = "auto"``'s probe order.
Adding a remedy = one module here that registers itself, its name in :data:`BUILTIN`, its
test and its rows in ``docs/remediation.md`` and ``docs/configuration.md``.

The modules import their heavy dependencies (dbus-fast, lightkube) only when a remedy
acts, so loading the registry (as config validation does) costs no memory.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from edgeheal.boundaries.kube import KubeClient
    from edgeheal.config import Config

BUILTIN = ("pod", "k3s_service", "modem_reconnect", "radio_cycle", "link_bounce",
           "modemmanager_restart", "usb_reauthorize", "reboot", "driver_rebind",
           "sim_switch", "rebind")
"""Remedy modules, in ``mode = "auto"``'s probe order: a Flannel pod on this node is the
surer sign (DaemonSet Flannel), a K3s unit exists on every K3s node. The uplink ladder's
rungs (``ladder = "uplink"``) follow, the two opt-in ones last; ``auto`` never considers
them, and their order on the ladder is ``[remediation.uplink] rungs``. Then the rungs the
Flannel ladder tries once before a restart (``ladder = "pre-restart"``, in this order)."""
FLANNEL = "flannel"
UPLINK = "uplink"
PRE_RESTART = "pre-restart"
"""The Flannel ladder's first rung: tried once per failure before the restart remedy
(``rebind``); never picked by ``auto`` as the restart remedy."""
CONTROL = "control"


class RemedyError(Exception):
    """A restart could not be carried out. The message names what failed, never a secret."""

    def __init__(self, message: str, *, config_problem: bool = False) -> None:
        super().__init__(message)
        self.config_problem = config_problem


@dataclass(frozen=True, slots=True)
class Availability:
    usable: bool
    why: str
    """Human reason, shown in /status and the log ("flannel pod kube-flannel/x on node")."""


@dataclass(frozen=True, slots=True)
class RemedyOutcome:
    """What one restart did: ``target`` names the pod or unit acted on."""

    target: str
    detail: str = ""


class Remedy(Protocol):
    mode: str
    """The registered mode name (``pod``, ``k3s-service``)."""

    async def probe(self) -> Availability:
        """Can this remedy act on this node? (used by ``mode = "auto"``)"""
        ...

    async def restart(self) -> RemedyOutcome:
        """Restart Flannel and return once the replacement is up (pod Ready / unit
        active), or raise :class:`RemedyError`. Tunnel recovery is verified by the caller."""
        ...


@dataclass(frozen=True, slots=True)
class Needs:
    """What a remedy factory gets: the settings and the agent's shared connections."""

    config: Config
    kube: Callable[[], KubeClient]
    """The one Kubernetes client of the agent (also used for Node Events and the Node
    condition), made on the first call; call it only when ``[kubernetes]`` is configured."""


Factory = Callable[[Needs], Remedy]
Validator = Callable[["Config"], None]
"""A remedy's own settings rules. Raises :class:`~edgeheal.config.ConfigError` naming the
key path, never a secret value."""


def _no_rules(config: Config) -> None:
    return None


def _always(config: Config) -> str:
    return ""


@dataclass(frozen=True, slots=True)
class RemedyRegistration:
    """Everything the layers above need to know about one remedy module."""

    mode: str
    """The ``remediation.mode`` value that selects it (``k3s-service``)."""
    module: str
    """The module's name under ``edgeheal.remedies`` (``k3s_service``)."""
    factory: Factory
    restart_bound: Callable[[Config], float]
    """The remedy's own limit on one restart, seconds (its ready/job timeout). The actor
    adds a margin for the calls around it and abandons a restart that overruns both."""
    unavailable: Callable[[Config], str] = _always
    """Why this remedy cannot exist in this configuration (``not configured``), or ``""``.
    Availability on this node is ``probe()``'s business, not this."""
    doc: str = ""
    """One line for ``docs/remediation.md``'s table of remedies."""
    settings: str = ""
    """Its own settings section (``remediation.pod``): documented in
    ``docs/configuration.md``, checked by :attr:`validate`."""
    validate: Validator = _no_rules
    ladder: str = FLANNEL
    """The ladder this remedy is a rung of: ``flannel`` (Flannel restarts; ``auto`` picks
    among these), ``pre-restart`` (the Flannel ladder's rung before the restart) or
    ``uplink`` (the uplink ladder's rungs, never picked by ``auto``)."""
    verify_bound: Callable[[Config], float] | None = None
    """How long the actor waits for the cure after this remedy, seconds; None: the
    ladder's own ``verify_timeout``."""
    also: tuple[str, ...] = ()
    """Further ladders that use this remedy as it is (``k3s-service`` is also the control
    ladder's one remedy: restarting the K3s agent's unit)."""


_REGISTRY: dict[str, RemedyRegistration] = {}


def register(registration: RemedyRegistration) -> None:
    """Register a remedy module (called once, at the bottom of the module)."""
    _REGISTRY[registration.module] = registration


def registrations(ladder: str | None = FLANNEL) -> list[RemedyRegistration]:
    """The registered remedies of ``ladder`` (None: all), in :data:`BUILTIN` (probe)
    order. A module missing from a trimmed install is left out, not an error."""
    for name in BUILTIN:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    return [_REGISTRY[name] for name in BUILTIN
            if name in _REGISTRY
            and ladder in (None, _REGISTRY[name].ladder, *_REGISTRY[name].also)]


def modes() -> tuple[str, ...]:
    """The registered mode names, in probe order."""
    return tuple(reg.mode for reg in registrations())


def by_mode(mode: str, ladder: str | None = FLANNEL) -> RemedyRegistration | None:
    return next((reg for reg in registrations(ladder) if reg.mode == mode), None)


def validate(config: Config) -> None:
    """``remediation.mode`` names a registered remedy (or ``auto``/``none``), and every
    registered remedy's own settings rules hold."""
    from edgeheal.config import ConfigError  # config loading calls this

    mode = config.remediation.mode
    choices = ("auto", *modes(), "none")
    if mode not in choices:
        raise ConfigError("remediation.mode", "expected " + " or ".join(map(repr, choices))
                          + f", got {mode!r}")
    for reg in registrations(None):
        reg.validate(config)
