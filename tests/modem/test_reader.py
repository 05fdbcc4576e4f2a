"""edgeheal.boundaries.modemmanager against the stand-in ModemManager on a real dbus-daemon: what
is read, the reconnect, the errors (absent, denied, malformed, timeout), and no secret anywhere."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from dbus_fast import BusType, Message, MessageType, RequestNameReply
from dbus_fast import Variant as V
from dbus_fast.aio import MessageBus

from edgeheal.boundaries.modemmanager.client import ModemManager
from edgeheal.boundaries.modemmanager.readings import (
    MAX_MODEMS,
    OBJECT_MANAGER_IFACE,
    ROOT_PATH,
    SERVICE,
    ModemError,
)
from edgeheal.lab.modemmanager import FakeModemManager
from edgeheal.lab.systemd_bus import SystemBus

DEVICE = "/sys/devices/pci0000:00/0000:00:14.0/usb1/1-1"
SECRET = "s3cret-apn-password"


@contextlib.asynccontextmanager
async def reader(bus: SystemBus, **kw: Any) -> AsyncIterator[ModemManager]:
    mm = ModemManager(bus.address, **kw)
    try:
        yield mm
    finally:
        await mm.close()


async def test_a_registered_modem_with_a_connected_bearer_reads_as_modemmanager_says(
        modem_bus: SystemBus) -> None:
    fake = FakeModemManager(modem_bus.address)
    fake.add_modem(DEVICE, "wwan0", apn="iot.example", user="edge", password=SECRET)
    async with fake, reader(modem_bus) as mm:
        (modem,) = await mm.modems()
        assert modem.path == "/org/freedesktop/ModemManager1/Modem/0"
        assert (modem.state, modem.registration) == ("connected", "home")
        assert (modem.signal_quality, modem.signal_recent) == (75, True)
        assert modem.device == DEVICE
        assert ("wwan0", 2) in modem.ports
        (bearer,) = modem.bearers
        assert bearer.path == "/org/freedesktop/ModemManager1/Bearer/0"
        assert (bearer.connected, bearer.interface) == (True, "wwan0")
        assert bearer.properties["apn"].value == "iot.example"
        assert SECRET not in repr(modem)
        assert SECRET not in str(modem)


async def test_state_changes_are_read_on_the_next_call(modem_bus: SystemBus) -> None:
    fake = FakeModemManager(modem_bus.address)
    modem = fake.add_modem(DEVICE, "wwan0")
    async with fake, reader(modem_bus) as mm:
        fake.lose_coverage(modem)
        (seen,) = await mm.modems()
        assert (seen.state, seen.registration, seen.signal_quality) == ("searching",
                                                                        "searching", 0)
        assert [b.connected for b in seen.bearers] == [False]
        assert seen.bearers[0].interface == ""


async def test_failure_lock_and_rejection_read_as_modemmanager_says(
        modem_bus: SystemBus) -> None:
    fake = FakeModemManager(modem_bus.address)
    modem = fake.add_modem(DEVICE, "wwan0")
    async with fake, reader(modem_bus) as mm:
        (healthy,) = await mm.modems()
        assert (healthy.failed_reason, healthy.unlock_required, healthy.reject_cause) == (
            "none", "none", 0)
        fake.deny_registration(modem, 33)
        (denied,) = await mm.modems()
        assert (denied.state, denied.registration, denied.reject_cause) == (
            "enabled", "denied", 33)
        assert denied.reject_name == "requested-service-option-not-subscribed"
        assert [b.connected for b in denied.bearers] == [False]
        fake.lock(modem, "sim-puk")
        (locked,) = await mm.modems()
        assert (locked.state, locked.unlock_required) == ("locked", "sim-puk")
        fake.fail(modem, "sim-missing")
        (failed,) = await mm.modems()
        assert (failed.state, failed.failed_reason) == ("failed", "sim-missing")


async def test_enable_off_and_on_goes_through_modemmanagers_states(
        modem_bus: SystemBus) -> None:
    fake = FakeModemManager(modem_bus.address, connect_delay=0.05)
    modem = fake.add_modem(DEVICE, "wwan0")
    async with fake, reader(modem_bus) as mm:
        (seen,) = await mm.modems()
        await mm.enable(seen, False)
        (off,) = await mm.modems()
        assert (off.state, off.registration) == ("disabled", "idle")
        assert [b.connected for b in off.bearers] == [False]
        await mm.enable(off, True)
        (on,) = await mm.modems()
        assert (on.state, on.registration) == ("registered", "home")
        assert [b.connected for b in on.bearers] == [False]  # MM never reconnects by itself
        fake.fail(modem, "unknown")
        with pytest.raises(ModemError, match="WrongState"):
            await mm.enable(on, True)
    assert [c[0] for c in fake.calls] == ["Disable", "Enable", "Enable"]


async def test_a_modemmanager_without_the_newer_properties_reads_them_as_none(
        modem_bus: SystemBus) -> None:
    gpp = {"RegistrationState": V("u", 3)}  # denied, and no NetworkRejection (MM < 1.24)
    objects = {"/org/freedesktop/ModemManager1/Modem/0": {
        **modem_object(), "org.freedesktop.ModemManager1.Modem.Modem3gpp": gpp}}
    async with raw_service(modem_bus, objects), reader(modem_bus) as mm:
        (modem,) = await mm.modems()
    assert (modem.registration, modem.reject_cause, modem.reject_name) == ("denied", 0, "")
    assert (modem.failed_reason, modem.unlock_required) == ("none", "none")


async def test_reconnect_disconnects_then_connects_with_the_bearers_own_properties(
        modem_bus: SystemBus) -> None:
    healed: list[str] = []
    fake = FakeModemManager(modem_bus.address, on_connect=lambda m: healed.append(m.path))
    fake.add_modem(DEVICE, "wwan0", apn="iot.example", user="edge", password=SECRET,
                   **{"allow-roaming": True})
    async with fake, reader(modem_bus) as mm:
        (modem,) = await mm.modems()
        await mm.reconnect(modem, modem.bearers[0])
        assert fake.calls == [("Disconnect", modem.path), ("Connect", modem.path)]
        assert fake.connects == [{"apn": "iot.example", "ip-type": 1, "user": "edge",
                                  "password": SECRET, "allow-roaming": True}]
        assert healed == [modem.path]
        (after,) = await mm.modems()
        assert after.state == "connected"
        assert [b.path for b in after.bearers] == [modem.bearers[0].path]  # reused


async def test_polkit_refusing_device_control_is_a_denied_error_naming_the_action(
        modem_bus: SystemBus) -> None:
    fake = FakeModemManager(modem_bus.address, deny_control=True)
    fake.add_modem(DEVICE, "wwan0", password=SECRET)
    async with fake, reader(modem_bus) as mm:
        (modem,) = await mm.modems()
        with pytest.raises(ModemError) as caught:
            await mm.reconnect(modem, modem.bearers[0])
        assert caught.value.reason == "denied"
        assert "org.freedesktop.ModemManager1.Device.Control" in str(caught.value)
        assert SECRET not in str(caught.value)
        assert fake.connects == []


async def test_connect_without_registration_fails_and_says_so(modem_bus: SystemBus) -> None:
    fake = FakeModemManager(modem_bus.address)
    fake_modem = fake.add_modem(DEVICE, "wwan0", password=SECRET)
    async with fake, reader(modem_bus) as mm:
        (modem,) = await mm.modems()
        fake.lose_coverage(fake_modem)
        with pytest.raises(ModemError) as caught:
            await mm.reconnect(modem, modem.bearers[0])
        assert caught.value.reason == "failed"
        assert "NoNetwork" in str(caught.value)
        assert SECRET not in str(caught.value)


async def test_no_modemmanager_on_the_bus_is_absent(modem_bus: SystemBus) -> None:
    async with reader(modem_bus) as mm:
        with pytest.raises(ModemError) as caught:
            await mm.modems()
        assert caught.value.reason == "absent"
        assert "not running" in str(caught.value)


async def test_no_bus_at_all_is_absent() -> None:
    mm = ModemManager("unix:path=/nonexistent/edgeheal-test-bus")
    with pytest.raises(ModemError) as caught:
        await mm.modems()
    assert caught.value.reason == "absent"
    await mm.close()


async def test_the_reader_survives_modemmanager_restarting(modem_bus: SystemBus) -> None:
    async with reader(modem_bus) as mm:
        fake = FakeModemManager(modem_bus.address)
        fake.add_modem(DEVICE, "wwan0")
        async with fake:
            assert len(await mm.modems()) == 1
        with pytest.raises(ModemError):
            await mm.modems()
        async with FakeModemManager(modem_bus.address):
            assert await mm.modems() == ()


# --- replies outside the API: a raw service on the bus answers what we tell it -------------

@contextlib.asynccontextmanager
async def raw_service(bus: SystemBus, objects: Any, signature: str = "a{oa{sa{sv}}}",
                      delay: float = 0.0) -> AsyncIterator[None]:
    conn = await MessageBus(bus_address=bus.address, bus_type=BusType.SYSTEM).connect()

    def handler(msg: Message) -> Message | bool | None:
        if msg.message_type is not MessageType.METHOD_CALL or msg.path != ROOT_PATH \
                or msg.interface != OBJECT_MANAGER_IFACE:
            return None
        if delay:
            return True  # swallow it: never answer
        return Message.new_method_return(msg, signature, [objects])

    conn.add_message_handler(handler)
    try:
        assert await conn.request_name(SERVICE) is RequestNameReply.PRIMARY_OWNER
        yield
    finally:
        conn.disconnect()
        await conn.wait_for_disconnect()


def modem_object(**override: Any) -> dict[str, Any]:
    props = {"State": V("i", 8), "SignalQuality": V("(ub)", [60, True]),
             "Device": V("s", DEVICE), "Ports": V("a(su)", []), "Bearers": V("ao", [])}
    props.update(override)
    return {"org.freedesktop.ModemManager1.Modem": {k: v for k, v in props.items()
                                                    if v is not None}}


@pytest.mark.parametrize(("objects", "field"), [
    ({"/org/freedesktop/ModemManager1/Modem/0": modem_object(State=None)}, "State"),
    ({"/org/freedesktop/ModemManager1/Modem/0": modem_object(
        State=V("s", "connected"))}, "State"),
    ({"/org/freedesktop/ModemManager1/Modem/0": modem_object(
        SignalQuality=V("(ub)", [101, True]))}, "SignalQuality"),
    ({"/org/freedesktop/ModemManager1/Modem/0": modem_object(
        Device=V("s", "x" * 5000))}, "Device"),
    ({"/org/freedesktop/ModemManager1/Modem/0": modem_object(
        Ports=V("a(su)", [["p", 1]] * 100))}, "Ports"),
    ({"/org/freedesktop/ModemManager1/Modem/0": modem_object(
        Bearers=V("ao", ["/elsewhere/1"]))}, "Bearers"),
    ({"/elsewhere/Modem/0": modem_object()}, "modem path"),
    ({f"/org/freedesktop/ModemManager1/Modem/{i}": modem_object()
      for i in range(MAX_MODEMS + 1)}, "modems"),
])
async def test_a_malformed_reply_is_an_error_naming_the_field(
        modem_bus: SystemBus, objects: Any, field: str) -> None:
    async with raw_service(modem_bus, objects), reader(modem_bus) as mm:
        with pytest.raises(ModemError) as caught:
            await mm.modems()
        assert caught.value.reason == "malformed"
        assert field in str(caught.value)


async def test_a_reply_of_the_wrong_type_is_malformed(modem_bus: SystemBus) -> None:
    async with raw_service(modem_bus, "nope", signature="s"), reader(modem_bus) as mm:
        with pytest.raises(ModemError) as caught:
            await mm.modems()
        assert caught.value.reason == "malformed"


async def test_a_modemmanager_that_never_answers_times_out(modem_bus: SystemBus) -> None:
    async with raw_service(modem_bus, {}, delay=1.0), reader(modem_bus, timeout=0.5) as mm:
        started = asyncio.get_running_loop().time()
        with pytest.raises(ModemError) as caught:
            await mm.modems()
        assert caught.value.reason == "timeout"
        assert asyncio.get_running_loop().time() - started < 3.0
