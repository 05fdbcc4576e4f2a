"""The uplink ladder's two opt-in rungs: ``driver-rebind`` on a sysfs-tree fixture (the
path resolution, and the refusal of every escape out of ``/sys/bus/usb``), and
``sim-switch`` against the stand-in ModemManager on a real dbus-daemon (the switch, the
re-probe, the reconnect; polkit's refusal; a modem without slots)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edgeheal import remedies
from edgeheal import settings as validation
from edgeheal.boundaries.modemmanager.client import ModemManager
from edgeheal.config import Config, ConfigError, loads_generic
from edgeheal.lab.modemmanager import BUS_POLICY, FakeModemManager
from edgeheal.lab.netns import Sandbox
from edgeheal.lab.systemd_bus import start_system_bus
from edgeheal.remedies import RemedyError
from edgeheal.remedies.driver_rebind import DriverRebind, resolve
from edgeheal.remedies.sim_switch import SimSwitch, next_slot


def test_the_opt_in_rungs_are_registered_and_not_in_the_default_rungs() -> None:
    uplink = [r.mode for r in remedies.registrations(remedies.UPLINK)]
    assert uplink[-2:] == ["driver-rebind", "sim-switch"]
    default = loads_generic("").remediation.uplink.rungs
    assert "driver-rebind" not in default
    assert "sim-switch" not in default
    validation.loads('[remediation.uplink]\nrungs = ["radio-cycle", "driver-rebind", '
                     '"sim-switch"]\nsim_slots = [1, 2]\n')


# --- driver-rebind on a sysfs tree -------------------------------------------------------

class Tree:
    """A sysfs tree as the kernel lays it out for a USB modem's net device: the interface
    under /sys/devices, linked from /sys/bus/usb/devices and /sys/class/net/<if>/device,
    its driver under /sys/bus/usb/drivers with write-only ``bind``/``unbind``."""

    def __init__(self, root: Path, netdev: str = "wwan0", iface: str = "1-1:1.4",
                 driver: str = "qmi_wwan") -> None:
        self.root = root
        self.usb = root / "bus" / "usb"
        self.device = root / "devices" / "pci0000:00" / "0000:00:14.0" / "usb1" / "1-1" / iface
        self.device.mkdir(parents=True, exist_ok=True)
        (self.usb / "devices").mkdir(parents=True, exist_ok=True)
        (self.usb / "devices" / iface).symlink_to(self.device)
        self.driver = self.usb / "drivers" / driver
        self.driver.mkdir(parents=True, exist_ok=True)
        for attr in ("bind", "unbind"):
            (self.driver / attr).touch()
        (self.device / "driver").symlink_to(self.driver)
        net = root / "class" / "net" / netdev
        net.mkdir(parents=True)
        (net / "device").symlink_to(self.device)
        self.iface = iface

    def written(self) -> tuple[str, str]:
        return ((self.driver / "unbind").read_text(), (self.driver / "bind").read_text())


def _config(interfaces: str = '["wwan0"]') -> Config:
    return loads_generic(f"[uplink]\ninterfaces = {interfaces}\n")


async def test_driver_rebind_unbinds_then_binds_the_uplinks_usb_interface(
        tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    rung = DriverRebind(_config('["wwan*"]'), sysfs=tmp_path, settle=0.2)
    availability = await rung.probe()
    assert availability.usable, availability.why
    assert "1-1:1.4" in availability.why
    assert "qmi_wwan" in availability.why
    task = asyncio.create_task(rung.restart())
    await asyncio.sleep(0.1)
    assert tree.written() == ("1-1:1.4", "")  # unbound, not yet bound
    outcome = await task
    assert tree.written() == ("1-1:1.4", "1-1:1.4")
    assert outcome.target == "usb 1-1:1.4 (qmi_wwan)"


def _escape_outside_drivers(tree: Tree) -> None:
    evil = tree.root / "evil" / "qmi_wwan"
    evil.mkdir(parents=True)
    for attr in ("bind", "unbind"):
        (evil / attr).touch()
    (tree.device / "driver").unlink()
    (tree.device / "driver").symlink_to(evil)


def _not_usb(tree: Tree) -> None:
    pci = tree.root / "devices" / "pci0000:00" / "0000:00:1f.6"
    pci.mkdir(parents=True)
    link = tree.root / "class" / "net" / "wwan0" / "device"
    link.unlink()
    link.symlink_to(pci)


def _bus_link_elsewhere(tree: Tree) -> None:
    other = tree.root / "devices" / "elsewhere" / tree.iface
    other.mkdir(parents=True)
    (tree.usb / "devices" / tree.iface).unlink()
    (tree.usb / "devices" / tree.iface).symlink_to(other)


def _unbind_is_a_link(tree: Tree) -> None:
    target = tree.root / "power-control"
    target.touch()
    (tree.driver / "unbind").unlink()
    (tree.driver / "unbind").symlink_to(target)


def _hub(tree: Tree) -> None:
    hub = tree.usb / "drivers" / "hub"
    hub.mkdir()
    for attr in ("bind", "unbind"):
        (hub / attr).touch()
    (tree.device / "driver").unlink()
    (tree.device / "driver").symlink_to(hub)


def _no_driver(tree: Tree) -> None:
    (tree.device / "driver").unlink()


def _traversing_name(tree: Tree) -> None:
    (tree.device / "driver").unlink()
    (tree.device / "driver").symlink_to(tree.usb / "drivers" / ".." / ".." / "usb")


def _drivers_dir_a_link(tree: Tree) -> None:
    elsewhere = tree.root / "elsewhere-drivers"
    (tree.usb / "drivers").rename(elsewhere)
    (tree.usb / "drivers").symlink_to(elsewhere)
    (tree.device / "driver").unlink()
    (tree.device / "driver").symlink_to(elsewhere / "qmi_wwan")


@pytest.mark.parametrize(("spoil", "why"), [
    (_escape_outside_drivers, "leads outside"),
    (_not_usb, "is not a USB interface"),
    (_bus_link_elsewhere, "refused"),
    (_unbind_is_a_link, "is not the driver's unbind attribute"),
    (_hub, "never rebound"),
    (_no_driver, "no driver bound"),
    (_traversing_name, "leads outside"),
    (_drivers_dir_a_link, "is a link elsewhere"),
], ids=["driver outside /sys/bus/usb/drivers", "a PCI net device", "bus link elsewhere",
        "unbind a symlink", "the hub driver", "no driver", "a driver link up and out",
        "the drivers directory a link"])
async def test_driver_rebind_refuses_every_path_out_of_sys_bus_usb(
        tmp_path: Path, spoil: object, why: str) -> None:
    tree = Tree(tmp_path)
    spoil(tree)  # type: ignore[operator]
    with pytest.raises(RemedyError, match=why):
        resolve(tmp_path, "wwan0")
    rung = DriverRebind(_config(), sysfs=tmp_path, settle=0.01)
    assert not (await rung.probe()).usable
    with pytest.raises(RemedyError):
        await rung.restart()
    assert _written(tmp_path) == [], "nothing may be written when the resolution is refused"


def _written(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
            and p.stat().st_size]


async def test_driver_rebind_refuses_two_usb_uplinks_and_a_missing_one(
        tmp_path: Path) -> None:
    Tree(tmp_path)
    Tree(tmp_path, netdev="wwan1", iface="1-2:1.4")
    with pytest.raises(RemedyError, match="ambiguous"):
        await DriverRebind(_config('["wwan*"]'), sysfs=tmp_path).restart()
    availability = await DriverRebind(_config('["usb9"]'), sysfs=tmp_path).probe()
    assert not availability.usable
    assert "no uplink interface" in availability.why


@pytest.mark.parametrize("name", ["../../power", "a/b", ".."])
def test_driver_rebind_refuses_a_netdev_name_that_is_a_path(tmp_path: Path, name: str) -> None:
    Tree(tmp_path)
    with pytest.raises(RemedyError, match="not a network interface name"):
        resolve(tmp_path, name)


# --- sim-switch ---------------------------------------------------------------------------

@pytest.mark.parametrize(("order", "current", "slots", "want"), [
    ((1, 2), 1, 2, 2), ((1, 2), 2, 2, 1), ((2, 1), 1, 2, 2), ((1, 2, 3), 2, 3, 3),
    ((1, 2, 3), 3, 3, 1), ((1, 3), 2, 3, 1), ((1, 2), 1, 1, None), ((1, 2), 0, 2, 1),
    ((2, 3), 1, 2, 2),
], ids=str)
def test_the_next_slot_follows_the_configured_order_wrapping(
        order: tuple[int, ...], current: int, slots: int, want: int | None) -> None:
    assert next_slot(order, current, slots) == want


def test_sim_slots_are_validated_and_off_by_default() -> None:
    assert loads_generic("").remediation.uplink.sim_slots == ()
    for bad in ("[1]", "[1, 1]", "[0, 1]", "[1, 9]"):
        with pytest.raises(ConfigError, match=r"remediation\.uplink\.sim_slots"):
            validation.loads(f"[remediation.uplink]\nsim_slots = {bad}\n")
    assert remedies.by_mode("sim-switch", remedies.UPLINK).unavailable(  # type: ignore[union-attr]
        _config()) == "remediation.uplink.sim_slots is empty"


def _sim_config(address: str) -> Config:
    return loads_generic(f'[uplink]\ninterfaces = ["wwan0"]\ndbus_address = "{address}"\n'
                         "[remediation.uplink]\nsim_slots = [1, 2]\n")


async def test_sim_switch_makes_the_other_slot_primary_and_reconnects_after_the_reprobe(
        sandbox: Sandbox) -> None:
    """The dead-SIM case: slot 1 refused by the network, slot 2 fine."""
    bus = start_system_bus(sandbox, policy=BUS_POLICY)
    mm = FakeModemManager(bus.address, connect_delay=0.05, reprobe_delay=0.3)
    modem = mm.add_modem("/sys/devices/usb1/1-1", "wwan0", apn="lab.apn")
    modem.slots, modem.primary_slot, modem.slot_denied = 2, 1, {1: 7}
    async with mm:
        mm.deny_registration(modem, 7)
        reader = ModemManager(bus.address)
        rung = SimSwitch(_sim_config(bus.address), manager=reader, poll=0.05,
                         return_timeout=10.0)
        try:
            (before,) = await reader.modems()
            assert (before.sim_slots, before.primary_sim_slot) == (2, 1)
            availability = await rung.probe()
            assert availability.usable, availability.why
            assert "1 -> 2" in availability.why
            outcome = await rung.restart()
            (after,) = await reader.modems()
        finally:
            await rung.close()
    assert after.path != before.path  # a new modem object: the re-probe
    assert outcome.target == after.path
    assert (after.primary_sim_slot, after.state, after.registration) == (2, "connected",
                                                                          "home")
    assert [c[0] for c in mm.calls] == ["SetPrimarySimSlot", "Connect"]
    assert mm.connects[-1]["apn"] == "lab.apn"  # the old bearer's own settings


async def test_sim_switch_to_a_slot_also_refused_fails_and_says_so(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY)
    mm = FakeModemManager(bus.address, connect_delay=0.05, reprobe_delay=0.1)
    modem = mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    modem.slots, modem.primary_slot, modem.slot_denied = 2, 1, {1: 7, 2: 11}
    async with mm:
        rung = SimSwitch(_sim_config(bus.address), poll=0.05, return_timeout=10.0)
        try:
            with pytest.raises(RemedyError, match=r"SIM slot 2 is primary .* connecting "
                               r"failed.*NoNetwork"):
                await rung.restart()
        finally:
            await rung.close()
    assert [m.primary_slot for m in mm.modems] == [2]


async def test_sim_switch_denied_by_polkit_is_a_config_problem(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY)
    mm = FakeModemManager(bus.address, deny_control=True)
    modem = mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    modem.slots, modem.primary_slot = 2, 1
    async with mm:
        rung = SimSwitch(_sim_config(bus.address), poll=0.05, return_timeout=2.0)
        try:
            with pytest.raises(RemedyError) as err:
                await rung.restart()
        finally:
            await rung.close()
    assert err.value.config_problem
    assert "Device.Control" in str(err.value)
    assert [m.primary_slot for m in mm.modems] == [1]  # nothing switched


async def test_sim_switch_is_not_usable_on_a_modem_without_slots(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox, policy=BUS_POLICY)
    mm = FakeModemManager(bus.address)
    mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    async with mm:
        rung = SimSwitch(_sim_config(bus.address))
        try:
            availability = await rung.probe()
        finally:
            await rung.close()
    assert not availability.usable
    assert "0 SIM slots" in availability.why
    assert mm.calls == []


async def test_the_standin_answers_set_primary_sim_slot_as_modemmanager_does(
        sandbox: Sandbox) -> None:
    """Out of bounds is InvalidArgs; the slot already primary is a success, no re-probe."""
    bus = start_system_bus(sandbox, policy=BUS_POLICY)
    mm = FakeModemManager(bus.address)
    modem = mm.add_modem("/sys/devices/usb1/1-1", "wwan0")
    modem.slots, modem.primary_slot = 2, 1
    async with mm:
        reader = ModemManager(bus.address)
        try:
            (seen,) = await reader.modems()
            with pytest.raises(Exception, match="out of bounds"):
                await reader.set_primary_sim_slot(seen, 3)
            await reader.set_primary_sim_slot(seen, 1)
            await asyncio.sleep(0.2)
            (again,) = await reader.modems()
        finally:
            await reader.close()
    assert again.path == seen.path
