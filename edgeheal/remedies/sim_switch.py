"""The ``sim-switch`` rung: the modem's other SIM slot made primary through ModemManager.

Why: a SIM the network refuses (registration denied: an unpaid or barred subscription, a
``plmn-not-allowed`` reject cause) or an empty eSIM profile, a plan that registers but
carries nothing: no local reset cures those, a second SIM does. ModemManager's maintainer
points dual-SIM users at ``mmcli --set-primary-sim-slot`` (openwrt/packages PR#14425).
The ladder uses it for ``registration_denied`` after the one radio off/on, and for
``stuck`` after the local rungs, never as an episode's first rung
(:func:`edgeheal.core.uplink_ladder.episode_rungs`).

How: ``Modem.SetPrimarySimSlot(u)`` (ModemManager 1.16+;
:meth:`edgeheal.boundaries.modemmanager.client.ModemManager.set_primary_sim_slot`) with the
slot after the modem's current ``PrimarySimSlot`` in ``[remediation.uplink] sim_slots``
(wrapping: ``[1, 2]`` goes 1 -> 2 and, on a later episode, 2 -> 1). ModemManager then
disables the modem and re-probes it: the modem object goes away and a new one comes,
disabled, on the same physical device (``src/mm-iface-modem.c``,
``set_primary_sim_slot_ready`` -> ``iface_modem_process_sim_event_internal``). The rung
waits for that modem (same ``Modem.Device``, the new slot primary), bounded by
:data:`RETURN_TIMEOUT`, then connects it with the bearer settings the old modem had
(``Simple.Connect``, which enables and registers a disabled modem first): ModemManager
never connects by itself; where NetworkManager owns the modem it reconnects on its own as
well, and ModemManager serializes the two. Whether the new SIM carries traffic is the
ladder's verification (the uplink check and every direct-path target ok).

Opt-in: only where ``sim-switch`` is in ``rungs`` *and* ``sim_slots`` lists at least two
slots; not usable on a modem that reports fewer than two ``SimSlots``.

Privilege: ModemManager authorizes ``SetPrimarySimSlot`` with polkit action
``org.freedesktop.ModemManager1.Device.Control`` (``handle_set_primary_sim_slot``:
``MM_AUTHORIZATION_DEVICE_CONTROL``), which ``49-edgeheal-uplink.rules`` already grants for
``modem-reconnect`` and ``radio-cycle``: no new grant.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from edgeheal.remedies import (
    UPLINK,
    Availability,
    RemedyError,
    RemedyOutcome,
    RemedyRegistration,
    register,
)
from edgeheal.remedies.radio_cycle import pick

if TYPE_CHECKING:
    from edgeheal.boundaries.modemmanager.readings import Modem
    from edgeheal.config import Config

MODE = "sim-switch"
RETURN_TIMEOUT = 90.0
"""How long the re-probed modem may take to come back (reading a SIM takes seconds, some
modems reboot their baseband on a slot switch)."""
POLL = 1.0
MAX_SLOT = 8


def next_slot(order: tuple[int, ...], current: int, slots: int) -> int | None:
    """The slot to make primary: the one after ``current`` in ``order`` (wrapping), among
    the slots the modem has (1..``slots``); None when there is no other."""
    usable = [s for s in order if 1 <= s <= slots]
    if current in usable:
        i = usable.index(current)
        rest = usable[i + 1:] + usable[:i]
    else:
        rest = usable
    return next((s for s in rest if s != current), None)


class SimSwitch:
    mode = MODE

    def __init__(self, config: Config, *, manager: Any = None,
                 return_timeout: float = RETURN_TIMEOUT, poll: float = POLL) -> None:
        self.interfaces = config.uplink.interfaces
        self.address = config.uplink.dbus_address
        self.order = config.remediation.uplink.sim_slots
        self._manager = manager
        self.return_timeout = return_timeout
        self.poll = poll

    def manager(self) -> Any:
        if self._manager is None:
            from edgeheal.boundaries.modemmanager.client import ModemManager  # dbus-fast, lazily

            self._manager = ModemManager(self.address or None)
        return self._manager

    async def _modems(self) -> tuple[Modem, ...]:
        from edgeheal.boundaries.modemmanager.readings import ModemError

        try:
            modems: tuple[Modem, ...] = await self.manager().modems()
        except ModemError as err:
            raise RemedyError(f"ModemManager: {err}",
                              config_problem=err.reason == "denied") from err
        return modems

    async def _target(self) -> tuple[Modem, int]:
        modems = await self._modems()
        modem = pick(modems, self.interfaces)
        if modem is None:
            raise RemedyError("ModemManager knows no modem" if not modems else
                              f"{len(modems)} modems and none on the uplink interfaces")
        if modem.sim_slots < 2:
            raise RemedyError(f"modem {modem.path} reports {modem.sim_slots} SIM slots (a "
                              "multi-slot modem and ModemManager 1.16+ are needed)")
        slot = next_slot(self.order, modem.primary_sim_slot, modem.sim_slots)
        if slot is None:
            raise RemedyError(f"sim_slots {list(self.order)} names no other slot of the "
                              f"modem's {modem.sim_slots} (primary: "
                              f"{modem.primary_sim_slot})", config_problem=True)
        return modem, slot

    async def probe(self) -> Availability:
        try:
            modem, slot = await self._target()
        except RemedyError as err:
            return Availability(False, str(err))
        return Availability(True, f"modem {modem.path}: SIM slot {modem.primary_sim_slot} "
                            f"-> {slot} (ModemManager SetPrimarySimSlot)")

    async def restart(self) -> RemedyOutcome:
        from edgeheal.boundaries.modemmanager.readings import ModemError

        modem, slot = await self._target()
        settings = next((dict(b.properties) for b in modem.bearers if b.properties), None)
        try:
            await self.manager().set_primary_sim_slot(modem, slot)
        except ModemError as err:
            raise RemedyError(f"ModemManager refused SIM slot {slot} on {modem.path}: {err}",
                              config_problem=err.reason == "denied") from err
        back = await self._returned(modem, slot)
        if settings is None:
            return RemedyOutcome(target=back.path, detail=f"SIM slot {slot} primary (no "
                                 "bearer settings to connect with: its manager connects)")
        try:
            await self.manager().connect(back, settings)
        except ModemError as err:
            raise RemedyError(f"SIM slot {slot} is primary on {back.path}, but connecting "
                              f"failed: {err}", config_problem=err.reason == "denied") from err
        return RemedyOutcome(target=back.path, detail=f"SIM slot {modem.primary_sim_slot} "
                             f"-> {slot}, connected")

    async def _returned(self, old: Modem, slot: int) -> Modem:
        """The modem back from its re-probe: on the same device, ``slot`` primary."""
        deadline = time.monotonic() + self.return_timeout
        while True:
            try:
                modems = await self._modems()
            except RemedyError:
                modems = ()  # ModemManager busy re-probing: try again
            for modem in modems:
                if modem.device == old.device and modem.primary_sim_slot == slot:
                    return modem
            if time.monotonic() >= deadline:
                raise RemedyError(f"SIM slot {slot} was set on {old.path}, but the modem did "
                                  f"not come back within {self.return_timeout:g}s")
            await asyncio.sleep(self.poll)

    async def close(self) -> None:
        if self._manager is not None:
            await self._manager.close()


def _unavailable(config: Config) -> str:
    if not config.uplink.interfaces:
        return "no [uplink] interfaces"
    if not config.uplink.modem_manager:
        return "uplink.modem_manager is false"
    if not config.remediation.uplink.sim_slots:
        return "remediation.uplink.sim_slots is empty"
    return ""


def _validate(config: Config) -> None:
    from edgeheal.config import ConfigError

    order = config.remediation.uplink.sim_slots
    if not order:
        return
    if any(not 1 <= s <= MAX_SLOT for s in order):
        raise ConfigError("remediation.uplink.sim_slots",
                          f"expected slot numbers 1..{MAX_SLOT} (ModemManager's SimSlots "
                          f"index, 1-based), got {list(order)}")
    if len(set(order)) != len(order) or len(order) < 2:
        raise ConfigError("remediation.uplink.sim_slots",
                          f"expected at least two distinct slots such as [1, 2], got "
                          f"{list(order)}")


register(RemedyRegistration(
    mode=MODE, module="sim_switch", ladder=UPLINK,
    factory=lambda needs: SimSwitch(needs.config),
    restart_bound=lambda config: 60.0 + RETURN_TIMEOUT + 60.0, unavailable=_unavailable,
    settings="remediation.uplink", validate=_validate,
    doc="Uplink rung (opt-in, never an episode's first) for `registration_denied` after "
        "the radio and `stuck` before a reboot: the next SIM slot of `sim_slots` made "
        "primary (ModemManager `SetPrimarySimSlot`), the modem reconnected once back."))
