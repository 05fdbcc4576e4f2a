"""The ``modem-reconnect`` rung: a new data session through ModemManager.

Why first: a stale data session (the network dropped the PDP context without telling the
modem) is the commonest stuck modem, and a new session is the gentlest cure — no link
flap for the kernel, no USB re-enumeration. It is what ``mmcli -m X --simple-disconnect``
then ``--simple-connect`` with the old settings does: ModemManager's ``Simple.Disconnect``
of the bearer, then ``Simple.Connect`` with *the bearer's own properties*
(:meth:`edgeheal.boundaries.modemmanager.ModemManager.reconnect`), so the APN and credentials are
the operator's, never ours (and never logged).

**Never fight the manager that owns the modem.** Where NetworkManager runs, it owns the
modem's connection (it drives ModemManager itself and re-activates its own profile when a
session drops); a reconnect behind its back races its state machine. So before acting this
rung asks NetworkManager on the same bus whether it manages the uplink's interface
(``GetDeviceByIpIface``, then the device's ``Managed`` property) and, if it does, is not
usable: the ladder skips it with that reason and goes on to the next rung. (Driving the
reconnect through NetworkManager — deactivate and re-activate its connection — is not
built: see docs/remediation-uplink.md.) If it cannot tell (NetworkManager answers with an
error), it does not act either.

Privilege: ModemManager's ``Simple.Connect``/``Disconnect`` need the polkit action
``org.freedesktop.ModemManager1.Device.Control`` (docs/remediation-uplink.md, Privileges).
"""

from __future__ import annotations

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
    from edgeheal.boundaries.modemmanager import Bearer, Modem
    from edgeheal.config import Config

log = logging.getLogger(__name__)

MODE = "modem-reconnect"
NM = "org.freedesktop.NetworkManager"
NM_PATH = "/org/freedesktop/NetworkManager"
NM_DEVICE = "org.freedesktop.NetworkManager.Device"
NM_UNKNOWN_DEVICE = "org.freedesktop.NetworkManager.UnknownDevice"


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


async def networkmanager_owns(address: str, interface: str) -> str:
    """Why NetworkManager owns ``interface`` ("" when it does not run or does not manage
    it); raise :class:`BusError` when it cannot tell."""
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
        if getattr(managed, "value", managed):
            return (f"NetworkManager manages {interface} ({device}); reconnecting behind "
                    "its back would fight it")
        return ""


class ModemReconnect:
    mode = MODE

    def __init__(self, config: Config, *, manager: Any = None) -> None:
        self.patterns = config.uplink.interfaces
        self.address = config.uplink.dbus_address
        self._manager = manager

    def manager(self) -> Any:
        if self._manager is None:
            from edgeheal.boundaries.modemmanager import ModemManager  # dbus-fast, lazily

            self._manager = ModemManager(self.address or None)
        return self._manager

    async def _target(self) -> tuple[Modem, Bearer]:
        from edgeheal.boundaries.modemmanager import ModemError

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
            owner = await networkmanager_owns(system_address(self.address),
                                              bearer.interface or "")
        except BusError as err:
            raise RemedyError(f"cannot tell whether NetworkManager owns the modem: {err}") \
                from err
        if owner:
            raise RemedyError(owner)
        return modem, bearer

    async def probe(self) -> Availability:
        try:
            modem, bearer = await self._target()
        except RemedyError as err:
            return Availability(False, str(err))
        return Availability(True, f"modem {modem.path}, bearer {bearer.path} "
                            f"({bearer.interface or 'no interface'}) via ModemManager")

    async def restart(self) -> RemedyOutcome:
        from edgeheal.boundaries.modemmanager import ModemError

        modem, bearer = await self._target()
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
        "`Simple.Connect` with the bearer's own properties); not where NetworkManager "
        "owns the modem."))
