"""The uplink rungs against the real thing or a faithful stand-in: ``usb-reauthorize`` on a
sysfs-tree fixture (a real kernel re-enumeration is the QEMU test bed's), ``reboot`` against
a logind stand-in, ``modemmanager-restart`` against the systemd stand-in, ``modem-reconnect``
and ``radio-cycle`` against the stand-in ModemManager (and a NetworkManager stand-in), each
on a real dbus-daemon with a system-bus-like policy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edgeheal import remedies
from edgeheal import settings as validation
from edgeheal.config import Config, ConfigError, loads_generic
from edgeheal.lab.modemmanager import BUS_POLICY, FakeModemManager
from edgeheal.lab.netns import Sandbox
from edgeheal.lab.systemd_bus import Behaviour, FakeSystemd, start_system_bus
from edgeheal.remedies import RemedyError
from edgeheal.remedies.modem_reconnect import ModemReconnect
from edgeheal.remedies.modemmanager_restart import ModemManagerRestart
from edgeheal.remedies.radio_cycle import RadioCycle
from edgeheal.remedies.reboot import Reboot
from edgeheal.remedies.usb_reauthorize import UsbReauthorize
from tests.uplink.standins import DENY_REBOOT, LOGIND_POLICY, FakeLogind, FakeNetworkManager

SECRET = "s3cret-apn-pass"


def test_the_uplink_rungs_are_registered_on_their_own_ladder() -> None:
    uplink = [r.mode for r in remedies.registrations(remedies.UPLINK)]
    assert uplink == ["modem-reconnect", "radio-cycle", "link-bounce",
                      "modemmanager-restart", "usb-reauthorize", "reboot"]
    assert not set(uplink) & set(remedies.modes())  # Flannel's `auto` never sees them
    with pytest.raises(ConfigError, match=r"remediation\.mode"):
        validation.loads('[remediation]\nmode = "reboot"\n')


# --- usb-reauthorize on a sysfs tree ----------------------------------------------------

class Authorized:
    """A USB device's ``authorized`` attribute in a sysfs-tree fixture, recording writes."""

    def __init__(self, root: Path, name: str) -> None:
        real = root / "devices" / "pci0000:00" / "0000:00:14.0" / "usb1" / name
        real.mkdir(parents=True)
        (root / "bus" / "usb" / "devices").mkdir(parents=True, exist_ok=True)
        (root / "bus" / "usb" / "devices" / name).symlink_to(real)
        self.path = real / "authorized"
        self.path.write_text("1\n")
        self.real = real

    def value(self) -> str:
        return self.path.read_text().strip()


async def test_usb_reauthorize_writes_0_then_1_to_the_configured_device(
        tmp_path: Path) -> None:
    dev = Authorized(tmp_path, "1-1")
    config = loads_generic('[uplink]\ninterfaces = ["wwan0"]\n[remediation.uplink]\n'
                   'usb_device = "1-1"\n')
    rung = UsbReauthorize(config, sysfs=tmp_path, settle=0.2)
    assert (await rung.probe()).usable
    task = asyncio.create_task(rung.restart())
    await asyncio.sleep(0.1)
    assert dev.value() == "0"  # de-authorized while the drivers unbind
    outcome = await task
    assert dev.value() == "1"
    assert outcome.target == "usb 1-1"


async def test_usb_reauthorize_modem_follows_modemmanagers_device_path(
        tmp_path: Path) -> None:
    dev = Authorized(tmp_path, "2-1.4")

    class Manager:
        async def modems(self) -> tuple[object, ...]:
            import dataclasses

            from tests.uplink.test_check import modem

            return (dataclasses.replace(
                modem(), device="/sys/" + str(dev.real.relative_to(tmp_path))),)

    config = loads_generic('[uplink]\ninterfaces = ["wwan0"]\n[remediation.uplink]\n'
                   'usb_device = "modem"\n')
    rung = UsbReauthorize(config, sysfs=tmp_path, modem_manager=Manager(), settle=0.05)
    await rung.restart()
    assert dev.value() == "1"


@pytest.mark.parametrize(("name", "why"), [
    ("1-9", "no USB device '1-9': nothing at "), ("1-8", "no 'authorized'"),
    ("usb1", "not a USB device")])
