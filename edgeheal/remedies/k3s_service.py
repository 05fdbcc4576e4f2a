"""The ``k3s-service`` remedy: restart K3s's embedded Flannel by restarting its systemd unit.

Why a unit restart: with K3s's default (and ``wireguard-native``) Flannel runs inside the
``k3s``/``k3s-agent`` process, so there is no Flannel pod to delete. K3s's units use
``KillMode=process``: restarting the unit restarts K3s (and Flannel, which re-creates
``flannel-wg``) while the workload containers keep running.

Why D-Bus: the agent runs no subprocess in its steady state, and systemd's API gives what
``systemctl restart`` only prints — the job's result and typed errors. This is exactly what
``systemctl restart`` does underneath: ``Manager.Subscribe()``; a match on ``JobRemoved``
(set up *before* the job exists, so a fast job cannot be missed);
``Manager.RestartUnit(unit, "replace")`` -> a job path; wait for ``JobRemoved`` for that
job (``done``, or ``failed``/``timeout``/``canceled``/``dependency``/...); then wait until
the unit's ``ActiveState`` is ``active`` again (``PropertiesChanged`` plus a re-read), all
within ``[remediation.service] timeout``. Recovery of the tunnel itself is the caller's to
verify.

Privilege: the agent runs as the system user ``edgeheal``. For a non-root caller systemd
asks polkit (action ``org.freedesktop.systemd1.manage-units``, details ``unit`` and
``verb``); ``systemd/50-edgeheal-k3s-restart.rules`` allows user ``edgeheal`` exactly
``restart`` of ``k3s-agent.service``/``k3s.service`` and nothing else. Without it systemd
answers ``InteractiveAuthorizationRequired`` (no rule matched, polkit would ask for a
password) or ``AccessDenied`` (polkit or the bus policy said no): both are a configuration
problem, :class:`RemedyError` with ``config_problem=True`` naming the rule. The remedy
itself restarts only the configured (or ``auto``-resolved K3s) unit; no caller can pass
another one.

Unit resolution (``unit = "auto"``): ``k3s-agent.service`` on agents, ``k3s.service`` on
servers — the one whose ``LoadState`` is ``loaded`` (``GetUnit``, then ``LoadUnit``, which
reports ``not-found`` for a unit without a file); if both are loaded, the active one; if
that is still ambiguous, the remedy is not usable and says to set ``unit``.

The bus is the system bus (``$DBUS_SYSTEM_BUS_ADDRESS`` or
``unix:path=/run/dbus/system_bus_socket``; tests pass their own address), reached through
:mod:`edgeheal.boundaries.bus` (which imports dbus-fast only when used). One connection per probe or
restart: remedies are rare, and a fresh connection survives a restarted dbus-daemon.

Registered (at the bottom) as mode ``k3s-service``: it owns the ``[remediation.service]``
rules (only a K3s unit, :data:`K3S_UNIT_PATTERN`), and one restart may take
``[remediation.service] timeout``. It is also the control ladder's one remedy
(``also``: restarting the K3s agent that has lost its server, docs/control.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeheal.base import compat
from edgeheal.boundaries.bus import (
    DBUS,
    DBUS_PATH,
    NO_LIBRARY,
    PROPERTIES,
    Bus,
    BusError,
    open_bus,
    system_address,
)
from edgeheal.remedies import (
    Availability,
    Needs,
    RemedyError,
    RemedyOutcome,
    RemedyRegistration,
    register,
)

if TYPE_CHECKING:
    from dbus_fast import Message

    from edgeheal.config import Config, ServiceSettings

log = logging.getLogger(__name__)

AUTO_UNITS = ("k3s-agent.service", "k3s.service")
"""What ``unit = "auto"`` looks for: an agent's unit first, then a server's."""
POLKIT_RULE = "/etc/polkit-1/rules.d/50-edgeheal-k3s-restart.rules"
MODE = "k3s-service"
K3S_UNIT_PATTERN = re.compile(r"k3s[A-Za-z0-9:_.\\-]{0,200}\.service")
"""The units this remedy may restart: K3s's own (`k3s`, `k3s-agent`,
`k3s-<INSTALL_K3S_NAME>`), never an arbitrary unit."""

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER_IFACE = "org.freedesktop.systemd1.Manager"
UNIT_IFACE = "org.freedesktop.systemd1.Unit"

REREAD_INTERVAL = 1.0
"""While waiting, re-read state this often even without a signal (a lost signal costs 1 s)."""

NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"


@dataclass(frozen=True, slots=True)
class UnitState:
    name: str
    path: str
    load_state: str
    active_state: str


class _Systemd:
    """The few calls the remedy makes to systemd, on one connection."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def manager(self, member: str, signature: str = "",
                      body: list[Any] | None = None) -> list[Any]:
        return await self.bus.call(SYSTEMD, MANAGER_PATH, MANAGER_IFACE, member, signature,
                                   body or [])

    async def unit_property(self, path: str, name: str) -> str:
        (variant,) = await self.bus.call(SYSTEMD, path, PROPERTIES, "Get", "ss",
                                         [UNIT_IFACE, name])
        return str(variant.value)


