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
``unix:path=/run/dbus/system_bus_socket``; tests pass their own address). One connection
per probe or restart: remedies are rare, and a fresh connection survives a restarted
dbus-daemon. dbus-fast is imported only here, only when used.

Registered (at the bottom) as mode ``k3s-service``: it owns the ``[remediation.service]``
rules (only a K3s unit, :data:`K3S_UNIT_PATTERN`), and one restart may take
``[remediation.service] timeout``.
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

from edgeheal.remedies import (
    Availability,
    Needs,
    Outcome,
    RemedyError,
    RemedyRegistration,
    register,
)

if TYPE_CHECKING:
    from dbus_fast import Message
    from dbus_fast.aio import MessageBus

    from edgeheal.config import Config, ServiceSettings

log = logging.getLogger(__name__)

DEFAULT_BUS_ADDRESS = "unix:path=/run/dbus/system_bus_socket"
BUS_ENV = "DBUS_SYSTEM_BUS_ADDRESS"
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
PROPERTIES_IFACE = "org.freedesktop.DBus.Properties"
DBUS = "org.freedesktop.DBus"

CALL_TIMEOUT = 10.0
"""Seconds one D-Bus call may take (systemd answers in milliseconds unless it is stuck)."""
REREAD_INTERVAL = 1.0
"""While waiting, re-read state this often even without a signal (a lost signal costs 1 s)."""

_DENIED = frozenset({
    "org.freedesktop.DBus.Error.AccessDenied",
    "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired",
})
_NOT_THERE = frozenset({
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
})
NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"