async def test_usb_reauthorize_refuses_what_is_not_a_configured_usb_device(
        tmp_path: Path, name: str, why: str) -> None:
    hub = tmp_path / "bus" / "usb" / "devices" / "usb1"
    hub.mkdir(parents=True)
    (hub.parent / "1-8").mkdir()  # there, but no attribute to write
    (hub / "authorized").write_text("1\n")
    rung = UsbReauthorize(loads_generic(f'[remediation.uplink]\nusb_device = "{name}"\n')
                          if name != "usb1" else loads_generic("[remediation.uplink]\n"),
                          sysfs=tmp_path)
    rung.device = name
    availability = await rung.probe()
    assert not availability.usable
    assert why in availability.why
    with pytest.raises(RemedyError):
        await rung.restart()
    assert (hub / "authorized").read_text() == "1\n"  # the root hub was never touched


def test_usb_device_is_validated_and_off_by_default() -> None:
    assert loads_generic("").remediation.uplink.usb_device == ""
    with pytest.raises(ConfigError, match=r"remediation\.uplink\.usb_device"):
        validation.loads('[remediation.uplink]\nusb_device = "usb1"\n')
    with pytest.raises(ConfigError, match=r"remediation\.uplink\.usb_device"):
        validation.loads('[remediation.uplink]\nusb_device = "../../power"\n')


# --- reboot through a logind stand-in ---------------------------------------------------

async def test_reboot_calls_logind_reboot_non_interactively(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=LOGIND_POLICY)
    async with FakeLogind(bus.address) as logind:
        rung = Reboot(bus_address=bus.address)
        availability = await rung.probe()
        assert availability.usable, availability.why
        outcome = await rung.restart()
        assert outcome.target == "node"
        assert logind.reboots == [False]


async def test_reboot_denied_by_the_bus_is_a_config_problem(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=LOGIND_POLICY + DENY_REBOOT)
    async with FakeLogind(bus.address) as logind:
        with pytest.raises(RemedyError) as err:
            await Reboot(bus_address=bus.address).restart()
        assert err.value.config_problem
        assert "AccessDenied" in str(err.value)
        assert logind.reboots == []


async def test_reboot_is_not_usable_without_logind_or_when_it_says_no(
        sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=LOGIND_POLICY)
    assert not (await Reboot(bus_address=bus.address).probe()).usable
    async with FakeLogind(bus.address, can_reboot="na"):
        availability = await Reboot(bus_address=bus.address).probe()
        assert not availability.usable
        assert "na" in availability.why


# --- modem-reconnect through the stand-in ModemManager ----------------------------------

async def test_modem_reconnect_renews_the_session_with_the_bearers_own_settings(
        sandbox: Sandbox, caplog: pytest.LogCaptureFixture) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY + LOGIND_POLICY)
    mm = FakeModemManager(bus.address)
    mm.add_modem("/sys/devices/usb1/1-1", "wwan0", apn="iot.example", user="u",
                 password=SECRET)
    async with mm:
        config = loads_generic(f'[uplink]\ninterfaces = ["wwan*"]\n'
                               f'dbus_address = "{bus.address}"\n')
        rung = ModemReconnect(config)
        try:
            availability = await rung.probe()
            assert availability.usable, availability.why
            outcome = await rung.restart()
        finally:
            await rung.close()
        assert [c[0] for c in mm.calls] == ["Disconnect", "Connect"]
        assert mm.connects[-1]["apn"] == "iot.example"
        assert mm.connects[-1]["password"] == SECRET  # the operator's own settings
        assert "Modem/0" in outcome.target
        assert SECRET not in caplog.text + outcome.target + availability.why