class K3sServiceRemedy:
    """Restarts the K3s unit over systemd's D-Bus API (see the module docstring)."""

    mode = MODE
    WHAT = "K3s"
    """What the unit is, in messages (a subclass restarts another unit)."""

    def __init__(self, settings: ServiceSettings, *, bus_address: str | None = None) -> None:
        self.settings = settings
        self.bus_address = system_address(bus_address)

    # --- the Remedy protocol ------------------------------------------------------------

    async def probe(self) -> Availability:
        try:
            async with self._connect() as bus:
                unit, why = await self._resolve(bus)
        except RemedyError as err:
            return Availability(False, str(err))
        return Availability(unit is not None, why)

    async def restart(self) -> RemedyOutcome:
        started = time.monotonic()
        async with self._connect() as bus:
            unit, why = await self._resolve(bus)
            if unit is None:
                raise RemedyError(f"cannot restart {self.WHAT}: {why}", config_problem=True)
            try:
                return await self._restart(bus, unit, started)
            except BusError as err:
                raise self._error(err, unit) from err

    # --- steps ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[_Systemd]:
        try:
            bus = await open_bus(self.bus_address)
        except BusError as err:
            if err.name == NO_LIBRARY:
                raise RemedyError(f"the k3s-service remedy {err}", config_problem=True) \
                    from err
            raise RemedyError(str(err), config_problem=err.kind == "config") from err
        try:
            yield _Systemd(bus)
        finally:
            await bus.close()

    async def _unit_state(self, bus: _Systemd, name: str) -> UnitState:
        try:
            (path,) = await bus.manager("GetUnit", "s", [name])
        except BusError as err:
            if err.name != NO_SUCH_UNIT:
                raise
            (path,) = await bus.manager("LoadUnit", "s", [name])
        return UnitState(name, str(path), await bus.unit_property(path, "LoadState"),
                         await bus.unit_property(path, "ActiveState"))

    async def _resolve(self, bus: _Systemd) -> tuple[str | None, str]:
        """The unit to restart (or None) and why, for /status and the log."""
        configured = self.settings.unit
        names = AUTO_UNITS if configured == "auto" else (configured,)
        try:
            states = [await self._unit_state(bus, name) for name in names]
        except BusError as err:
            raise self._error(err, " / ".join(names)) from err
        loaded = [s for s in states if s.load_state == "loaded"]
        if configured != "auto":
            (state,) = states
            if not loaded:
                return None, (f"configured unit {configured} is not loaded (LoadState "
                              f"{state.load_state})")
            return configured, f"configured unit {configured} is loaded ({state.active_state})"
        if not loaded:
            found = ", ".join(f"{s.name} {s.load_state}" for s in states)
            return None, f"no K3s unit on this node ({found})"
        if len(loaded) == 1:
            (state,) = loaded
            role = "agent" if state.name == "k3s-agent.service" else "server"
            return state.name, (f"unit auto: {state.name} is loaded ({state.active_state}): "
                                f"a K3s {role} with embedded Flannel")
        active = [s for s in loaded if s.active_state == "active"]
        if len(active) == 1:
            (state,) = active
            return state.name, (f"unit auto: both K3s units are loaded, {state.name} is the "
                                f"active one")
        return None, ("unit auto is ambiguous: both k3s-agent.service and k3s.service are "
                      f"loaded and {'both' if active else 'neither'} active; set "
                      "[remediation.service] unit")

    async def _restart(self, bus: _Systemd, unit: str, started: float) -> RemedyOutcome:
        from dbus_fast import MessageType

        (owner,) = await bus.bus.call(DBUS, DBUS_PATH, DBUS, "GetNameOwner", "s", [SYSTEMD])
        (path,) = await bus.manager("GetUnit", "s", [unit])
        jobs: dict[str, str] = {}
        woken = asyncio.Event()

        def on_message(msg: Message) -> None:
            if msg.message_type is not MessageType.SIGNAL or msg.sender != owner:
                return
            if (msg.interface == MANAGER_IFACE and msg.member == "JobRemoved"
                    and msg.path == MANAGER_PATH and len(msg.body) == 4):
                jobs[str(msg.body[1])] = str(msg.body[3])
                woken.set()
            elif msg.interface == PROPERTIES and msg.path == path:
                woken.set()

        bus.bus.raw.add_message_handler(on_message)
        subscribed = False
        try:
            await bus.bus.add_match(f"type='signal',sender='{SYSTEMD}',path='{MANAGER_PATH}',"
                                    f"interface='{MANAGER_IFACE}',member='JobRemoved'")
            await bus.bus.add_match(f"type='signal',sender='{SYSTEMD}',path='{path}',"
                                    f"interface='{PROPERTIES}',member='PropertiesChanged'")
            await bus.manager("Subscribe")
            subscribed = True
            log.info("restarting %s over D-Bus (RestartUnit, mode replace)", unit,
                     extra={"remedy": self.mode, "unit": unit})
            (job,) = await bus.manager("RestartUnit", "ss", [unit, "replace"])
            job = str(job)
            try:
                async with compat.timeout(self._left(started)):
                    while job not in jobs:
                        await self._wake(woken, bus)
            except compat.TimeoutErrors:
                raise RemedyError(f"restart job {job} for {unit} did not finish within "
                                  f"{self.settings.timeout:g}s") from None
            result = jobs[job]
            if result != "done":
                state = await bus.unit_property(path, "ActiveState")
                raise RemedyError(f"restart job for {unit} ended {result!r} (unit is "
                                  f"{state}); see `journalctl -u {unit}`")
            state = await bus.unit_property(path, "ActiveState")
            try:
                async with compat.timeout(self._left(started)):
                    while state != "active":
                        await self._wake(woken, bus)
                        state = await bus.unit_property(path, "ActiveState")
            except compat.TimeoutErrors:
                raise RemedyError(f"{unit} was restarted but is not active "
                                  f"{self.settings.timeout:g}s later (ActiveState {state}); "
                                  f"see `journalctl -u {unit}`") from None
        finally:
            bus.bus.raw.remove_message_handler(on_message)
            if subscribed:
                with contextlib.suppress(BusError):
                    await bus.manager("Unsubscribe")
        took = time.monotonic() - started
        log.info("%s restarted and active again after %.1f s", unit, took,
                 extra={"remedy": self.mode, "unit": unit})
        return RemedyOutcome(target=unit, detail=f"job {job} done; {unit} active after {took:.1f}s")

    def _left(self, started: float) -> float:
        return max(0.0, self.settings.timeout - (time.monotonic() - started))

    @staticmethod
    async def _wake(woken: asyncio.Event, bus: _Systemd) -> None:
        """Until a signal arrives, or REREAD_INTERVAL passes; fail if the bus went away."""
        bus.bus.check()
        with contextlib.suppress(*compat.TimeoutErrors):
            async with compat.timeout(REREAD_INTERVAL):
                await woken.wait()
        woken.clear()

    def _error(self, err: BusError, unit: str) -> RemedyError:
        if err.kind == "denied":
            return RemedyError(
                f"systemd refused to restart {unit} for uid {os.geteuid()} ({err.name}): "
                f"install the polkit rule {POLKIT_RULE} (shipped as "
                "systemd/50-edgeheal-k3s-restart.rules; it allows user edgeheal exactly "
                "`restart` of k3s-agent.service and k3s.service) or fix the bus policy",
                config_problem=True)
        if err.kind == "absent":
            return RemedyError(f"systemd ({SYSTEMD}) is not on the D-Bus system bus at "
                               f"{self.bus_address}: {err}")
        if err.name == NO_SUCH_UNIT:
            return RemedyError(f"systemd has no unit {unit}: {err}", config_problem=True)
        return RemedyError(f"D-Bus call for {unit} failed: {err}")


# --- registration -------------------------------------------------------------------------

def _build(needs: Needs) -> K3sServiceRemedy:
    return K3sServiceRemedy(needs.config.remediation.service)


def _restart_bound(config: Config) -> float:
    return config.remediation.service.timeout


def _validate(config: Config) -> None:
    from edgeheal.config import ConfigError  # config loading calls this

    service, key = config.remediation.service, "remediation.service"
    if service.unit != "auto" and not K3S_UNIT_PATTERN.fullmatch(service.unit):
        raise ConfigError(f"{key}.unit",
                          f"expected \"auto\" or a K3s service unit such as "
                          f"\"k3s-agent.service\" or \"k3s.service\", got {service.unit!r}")
    if service.timeout <= 0:
        raise ConfigError(f"{key}.timeout", "must be greater than zero")


register(RemedyRegistration(
    mode=MODE, module="k3s_service", factory=_build, restart_bound=_restart_bound,
    settings="remediation.service", validate=_validate, also=("control",),
    doc="Restarts the `k3s`/`k3s-agent` unit over systemd's D-Bus API (embedded Flannel); "
        "the workload containers keep running."))
