"""The stand-in ModemManager's SIM slots: ``SimSlots``, ``PrimarySimSlot`` and
``SetPrimarySimSlot(u)``, as ModemManager 1.16+ has them.

What ModemManager does (``src/mm-iface-modem.c`` at linux-mobile-broadband/ModemManager
9a2d586, and ``introspection/org.freedesktop.ModemManager1.Modem.xml``):
``handle_set_primary_sim_slot`` asks polkit for ``Device.Control``
(``MM_AUTHORIZATION_DEVICE_CONTROL``); ``handle_set_primary_sim_slot_auth_ready`` answers
``Core.Unsupported`` "Operation not supported" for a modem without the switch,
``Core.InvalidArgs`` "Requested SIM slot number is out of bounds" for a slot past
``SimSlots``' length, ``Core.WrongState`` "SIM slot switch operation already ongoing." while
one is; ``set_primary_sim_slot_ready`` treats the slot already primary (the plugin's
``Core.Exists``) as success without a re-probe, and otherwise completes the call and runs
``iface_modem_process_sim_event_internal``: the modem is disabled and set invalid, so its
object goes away and the device is re-probed into a new modem object (a new path; the
property ``PrimarySimSlot`` is "reloaded automatically during the reprobe"), disabled.
``SimSlots`` lists one SIM object path per slot ("/" for an empty one).

The lab's ``slot_denied`` gives each slot's SIM the network's answer: a reject cause the
new modem's registrations get (``dead-sim``: slot 1 refused, slot 2 fine).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from dbus_fast import DBusError

if TYPE_CHECKING:
    from edgeheal.lab.modemmanager import FakeModem, FakeModemManager

log = logging.getLogger(__name__)

SIM_PREFIX = "/org/freedesktop/ModemManager1/SIM/"
ERR = "org.freedesktop.ModemManager1.Error."


def sim_paths(modem: FakeModem) -> list[str]:
    """``SimSlots``: one SIM object per slot (the stand-in exports no SIM objects: the
    agent reads only how many slots there are and which is primary)."""
    return [f"{SIM_PREFIX}{modem.index * 10 + i}" for i in range(1, modem.slots + 1)]


async def set_primary_sim_slot(fake: FakeModemManager, modem: FakeModem, slot: int) -> None:
    """``Modem.SetPrimarySimSlot``: see the module docstring."""
    fake._authorize("SetPrimarySimSlot", modem)
    if not modem.slots:
        raise DBusError(ERR + "Core.Unsupported", "Operation not supported")
    if slot > modem.slots:
        raise DBusError(ERR + "Core.InvalidArgs", "Requested SIM slot number is out of bounds")
    if modem.switching:
        raise DBusError(ERR + "Core.WrongState", "SIM slot switch operation already ongoing.")
    if slot == modem.primary_slot:
        return  # the plugin's EXISTS: success, no re-probe
    modem.switching = True
    task = asyncio.create_task(_reprobe(fake, modem, slot), name="lab.mm.reprobe")
    fake._tasks.add(task)
    task.add_done_callback(fake._tasks.discard)


async def _reprobe(fake: FakeModemManager, modem: FakeModem, slot: int) -> None:
    """The SIM event: disable, drop the object, re-probe into a new one with ``slot``."""
    from edgeheal.lab.modemmanager import FakeModem

    await asyncio.sleep(0)  # after the method's reply
    fake.set_state(modem, "disabling")
    for bearer in modem.bearers:
        if bearer.connected:
            fake.set_bearer(bearer, False)
    fake.set_registration(modem, "idle")
    fake.set_state(modem, "disabled")
    fake.remove_modem(modem)
    await asyncio.sleep(fake.reprobe_delay)
    index = max([m.index for m in fake.modems] + [modem.index]) + 1
    new = FakeModem(index=index, device=modem.device, interface=modem.interface,
                    state="disabled", registration="idle", signal=modem.signal,
                    has_3gpp=modem.has_3gpp, slots=modem.slots, primary_slot=slot,
                    slot_denied=modem.slot_denied, denied=modem.slot_denied.get(slot, 0))
    fake.add_probed(new)
    log.info("stand-in ModemManager: %s re-probed as %s, SIM slot %d primary", modem.path,
             new.path, slot)
