"""The ``radio-cycle`` rung: the modem's radio off and on again through ModemManager.

Why: a network that refused the modem's registration (3GPP reject causes such as
``gprs-not-allowed`` or ``plmn-not-allowed``) does not let it try again for a long while
by itself (the modem backs off, often until power-cycled); users recover with a radio
off/on (``AT+CFUN=0`` then ``=1``) without a power cycle. A stuck data session that a new
session did not cure is often cured the same way: the modem detaches and attaches afresh.
It is gentler than a link bounce or a USB re-enumeration: the device and its ports stay,
only the radio goes off for a few seconds.

How: ``Modem.Enable(false)`` then ``Modem.Enable(true)`` on the uplink's modem — what
``mmcli -m X --disable`` / ``--enable`` do; ModemManager turns the radio off (low power)
when disabling and on again, re-registering, when enabling
(:meth:`edgeheal.boundaries.modemmanager.client.ModemManager.enable`). ``Enable(true)`` is sent
even when the disable failed, so a rung never leaves a radio off; a failure there is
said plainly (a person may be needed). Where NetworkManager owns the modem it re-activates
its connection once the modem is enabled and registered again; ModemManager itself does
not reconnect on its own.

For ``registration_denied`` the ladder allows this rung at most once an hour and nothing
heavier (:mod:`edgeheal.core.uplink_ladder`): a refusal the network repeats is the
operator's to fix.

Privilege: ``Modem.Enable`` is authorized by polkit action
``org.freedesktop.ModemManager1.Device.Control``, which ``49-edgeheal-uplink.rules``
already grants for ``modem-reconnect``: no new grant.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from edgeheal.remedies import (
    UPLINK,
    Availability,
    RemedyError,
    RemedyOutcome,
    RemedyRegistration,
    register,
)

if TYPE_CHECKING:
    from edgeheal.boundaries.modemmanager.readings import Modem
    from edgeheal.config import Config

MODE = "radio-cycle"
OFF_FOR = 2.0
"""Seconds the radio stays off: long enough for the network to see the detach."""


def pick(modems: tuple[Modem, ...], interfaces: tuple[str, ...]) -> Modem | None:
    """The modem on the uplink interfaces (a port or a bearer), else the only one."""
    from edgeheal.base.ifglob import matches

    for modem in modems:
        if any(matches(b.interface, interfaces) for b in modem.bearers if b.interface) or \
                any(matches(p, interfaces) for p, _ in modem.ports):
            return modem
    return modems[0] if len(modems) == 1 else None


class RadioCycle:
    mode = MODE

    def __init__(self, config: Config, *, manager: Any = None, off_for: float = OFF_FOR,
                 ) -> None:
        self.interfaces = config.uplink.interfaces
        self.address = config.uplink.dbus_address
        self._manager = manager
        self.off_for = off_for

    def manager(self) -> Any:
        if self._manager is None:
            from edgeheal.boundaries.modemmanager.client import ModemManager  # dbus-fast, lazily

            self._manager = ModemManager(self.address or None)
        return self._manager

    async def _target(self) -> Modem:
        from edgeheal.boundaries.modemmanager.readings import ModemError

        try:
            modems = await self.manager().modems()
        except ModemError as err:
            raise RemedyError(f"ModemManager: {err}",
                              config_problem=err.reason == "denied") from err
        modem = pick(modems, self.interfaces)
        if modem is None:
            raise RemedyError("ModemManager knows no modem" if not modems else
                              f"{len(modems)} modems and none on the uplink interfaces")
        return modem

    async def probe(self) -> Availability:
        try:
            modem = await self._target()
        except RemedyError as err:
            return Availability(False, str(err))
        return Availability(True, f"modem {modem.path} ({modem.state}) via ModemManager "
                            "Modem.Enable")

    async def restart(self) -> RemedyOutcome:
        from edgeheal.boundaries.modemmanager.readings import ModemError

        modem = await self._target()
        off_error: ModemError | None = None
        try:
            await self.manager().enable(modem, False)
        except ModemError as err:
            if err.reason == "denied":
                raise RemedyError(f"ModemManager refused to disable {modem.path}: {err}",
                                  config_problem=True) from err
            off_error = err  # enable anyway: never leave a radio off
        try:
            await asyncio.sleep(self.off_for if off_error is None else 0)
        finally:
            try:
                await self.manager().enable(modem, True)
            except ModemError as err:
                raise RemedyError(f"could not enable {modem.path} again: {err}; the radio "
                                  "may be off: `mmcli -m <modem> --enable`, a person may be "
                                  "needed", config_problem=err.reason == "denied") from err
        if off_error is not None:
            raise RemedyError(f"disabling {modem.path} failed ({off_error}); enabled again, "
                              "the radio was not cycled")
        return RemedyOutcome(target=modem.path, detail=f"radio off {self.off_for:g}s, on")

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
    mode=MODE, module="radio_cycle", ladder=UPLINK,
    factory=lambda needs: RadioCycle(needs.config),
    restart_bound=lambda config: 60.0 + OFF_FOR + 60.0, unavailable=_unavailable,
    settings="remediation.uplink",
    doc="Uplink rung for `registration_denied` (at most once an hour) and `stuck` after a "
        "new session: the radio off and on (ModemManager `Modem.Enable(false)` then "
        "`Enable(true)`)."))