class BusError(Exception):
    """A D-Bus call failed: ``name`` is the D-Bus error name (or a local one such as
    ``timeout``/``disconnected``), the message says which call."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


@dataclass(frozen=True, slots=True)
class UnitState:
    name: str
    path: str
    load_state: str
    active_state: str


class _Bus:
    """One connection to the system bus and the few calls the remedy makes."""

    def __init__(self, bus: MessageBus, address: str) -> None:
        self.bus, self.address = bus, address

    async def call(self, destination: str, path: str, interface: str, member: str, *,
                   signature: str = "", body: list[Any] | None = None) -> list[Any]:
        from dbus_fast import DBusFastError, Message, MessageType  # noqa: PLC0415

        msg = Message(destination=destination, path=path, interface=interface, member=member,
                      signature=signature, body=body or [])
        what = f"{interface.rsplit('.', 1)[-1]}.{member}"
        if not self.bus.connected:  # sending on a dead connection only leaves stray errors
            raise BusError("disconnected", f"{what}: lost the bus at {self.address}")
        try:
            reply = await asyncio.wait_for(self.bus.call(msg), CALL_TIMEOUT)
        except TimeoutError as err:
            raise BusError("timeout", f"{what}: no answer within {CALL_TIMEOUT:g}s") from err
        except (OSError, EOFError, DBusFastError) as err:
            raise BusError("disconnected", f"{what}: lost the bus at {self.address}: "
                           f"{err or type(err).__name__}") from err
        if reply is None:
            raise BusError("disconnected", f"{what}: lost the bus at {self.address}")
        if reply.message_type is MessageType.ERROR:
            text = str(reply.body[0]) if reply.body else ""
            raise BusError(reply.error_name or "unknown", f"{what}: {reply.error_name}: "
                           f"{_short(text)}")
        return list(reply.body)

    async def systemd(self, member: str, signature: str = "",
                      body: list[Any] | None = None) -> list[Any]:
        return await self.call(SYSTEMD, MANAGER_PATH, MANAGER_IFACE, member,
                               signature=signature, body=body)

    async def unit_property(self, path: str, name: str) -> str:
        (variant,) = await self.call(SYSTEMD, path, PROPERTIES_IFACE, "Get", signature="ss",
                                     body=[UNIT_IFACE, name])
        return str(variant.value)

    async def add_match(self, rule: str) -> None:
        await self.call(DBUS, "/org/freedesktop/DBus", DBUS, "AddMatch", signature="s",
                        body=[rule])


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class K3sServiceRemedy:
    """Restarts the K3s unit over systemd's D-Bus API (see the module docstring)."""

    mode = MODE

    def __init__(self, settings: ServiceSettings, *, bus_address: str | None = None) -> None:
        self.settings = settings
        self.bus_address = bus_address or os.environ.get(BUS_ENV) or DEFAULT_BUS_ADDRESS

    # --- the Remedy protocol ------------------------------------------------------------

    async def probe(self) -> Availability:
        try:
            async with self._connect() as bus:
                unit, why = await self._resolve(bus)
        except RemedyError as err:
            return Availability(False, str(err))
        return Availability(unit is not None, why)

    async def restart(self) -> Outcome:
        started = time.monotonic()
        async with self._connect() as bus:
            unit, why = await self._resolve(bus)
            if unit is None:
                raise RemedyError(f"cannot restart K3s: {why}", config_problem=True)
            try:
                return await self._restart(bus, unit, started)
            except BusError as err:
                raise self._error(err, unit) from err

    # --- steps ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[_Bus]:
        try:
            from dbus_fast import BusType, DBusFastError  # noqa: PLC0415
            from dbus_fast.aio import MessageBus  # noqa: PLC0415
        except ImportError as err:
            raise RemedyError("the k3s-service remedy needs dbus-fast, which is not "
                              "installed (install edgeheal[dbus])", config_problem=True) from err

        where = f"the D-Bus system bus at {self.bus_address}"
        try:
            raw = MessageBus(bus_address=self.bus_address, bus_type=BusType.SYSTEM,
                             auth_timeout=CALL_TIMEOUT)
        except (DBusFastError, ValueError) as err:
            raise RemedyError(f"not a usable D-Bus address: {self.bus_address}: {err}",
                              config_problem=True) from err
        try:
            await asyncio.wait_for(raw.connect(), CALL_TIMEOUT)
        except (TimeoutError, OSError, DBusFastError, ValueError) as err:
            with contextlib.suppress(Exception):
                raw.disconnect()
            if isinstance(err, TimeoutError):
                raise RemedyError(f"{where} did not answer within {CALL_TIMEOUT:g}s") from err
            raise RemedyError(f"cannot connect to {where}: {err}") from err
        bus = _Bus(raw, self.bus_address)
        try:
            yield bus
        finally:
            with contextlib.suppress(Exception):
                raw.disconnect()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    raw.wait_for_disconnect(), 2.0)  # type: ignore[no-untyped-call]

    async def _unit_state(self, bus: _Bus, name: str) -> UnitState:
        try:
            (path,) = await bus.systemd("GetUnit", "s", [name])
        except BusError as err:
            if err.name != NO_SUCH_UNIT:
                raise
            (path,) = await bus.systemd("LoadUnit", "s", [name])
        return UnitState(name, str(path), await bus.unit_property(path, "LoadState"),
                         await bus.unit_property(path, "ActiveState"))

    async def _resolve(self, bus: _Bus) -> tuple[str | None, str]:
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

    async def _restart(self, bus: _Bus, unit: str, started: float) -> Outcome:
        from dbus_fast import MessageType  # noqa: PLC0415

        (owner,) = await bus.call(DBUS, "/org/freedesktop/DBus", DBUS, "GetNameOwner",
                                  signature="s", body=[SYSTEMD])
        (path,) = await bus.systemd("GetUnit", "s", [unit])
        jobs: dict[str, str] = {}
        woken = asyncio.Event()

        def on_message(msg: Message) -> None:
            if msg.message_type is not MessageType.SIGNAL or msg.sender != owner:
                return
            if (msg.interface == MANAGER_IFACE and msg.member == "JobRemoved"
                    and msg.path == MANAGER_PATH and len(msg.body) == 4):
                jobs[str(msg.body[1])] = str(msg.body[3])
                woken.set()
            elif msg.interface == PROPERTIES_IFACE and msg.path == path:
                woken.set()

        bus.bus.add_message_handler(on_message)
        subscribed = False
        try:
            await bus.add_match(f"type='signal',sender='{SYSTEMD}',path='{MANAGER_PATH}',"
                                f"interface='{MANAGER_IFACE}',member='JobRemoved'")
            await bus.add_match(f"type='signal',sender='{SYSTEMD}',path='{path}',"
                                f"interface='{PROPERTIES_IFACE}',member='PropertiesChanged'")
            await bus.systemd("Subscribe")
            subscribed = True
            log.info("restarting %s over D-Bus (RestartUnit, mode replace)", unit,
                     extra={"remedy": self.mode, "unit": unit})
            (job,) = await bus.systemd("RestartUnit", "ss", [unit, "replace"])
            job = str(job)
            try:
                async with asyncio.timeout(self._left(started)):
                    while job not in jobs:
                        await self._wake(woken, bus)
            except TimeoutError:
                raise RemedyError(f"restart job {job} for {unit} did not finish within "
                                  f"{self.settings.timeout:g}s") from None
            result = jobs[job]
            if result != "done":
                state = await bus.unit_property(path, "ActiveState")
                raise RemedyError(f"restart job for {unit} ended {result!r} (unit is "
                                  f"{state}); see `journalctl -u {unit}`")
            state = await bus.unit_property(path, "ActiveState")
            try:
                async with asyncio.timeout(self._left(started)):
                    while state != "active":
                        await self._wake(woken, bus)
                        state = await bus.unit_property(path, "ActiveState")
            except TimeoutError:
                raise RemedyError(f"{unit} was restarted but is not active "
                                  f"{self.settings.timeout:g}s later (ActiveState {state}); "
                                  f"see `journalctl -u {unit}`") from None
        finally:
            bus.bus.remove_message_handler(on_message)
            if subscribed:
                with contextlib.suppress(BusError):
                    await bus.systemd("Unsubscribe")
        took = time.monotonic() - started
        log.info("%s restarted and active again after %.1f s", unit, took,
                 extra={"remedy": self.mode, "unit": unit})
        return Outcome(target=unit, detail=f"job {job} done; {unit} active after {took:.1f}s")

    def _left(self, started: float) -> float:
        return max(0.0, self.settings.timeout - (time.monotonic() - started))

    @staticmethod
    async def _wake(woken: asyncio.Event, bus: _Bus) -> None:
        """Until a signal arrives, or REREAD_INTERVAL passes; fail if the bus went away."""
        if not bus.bus.connected:
            raise BusError("disconnected", f"lost the bus at {bus.address}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), REREAD_INTERVAL)
        woken.clear()

    def _error(self, err: BusError, unit: str) -> RemedyError:
        if err.name in _DENIED:
            return RemedyError(
                f"systemd refused to restart {unit} for uid {os.geteuid()} ({err.name}): "
                f"install the polkit rule {POLKIT_RULE} (shipped as "
                "systemd/50-edgeheal-k3s-restart.rules; it allows user edgeheal exactly "
                "`restart` of k3s-agent.service and k3s.service) or fix the bus policy",
                config_problem=True)
        if err.name in _NOT_THERE:
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
    from edgeheal.config import ConfigError  # noqa: PLC0415 - config loading calls this

    service, key = config.remediation.service, "remediation.service"
    if service.unit != "auto" and not K3S_UNIT_PATTERN.fullmatch(service.unit):
        raise ConfigError(f"{key}.unit",
                          f"expected \"auto\" or a K3s service unit such as "
                          f"\"k3s-agent.service\" or \"k3s.service\", got {service.unit!r}")
    if service.timeout <= 0:
        raise ConfigError(f"{key}.timeout", "must be greater than zero")


register(RemedyRegistration(
    mode=MODE, module="k3s_service", factory=_build, restart_bound=_restart_bound,
    settings="remediation.service", validate=_validate,
    doc="Restarts the `k3s`/`k3s-agent` unit over systemd's D-Bus API (embedded Flannel); "
        "the workload containers keep running."))