async def test_modem_reconnect_goes_through_networkmanager_where_it_owns_the_modem(
        sandbox: Sandbox) -> None:
    """nmcli connection down/up, over D-Bus: the device's active connection deactivated,
    its profile activated again on the device, the rung back once NetworkManager says
    ``activated``; ModemManager is never called behind NetworkManager's back."""
    bus = start_system_bus(sandbox, policy=BUS_POLICY + LOGIND_POLICY)
    mm = FakeModemManager(bus.address)
    mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    activated: list[str] = []
    nm = FakeNetworkManager(bus.address, devices={"eth0": True, "wwan0": True},
                            on_activate=activated.append, activate_delay=0.2)
    async with mm, nm:
        config = loads_generic(f'[uplink]\ninterfaces = ["wwan0"]\n'
                               f'dbus_address = "{bus.address}"\n')
        rung = ModemReconnect(config)
        try:
            availability = await rung.probe()
            assert availability.usable, availability.why
            assert "through NetworkManager" in availability.why
            old = nm.by_iface["wwan0"].active
            outcome = await rung.restart()
        finally:
            await rung.close()
        assert mm.calls == []  # nothing behind NetworkManager's back
        profile = nm.by_iface["wwan0"].connection
        assert nm.calls == [("Deactivate", old), ("Activate", profile)]
        assert activated == ["wwan0"]  # returned only once activated
        new = nm.by_iface["wwan0"].active
        assert new != old
        assert nm.actives[new].state == 2
        assert "NetworkManager" in outcome.target
        assert nm.by_iface["eth0"].active != "/"  # the other device untouched


async def test_modem_reconnect_through_networkmanager_denied_is_a_config_problem(
        sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY + LOGIND_POLICY)
    mm = FakeModemManager(bus.address)
    mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    async with mm, FakeNetworkManager(bus.address, devices={"wwan0": True},
                                      deny_control=True):
        config = loads_generic(f'[uplink]\ninterfaces = ["wwan0"]\n'
                               f'dbus_address = "{bus.address}"\n')
        rung = ModemReconnect(config)
        try:
            with pytest.raises(RemedyError, match="network-control") as err:
                await rung.restart()
        finally:
            await rung.close()
        assert err.value.config_problem
        assert mm.calls == []


async def test_modem_reconnect_through_networkmanager_that_never_activates_fails(
        sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY + LOGIND_POLICY)
    mm = FakeModemManager(bus.address)
    mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    async with mm, FakeNetworkManager(bus.address, devices={"wwan0": True},
                                      activate_delay=30.0):
        config = loads_generic(f'[uplink]\ninterfaces = ["wwan0"]\n'
                               f'dbus_address = "{bus.address}"\n')
        rung = ModemReconnect(config)
        rung.timeout = 0.5
        try:
            with pytest.raises(RemedyError, match="did not activate"):
                await rung.restart()
        finally:
            await rung.close()


async def test_modem_reconnect_goes_ahead_when_networkmanager_leaves_the_modem_alone(
        sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY + LOGIND_POLICY)
    mm = FakeModemManager(bus.address)
    mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    async with mm, FakeNetworkManager(bus.address, devices={"eth0": True, "wwan0": False}):
        config = loads_generic(f'[uplink]\ninterfaces = ["wwan0"]\n'
                               f'dbus_address = "{bus.address}"\n')
        rung = ModemReconnect(config)
        try:
            assert (await rung.probe()).usable
            await rung.restart()
        finally:
            await rung.close()
        assert [c[0] for c in mm.calls] == ["Disconnect", "Connect"]


async def test_modem_reconnect_without_modemmanager_is_not_usable(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY)
    config = loads_generic(f'[uplink]\ninterfaces = ["wwan0"]\n'
                               f'dbus_address = "{bus.address}"\n')
    rung = ModemReconnect(config)
    try:
        availability = await rung.probe()
    finally:
        await rung.close()
    assert not availability.usable
    assert "ModemManager" in availability.why


# --- modemmanager-restart through the systemd stand-in ----------------------------------

MM_UNIT = "ModemManager.service"


def _mm_config(address: str, extra: str = "") -> Config:
    return loads_generic(f'[uplink]\ninterfaces = ["wwan0"]\ndbus_address = "{address}"\n'
                         f'[remediation.uplink]\nmodemmanager_timeout = "10s"\n{extra}')


async def test_modemmanager_restart_restarts_exactly_modemmanagers_unit(
        sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox)
    fake = FakeSystemd.with_units(bus.address, {MM_UNIT: "active",
                                                "k3s-agent.service": "active"})
    async with fake:
        rung = ModemManagerRestart(_mm_config(bus.address))
        availability = await rung.probe()
        assert availability.usable, availability.why
        outcome = await rung.restart()
    assert fake.restarts == [MM_UNIT]  # and never K3s
    assert outcome.target == MM_UNIT
    assert fake.units[MM_UNIT].active_state == "active"


