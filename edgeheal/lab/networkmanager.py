"""A stand-in NetworkManager on a real dbus-daemon: the devices and active connections the
``modem-reconnect`` rung drives where NetworkManager owns the modem.

Why a stand-in: Debian's ``network-manager`` installs here, but the real daemon manages the
host's interfaces, keeps its state in fixed host paths (``/run/NetworkManager``,
``/var/lib/NetworkManager``) and builds a modem device only from a real ModemManager with a
real modem; none of that can be given to it in a test. So this serves the subset of
NetworkManager's D-Bus API the rung uses, with NetworkManager's names, paths, signatures
and error names (``introspection/org.freedesktop.NetworkManager.xml``,
``.Device.xml``, ``.Connection.Active.xml``; errors from ``src/libnm-core-public/
nm-errors.h``, behaviour from ``src/core/nm-manager.c``):

- ``/org/freedesktop/NetworkManager``, ``org.freedesktop.NetworkManager``:
  ``GetDeviceByIpIface(s) -> o`` (``org.freedesktop.NetworkManager.UnknownDevice`` "No
  device found for the requested iface."), ``ActivateConnection(o connection, o device,
  o specific_object) -> o active_connection``, ``DeactivateConnection(o)``
  (``...ConnectionNotActive`` "The connection was not active."; both answer
  ``...PermissionDenied`` when polkit refuses ``org.freedesktop.NetworkManager.
  network-control``: :attr:`FakeNetworkManager.deny_control`);
- ``/org/freedesktop/NetworkManager/Devices/N``, ``.Device``: ``Interface``,
  ``IpInterface``, ``Managed`` ``b``, ``State`` ``u`` (NMDeviceState: 30 disconnected, 40
  prepare, 100 activated, 110 deactivating), ``ActiveConnection`` ``o`` (``/`` when none);
- ``/org/freedesktop/NetworkManager/ActiveConnection/N``, ``.Connection.Active``:
  ``Connection`` ``o`` (the settings profile, ``/org/freedesktop/NetworkManager/
  Settings/N``), ``Id``, ``Uuid``, ``Type`` (``gsm``), ``Devices`` ``ao``, ``State`` ``u``
  (NMActiveConnectionState: 1 activating, 2 activated, 3 deactivating, 4 deactivated) and
  its ``StateChanged(uu)`` signal; a deactivated active connection is unexported, and an
  activation makes a new one (a new path), as NetworkManager does.

``PropertiesChanged`` is emitted on every change. ``on_activate`` runs once an activation
has reached ``activated`` (the lab heals the carrier there, as NetworkManager's new data
session through ModemManager would).

Lab code: it imports dbus-fast at the top; the agent never imports it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from dbus_fast import DBusError, PropertyAccess
from dbus_fast.aio import MessageBus
from dbus_fast.annotations import (
    DBusBool,
    DBusObjectPath,
    DBusSignature,
    DBusStr,
    DBusUInt32,
)
from dbus_fast.service import ServiceInterface, dbus_method, dbus_property, dbus_signal

from edgeheal.lab.standin import BusStandIn

SERVICE = "org.freedesktop.NetworkManager"
PATH = "/org/freedesktop/NetworkManager"
ERR = SERVICE + "."
BUS_POLICY = f"""\
    <allow own="{SERVICE}"/>
    <allow send_destination="{SERVICE}"/>
