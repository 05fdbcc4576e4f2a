"""The ``modem-reconnect`` rung: a new data session through ModemManager.

Why first: a stale data session (the network dropped the PDP context without telling the
modem) is the commonest stuck modem, and a new session is the gentlest cure — no link
flap for the kernel, no USB re-enumeration. It is what ``mmcli -m X --simple-disconnect``
then ``--simple-connect`` with the old settings does: ModemManager's ``Simple.Disconnect``
of the bearer, then ``Simple.Connect`` with *the bearer's own properties*
(:meth:`edgeheal.boundaries.modemmanager.client.ModemManager.reconnect`), so the APN and
credentials are the operator's, never ours (and never logged).

**Never fight the manager that owns the modem.** Where NetworkManager runs, it owns the
modem's connection (it drives ModemManager itself and re-activates its own profile when a
session drops); a reconnect behind its back races its state machine. So before acting this
rung asks NetworkManager on the same bus whether it manages the uplink's interface
(``GetDeviceByIpIface``, then the device's ``Managed`` property) and, if it does,
reconnects *through* it, as ``nmcli connection down`` then ``up`` would: the device's
``ActiveConnection``, its ``Connection`` (the settings profile: the operator's, with its
APN and secrets, never read here), ``DeactivateConnection(active)``, then
``ActivateConnection(profile, device, "/")`` and wait (bounded) until the new active
connection is ``activated`` (NMActiveConnectionState 2). NetworkManager then asks
ModemManager for the new session itself. If NetworkManager cannot answer, or manages the
device with no active connection (it is activating one already), the rung does not act.

Privilege: ModemManager's ``Simple.Connect``/``Disconnect`` need the polkit action
``org.freedesktop.ModemManager1.Device.Control``; NetworkManager's activate/deactivate
need ``org.freedesktop.NetworkManager.network-control`` (both granted to user ``edgeheal``
by ``49-edgeheal-uplink.rules``; docs/uplink-privileges.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from edgeheal.base.ifglob import matches
from edgeheal.boundaries.bus import PROPERTIES, BusError, connect, system_address
from edgeheal.remedies import (
    UPLINK,
    Availability,
    RemedyError,
    RemedyOutcome,
    RemedyRegistration,
    register,
)

if TYPE_CHECKING:
    from edgeheal.boundaries.modemmanager.readings import Bearer, Modem
    from edgeheal.config import Config

log = logging.getLogger(__name__)

MODE = "modem-reconnect"
NM = "org.freedesktop.NetworkManager"
NM_PATH = "/org/freedesktop/NetworkManager"
NM_DEVICE = "org.freedesktop.NetworkManager.Device"
NM_ACTIVE = "org.freedesktop.NetworkManager.Connection.Active"
NM_UNKNOWN_DEVICE = "org.freedesktop.NetworkManager.UnknownDevice"
NM_NOT_ACTIVE = "org.freedesktop.NetworkManager.ConnectionNotActive"
NM_CONTROL_ACTION = "org.freedesktop.NetworkManager.network-control"
AC_ACTIVATED, AC_DEACTIVATED = 2, 4
"""NMActiveConnectionState values."""
NM_POLL = 0.2
"""How often the activation's state is re-read while waiting."""


def pick(modems: tuple[Modem, ...], patterns: tuple[str, ...],
         ) -> tuple[Modem, Bearer] | None:
    """The uplink's modem and the bearer to renew: a connected bearer on an uplink
    interface first, else the only modem's first bearer."""
    for modem in modems:
        for bearer in modem.bearers:
            if bearer.connected and matches(bearer.interface, patterns):
                return modem, bearer
    if len(modems) == 1 and modems[0].bearers:
        return modems[0], modems[0].bearers[0]
    return None


async def networkmanager_device(address: str, interface: str) -> str:
    """NetworkManager's device object for ``interface`` when it runs and manages it, else
    ""; raise :class:`BusError` when it cannot tell."""
    async with connect(address) as bus:
        if not await bus.has_owner(NM):
            return ""
        try:
            (device,) = await bus.call(NM, NM_PATH, NM, "GetDeviceByIpIface", "s",
                                       [interface])
        except BusError as err:
            if err.name == NM_UNKNOWN_DEVICE:
                return ""
            raise
        (managed,) = await bus.call(NM, str(device), PROPERTIES, "Get", "ss",
                                    [NM_DEVICE, "Managed"])
        return str(device) if getattr(managed, "value", managed) else ""


async def networkmanager_owns(address: str, interface: str) -> str:
    """Why NetworkManager owns ``interface`` ("" when it does not run or does not manage
    it); raise :class:`BusError` when it cannot tell."""
    device = await networkmanager_device(address, interface)
    return f"NetworkManager manages {interface} ({device})" if device else ""


async def _property(bus: Any, path: str, interface: str, name: str) -> Any:
    (value,) = await bus.call(NM, path, PROPERTIES, "Get", "ss", [interface, name])
    return getattr(value, "value", value)