async def test_modemmanager_restart_denied_names_the_uplink_rule(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox)
    fake = FakeSystemd.with_units(bus.address, {MM_UNIT: "active"},
                                  behaviour=Behaviour.POLKIT_DENIED)
    async with fake:
        rung = ModemManagerRestart(_mm_config(bus.address))
        with pytest.raises(RemedyError, match=r"49-edgeheal-uplink\.rules") as err:
            await rung.restart()
    assert err.value.config_problem
    assert fake.restarts == []


async def test_modemmanager_restart_is_not_usable_without_the_unit(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox)
    async with FakeSystemd.with_units(bus.address, {"k3s-agent.service": "active"}):
        availability = await ModemManagerRestart(
            _mm_config(bus.address)).probe()
    assert not availability.usable
    assert MM_UNIT in availability.why


def test_modemmanager_unit_must_be_modemmanagers() -> None:
    config = loads_generic('[remediation.uplink]\nmodemmanager_unit = "sshd.service"\n')
    with pytest.raises(ConfigError, match="modemmanager_unit"):
        validation.validate(config)
    validation.validate(loads_generic(""))  # the default is ModemManager.service


# --- radio-cycle through the stand-in ModemManager --------------------------------------

async def test_radio_cycle_disables_then_enables_the_uplinks_modem(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY)
    mm = FakeModemManager(bus.address, connect_delay=0.05)
    modem = mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    seen: list[str] = []
    async with mm:
        rung = RadioCycle(_mm_config(bus.address), off_for=0.1)
        try:
            assert (await rung.probe()).usable
            mm.deny_registration(modem, 7)  # gprs-not-allowed
            task = asyncio.create_task(rung.restart())
            while not task.done():
                seen.append(modem.state)
                await asyncio.sleep(0.01)
            outcome = task.result()
        finally:
            await rung.close()
    assert [c[0] for c in mm.calls] == ["Disable", "Enable"]
    assert "disabled" in seen
    assert outcome.target == modem.path
    assert (modem.state, modem.registration, modem.reject_cause) == ("enabled", "denied", 7)


async def test_radio_cycle_lifts_a_denial_the_network_no_longer_holds(
        sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY)
    mm = FakeModemManager(bus.address, connect_delay=0.05)
    modem = mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    async with mm:
        mm.deny_registration(modem, 11)
        config = _mm_config(bus.address)
        from edgeheal.boundaries.modemmanager.client import ModemManager

        reader = ModemManager(bus.address)
        try:
            (before,) = await reader.modems()
            assert (before.registration, before.reject_cause) == ("denied", 11)
            assert before.reject_name == "plmn-not-allowed"
            modem.denied = 0  # the operator fixed the subscription
            rung = RadioCycle(config, off_for=0.05, manager=reader)
            await rung.restart()
            (after,) = await reader.modems()
        finally:
            await reader.close()
    assert (after.state, after.registration, after.reject_cause) == ("registered", "home", 0)


async def test_radio_cycle_of_a_failed_modem_is_refused_and_says_so(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY)
    mm = FakeModemManager(bus.address)
    modem = mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    async with mm:
        mm.fail(modem, "unknown")
        rung = RadioCycle(_mm_config(bus.address), off_for=0.05)
        try:
            with pytest.raises(RemedyError, match=r"WrongState|failed state"):
                await rung.restart()
        finally:
            await rung.close()
    assert [c[0] for c in mm.calls] == ["Disable", "Enable"]  # enable tried all the same


async def test_radio_cycle_denied_by_polkit_is_a_config_problem(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY)
    mm = FakeModemManager(bus.address, deny_control=True)
    mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    async with mm:
        rung = RadioCycle(_mm_config(bus.address), off_for=0.05)
        try:
            with pytest.raises(RemedyError) as err:
                await rung.restart()
        finally:
            await rung.close()
    assert err.value.config_problem
    assert "Device.Control" in str(err.value)
