"""Test stand-ins on a private dbus-daemon: logind's Manager (the ``reboot`` rung) and the
part of NetworkManager the ``modem-reconnect`` rung asks (does it manage the interface?).

Faithful to the real APIs for the calls used: ``org.freedesktop.login1.Manager`` at
``/org/freedesktop/login1`` with ``Reboot(b interactive)`` and ``CanReboot() -> s``
(logind's names and signatures); ``org.freedesktop.NetworkManager.GetDeviceByIpIface(s) ->
o`` (``org.freedesktop.NetworkManager.UnknownDevice`` for an interface it does not know)
and the device's ``org.freedesktop.NetworkManager.Device.Managed`` ``b`` property."""

from __future__ import annotations

from dataclasses import dataclass, field

from dbus_fast import DBusError, PropertyAccess
from dbus_fast.aio import MessageBus
from dbus_fast.annotations import DBusBool, DBusObjectPath, DBusStr
from dbus_fast.service import ServiceInterface, dbus_method, dbus_property

from edgeheal.lab.standin import BusStandIn

LOGIND_POLICY = """\
    <allow own="org.freedesktop.login1"/>
    <allow send_destination="org.freedesktop.login1"/>
    <allow own="org.freedesktop.NetworkManager"/>
    <allow send_destination="org.freedesktop.NetworkManager"/>
"""
DENY_REBOOT = """\
    <deny send_destination="org.freedesktop.login1"
          send_interface="org.freedesktop.login1.Manager" send_member="Reboot"/>
"""


class _Logind(ServiceInterface):
    def __init__(self, fake: FakeLogind) -> None:
        super().__init__("org.freedesktop.login1.Manager")
        self.fake = fake

    @dbus_method()
    def Reboot(self, interactive: DBusBool):  # type: ignore[no-untyped-def]
        self.fake.reboots.append(bool(interactive))

    @dbus_method()
    def CanReboot(self) -> DBusStr:
        return self.fake.can_reboot


@dataclass
class FakeLogind(BusStandIn):
    SERVICE = "org.freedesktop.login1"
    address: str
    can_reboot: str = "yes"
    reboots: list[bool] = field(default_factory=list)
    """The ``interactive`` argument of every Reboot call received."""

    def _serve(self, bus: MessageBus) -> None:
        bus.export("/org/freedesktop/login1", _Logind(self))


class _NM(ServiceInterface):
    def __init__(self, fake: FakeNetworkManager) -> None:
        super().__init__("org.freedesktop.NetworkManager")
        self.fake = fake

    @dbus_method()
    def GetDeviceByIpIface(self, iface: DBusStr) -> DBusObjectPath:
        if iface not in self.fake.devices:
            raise DBusError("org.freedesktop.NetworkManager.UnknownDevice",
                            "No device found for the requested iface.")
        return f"/org/freedesktop/NetworkManager/Devices/{list(self.fake.devices).index(iface)}"


class _Device(ServiceInterface):
    def __init__(self, managed: bool) -> None:
        super().__init__("org.freedesktop.NetworkManager.Device")
        self.managed = managed

    @dbus_property(access=PropertyAccess.READ)
    def Managed(self) -> DBusBool:
        return self.managed


@dataclass
class FakeNetworkManager(BusStandIn):
    SERVICE = "org.freedesktop.NetworkManager"
    address: str
    devices: dict[str, bool] = field(default_factory=dict)
    """ip interface -> Managed."""

    def _serve(self, bus: MessageBus) -> None:
        bus.export("/org/freedesktop/NetworkManager", _NM(self))
        for i, (_, managed) in enumerate(self.devices.items()):
            bus.export(f"/org/freedesktop/NetworkManager/Devices/{i}", _Device(managed))