async def reactivate(address: str, device: str, timeout: float) -> str:
    """Deactivate the device's active connection and activate its profile again, as
    ``nmcli connection down/up``; return the new active connection once ``activated``.
    :class:`RemedyError` when there is nothing to re-activate or it does not come up."""
    async with connect(address) as bus:
        active = str(await _property(bus, device, NM_DEVICE, "ActiveConnection"))
        if active in ("", "/"):
            raise RemedyError(f"NetworkManager has no active connection on {device} (it is "
                              "activating one, or the profile is down): nothing to "
                              "re-activate")
        profile = str(await _property(bus, active, NM_ACTIVE, "Connection"))
        try:
            await bus.call(NM, NM_PATH, NM, "DeactivateConnection", "o", [active])
        except BusError as err:
            if err.name != NM_NOT_ACTIVE:  # already gone: activate all the same
                raise
        (new,) = await bus.call(NM, NM_PATH, NM, "ActivateConnection", "ooo",
                                [profile, device, "/"])
        new = str(new)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        state = 0
        while True:
            try:
                state = int(await _property(bus, new, NM_ACTIVE, "State"))
            except BusError as err:
                if err.kind != "gone" and "UnknownObject" not in err.name:
                    raise
                state = AC_DEACTIVATED  # NetworkManager dropped it: the activation failed
            if state in (AC_ACTIVATED, AC_DEACTIVATED) or loop.time() >= deadline:
                break
            await asyncio.sleep(NM_POLL)
        if state != AC_ACTIVATED:
            raise RemedyError(f"NetworkManager did not activate {profile} on {device} "
                              f"within {timeout:g}s (state {state})")
        return new


class ModemReconnect:
    mode = MODE

    def __init__(self, config: Config, *, manager: Any = None) -> None:
        self.patterns = config.uplink.interfaces
        self.address = config.uplink.dbus_address
        self._manager = manager
        self.timeout = 60.0
        """How long NetworkManager's re-activation may take (a modem's new session)."""

    def manager(self) -> Any:
        if self._manager is None:
            from edgeheal.boundaries.modemmanager.client import ModemManager  # dbus-fast, lazily

            self._manager = ModemManager(self.address or None)
        return self._manager

    async def _target(self) -> tuple[Modem, Bearer, str]:
        from edgeheal.boundaries.modemmanager.readings import ModemError

        try:
            modems = await self.manager().modems()
        except ModemError as err:
            raise RemedyError(f"ModemManager: {err}") from err
        chosen = pick(modems, self.patterns)
        if chosen is None:
            raise RemedyError("ModemManager knows no modem with a bearer on the uplink"
                              if not modems else
                              f"{len(modems)} modems and none on the uplink interfaces")
        modem, bearer = chosen
        try:
            device = await networkmanager_device(system_address(self.address),
                                                 bearer.interface or "")
        except BusError as err:
            raise RemedyError(f"cannot tell whether NetworkManager owns the modem: {err}") \
                from err
        return modem, bearer, device

    async def probe(self) -> Availability:
        try:
            modem, bearer, device = await self._target()
        except RemedyError as err:
            return Availability(False, str(err))
        if device:
            return Availability(True, f"modem {modem.path} ({bearer.interface}): "
                                f"NetworkManager manages it ({device}): re-activates its "
                                "connection through NetworkManager")
        return Availability(True, f"modem {modem.path}, bearer {bearer.path} "
                            f"({bearer.interface or 'no interface'}) via ModemManager")

    async def restart(self) -> RemedyOutcome:
        from edgeheal.boundaries.modemmanager.readings import ModemError

        modem, bearer, device = await self._target()
        if device:
            try:
                active = await reactivate(system_address(self.address), device,
                                          self.timeout)
            except BusError as err:
                denied = err.kind == "denied" or err.name.endswith(".PermissionDenied")
                raise RemedyError(
                    f"NetworkManager refused to re-activate the connection on {device}: "
                    f"{err}" + (f"; allow polkit action {NM_CONTROL_ACTION} to this user "
                                "(49-edgeheal-uplink.rules)" if denied else ""),
                    config_problem=denied) from err
            log.info("modem %s reconnected through NetworkManager: %s", modem.path, active,
                     extra={"modem": modem.path})
            return RemedyOutcome(target=f"{device} via NetworkManager",
                                 detail=f"active connection {active}")
        try:
            await self.manager().reconnect(modem, bearer)
        except ModemError as err:
            raise RemedyError(f"ModemManager reconnect failed: {err}") from err
        return RemedyOutcome(target=f"{modem.path} bearer {bearer.path}")

    async def close(self) -> None:
        if self._manager is not None:
            await self._manager.close()


def _unavailable(config: Config) -> str:
    if not config.uplink.interfaces:
        return "no [uplink] interfaces"
    if not config.uplink.modem_manager:
        return "uplink.modem_manager is false"
    return ""


register(RemedyRegistration(
    mode=MODE, module="modem_reconnect", ladder=UPLINK,
    factory=lambda needs: ModemReconnect(needs.config),
    restart_bound=lambda config: 60.0, unavailable=_unavailable,
    settings="remediation.uplink",
    doc="Uplink rung 1: a new data session (ModemManager `Simple.Disconnect` then "
        "`Simple.Connect` with the bearer's own properties; where NetworkManager manages "
        "the modem, its connection deactivated and activated again through it)."))