"""
DEVICE_DISCONNECTED, DEVICE_PREPARE, DEVICE_ACTIVATED, DEVICE_DEACTIVATING = 30, 40, 100, 110
AC_ACTIVATING, AC_ACTIVATED, AC_DEACTIVATING, AC_DEACTIVATED = 1, 2, 3, 4

Hook = Callable[[str], Awaitable[None] | None]


@dataclass
class FakeDevice:
    index: int
    ip_iface: str
    managed: bool
    connection: str
    """The settings profile NetworkManager activates on it (its path)."""
    state: int = DEVICE_ACTIVATED
    active: str = "/"

    @property
    def path(self) -> str:
        return f"{PATH}/Devices/{self.index}"


@dataclass
class FakeActive:
    index: int
    connection: str
    device: FakeDevice
    state: int = AC_ACTIVATED

    @property
    def path(self) -> str:
        return f"{PATH}/ActiveConnection/{self.index}"


class _Manager(ServiceInterface):
    def __init__(self, fake: FakeNetworkManager) -> None:
        super().__init__(SERVICE)
        self.fake = fake

    @dbus_method()
    def GetDeviceByIpIface(self, iface: DBusStr) -> DBusObjectPath:
        device = self.fake.by_iface.get(iface)
        if device is None:
            raise DBusError(ERR + "UnknownDevice", "No device found for the requested iface.")
        return device.path

    @dbus_method()
    async def ActivateConnection(self, connection: DBusObjectPath, device: DBusObjectPath,
                                 specific_object: DBusObjectPath) -> DBusObjectPath:
        return await self.fake.activate(connection, device)

    @dbus_method()
    async def DeactivateConnection(self, active_connection: DBusObjectPath):  # type: ignore[no-untyped-def]
        await self.fake.deactivate(active_connection)


class _Device(ServiceInterface):
    def __init__(self, device: FakeDevice) -> None:
        super().__init__(SERVICE + ".Device")
        self.device = device

    @dbus_property(access=PropertyAccess.READ)
    def Interface(self) -> DBusStr:
        return "cdc-wdm0" if self.device.ip_iface.startswith("ww") else self.device.ip_iface

    @dbus_property(access=PropertyAccess.READ)
    def IpInterface(self) -> DBusStr:
        return self.device.ip_iface

    @dbus_property(access=PropertyAccess.READ)
    def Managed(self) -> DBusBool:
        return self.device.managed

    @dbus_property(access=PropertyAccess.READ)
    def State(self) -> DBusUInt32:
        return self.device.state

    @dbus_property(access=PropertyAccess.READ)
    def ActiveConnection(self) -> DBusObjectPath:
        return self.device.active


class _Active(ServiceInterface):
    def __init__(self, active: FakeActive) -> None:
        super().__init__(SERVICE + ".Connection.Active")
        self.active = active

    @dbus_property(access=PropertyAccess.READ)
    def Connection(self) -> DBusObjectPath:
        return self.active.connection

    @dbus_property(access=PropertyAccess.READ)
    def Id(self) -> DBusStr:
        return f"edgeheal-lab-{self.active.device.ip_iface}"

    @dbus_property(access=PropertyAccess.READ)
    def Uuid(self) -> DBusStr:
        return f"00000000-0000-4000-8000-{self.active.device.index:012d}"

    @dbus_property(access=PropertyAccess.READ)
    def Type(self) -> DBusStr:
        return "gsm"

    @dbus_property(access=PropertyAccess.READ)
    def Devices(self) -> Annotated[list[str], DBusSignature("ao")]:
        return [self.active.device.path]

    @dbus_property(access=PropertyAccess.READ)
    def State(self) -> DBusUInt32:
        return self.active.state

    @dbus_signal()
    def StateChanged(self, state: int,
                     reason: int) -> Annotated[tuple[int, int], DBusSignature("uu")]:
        return state, reason


@dataclass
class FakeNetworkManager(BusStandIn):
    """The stand-in ``org.freedesktop.NetworkManager``. ``devices`` maps an ip interface to
    whether NetworkManager manages it; a managed one starts with its profile active."""

    SERVICE = SERVICE
    address: str
    devices: dict[str, bool] = field(default_factory=dict)
    on_activate: Hook | None = None
    deny_control: bool = False
    """Activate/Deactivate answer ``PermissionDenied`` (polkit refused network-control)."""
    activate_delay: float = 0.3
    """Simulated time from ``activating`` to ``activated`` (the modem's session)."""
    calls: list[tuple[str, str]] = field(default_factory=list)
    """Every Activate/Deactivate call: (method, the connection or active-connection path)."""
    by_iface: dict[str, FakeDevice] = field(default_factory=dict)
    actives: dict[str, FakeActive] = field(default_factory=dict)
    _ifaces: dict[str, ServiceInterface] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _count: int = 0

    def __post_init__(self) -> None:
        for i, (iface, managed) in enumerate(self.devices.items()):
            device = FakeDevice(i, iface, managed, f"{PATH}/Settings/{i}",
                                state=DEVICE_ACTIVATED if managed else 10)  # 10: unmanaged
            self.by_iface[iface] = device
            if managed:
                self._new_active(device, AC_ACTIVATED)

    def _serve(self, bus: MessageBus) -> None:
        bus.export(PATH, _Manager(self))
        for device in self.by_iface.values():
            iface = _Device(device)
            bus.export(device.path, iface)
            self._ifaces[device.path] = iface
        for active in self.actives.values():
            self._export_active(active)

    def _new_active(self, device: FakeDevice, state: int) -> FakeActive:
        active = FakeActive(self._count, device.connection, device, state)
        self._count += 1
        self.actives[active.path] = active
        device.active = active.path
        return active

    def _export_active(self, active: FakeActive) -> None:
        if self._bus is not None:
            iface = _Active(active)
            self._bus.export(active.path, iface)
            self._ifaces[active.path] = iface

    def _changed(self, path: str, values: dict[str, Any]) -> None:
        iface = self._ifaces.get(path)
        if iface is not None and self._connected:
            iface.emit_properties_changed(values)

    def _set(self, active: FakeActive, state: int) -> None:
        active.state = state
        self._changed(active.path, {"State": state})
        iface = self._ifaces.get(active.path)
        if isinstance(iface, _Active) and self._connected:
            iface.StateChanged(state, 0)

    def _device_state(self, device: FakeDevice, state: int, active: str) -> None:
        device.state, device.active = state, active
        self._changed(device.path, {"State": state, "ActiveConnection": active})

    def _authorize(self, what: str, path: str) -> None:
        self.calls.append((what, path))
        if self.deny_control:
            raise DBusError(ERR + "PermissionDenied", f"Not authorized to {what.lower()} "
                            "connections")

    async def deactivate(self, path: str) -> None:
        """``DeactivateConnection``, as ``deactivate_net_auth_done_cb`` does."""
        self._authorize("Deactivate", path)
        await self._deactivate(path)

    async def _deactivate(self, path: str) -> None:
        active = self.actives.get(path)
        if active is None:
            raise DBusError(ERR + "ConnectionNotActive", "The connection was not active.")
        self._set(active, AC_DEACTIVATING)
        self._device_state(active.device, DEVICE_DEACTIVATING, active.path)
        await asyncio.sleep(0)
        self._set(active, AC_DEACTIVATED)
        self._device_state(active.device, DEVICE_DISCONNECTED, "/")
        del self.actives[path]
        if self._bus is not None:
            self._bus.unexport(path)
        self._ifaces.pop(path, None)

    async def activate(self, connection: str, device_path: str) -> str:
        """``ActivateConnection`` of ``connection`` on the device: a new active connection,
        ``activating`` then ``activated`` (an active one on the device is replaced)."""
        self._authorize("Activate", connection)
        device = next((d for d in self.by_iface.values() if d.path == device_path), None)
        if device is None:
            raise DBusError(ERR + "UnknownDevice", f"Device '{device_path}' not found")
        if connection != device.connection:
            raise DBusError(ERR + "UnknownConnection", f"Connection '{connection}' is not "
                            "available on this device")
        if not device.managed:
            raise DBusError(ERR + "ConnectionNotAvailable", "Device is not managed")
        if device.active != "/":  # NetworkManager replaces it
            await self._deactivate(device.active)
        active = self._new_active(device, AC_ACTIVATING)
        self._export_active(active)
        self._device_state(device, DEVICE_PREPARE, active.path)
        self._set(active, AC_ACTIVATING)
        task = asyncio.get_running_loop().create_task(self._finish(active))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return active.path

    async def _stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _finish(self, active: FakeActive) -> None:
        await asyncio.sleep(self.activate_delay)
        if active.path not in self.actives:
            return
        self._set(active, AC_ACTIVATED)
        self._device_state(active.device, DEVICE_ACTIVATED, active.path)
        if self.on_activate is not None:
            maybe = self.on_activate(active.device.ip_iface)
            if inspect.isawaitable(maybe):
                await maybe
