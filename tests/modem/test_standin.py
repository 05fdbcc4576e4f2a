"""The stand-in ModemManager is held to ModemManager's API where the reader does not look:
the object manager lists modems only, its signals come from its own path, property changes
are signalled, and Simple.Connect refuses what ModemManager refuses."""

from __future__ import annotations

from typing import Any

from dbus_fast import BusType, Message, MessageType
from dbus_fast import Variant as V
from dbus_fast.aio import MessageBus

from edgeheal.boundaries.modemmanager.client import SIMPLE_IFACE
from edgeheal.boundaries.modemmanager.readings import (
    MODEM_3GPP_IFACE,
    OBJECT_MANAGER_IFACE,
    ROOT_PATH,
    SERVICE,
)
from edgeheal.lab.modemmanager import FakeModemManager
from edgeheal.lab.systemd_bus import SystemBus
from tests.support import until

DEVICE = "/sys/devices/platform/x/usb1/1-1"


async def client(bus: SystemBus) -> tuple[MessageBus, list[Message]]:
    conn = await MessageBus(bus_address=bus.address, bus_type=BusType.SYSTEM).connect()
    seen: list[Message] = []

    def keep(msg: Message) -> None:
        if msg.message_type is MessageType.SIGNAL:
            seen.append(msg)

    conn.add_message_handler(keep)
    for rule in (f"type='signal',sender='{SERVICE}',path='{ROOT_PATH}',"
                 f"interface='{OBJECT_MANAGER_IFACE}'",
                 f"type='signal',sender='{SERVICE}',interface='org.freedesktop.DBus.Properties',"
                 "member='PropertiesChanged'"):
        await conn.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                                interface="org.freedesktop.DBus", member="AddMatch",
                                signature="s", body=[rule]))
    return conn, seen


async def call(conn: MessageBus, path: str, iface: str, member: str, *, sig: str = "",
               body: list[Any] | None = None) -> Message:
    reply = await conn.call(Message(destination=SERVICE, path=path, interface=iface,
                                    member=member, signature=sig, body=body or []))
    assert reply is not None
    return reply


async def test_objects_signals_and_refusals_follow_modemmanager(modem_bus: SystemBus) -> None:
    async with FakeModemManager(modem_bus.address) as fake:
        conn, seen = await client(modem_bus)
        try:
            modem = fake.add_modem(DEVICE, "wwan0")
            await until(lambda: any(m.member == "InterfacesAdded" for m in seen))
            added = next(m for m in seen if m.member == "InterfacesAdded")
            assert added.path == ROOT_PATH
            assert added.body[0] == modem.path
            objects = (await call(conn, ROOT_PATH, OBJECT_MANAGER_IFACE,
                                  "GetManagedObjects")).body[0]
            assert list(objects) == [modem.path]  # bearers are not in the object manager
            fake.set_registration(modem, "roaming")
            await until(lambda: any(m.member == "PropertiesChanged"
                                    and m.body[0] == MODEM_3GPP_IFACE for m in seen))
            changed = next(m for m in seen if m.member == "PropertiesChanged"
                           and m.body[0] == MODEM_3GPP_IFACE)
            assert changed.path == modem.path
            assert changed.body[1]["RegistrationState"].value == 5  # roaming
            bad = await call(conn, modem.path, SIMPLE_IFACE, "Connect", sig="a{sv}",
                             body=[{"apn": V("s", "x"), "colour": V("s", "blue")}])
            assert bad.error_name == "org.freedesktop.ModemManager1.Error.Core.InvalidArgs"
            typed = await call(conn, modem.path, SIMPLE_IFACE, "Connect", sig="a{sv}",
                               body=[{"apn": V("u", 1)}])
            assert typed.error_name == "org.freedesktop.ModemManager1.Error.Core.InvalidArgs"
            gone = await call(conn, modem.path, SIMPLE_IFACE, "Disconnect", sig="o",
                              body=["/org/freedesktop/ModemManager1/Bearer/99"])
            assert gone.error_name == "org.freedesktop.ModemManager1.Error.Core.NotFound"
            assert fake.connects == []
            fake.remove_modem(modem)
            await until(lambda: any(m.member == "InterfacesRemoved" for m in seen))
            objects = (await call(conn, ROOT_PATH, OBJECT_MANAGER_IFACE,
                                  "GetManagedObjects")).body[0]
            assert objects == {}
        finally:
            conn.disconnect()
            await conn.wait_for_disconnect()
