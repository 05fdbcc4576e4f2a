"""Test stand-ins on a private dbus-daemon: logind's Manager (the ``reboot`` rung). The
NetworkManager stand-in the ``modem-reconnect`` rung drives is the lab's
(:mod:`edgeheal.lab.networkmanager`), re-exported here.

Faithful to the real API for the calls used: ``org.freedesktop.login1.Manager`` at
``/org/freedesktop/login1`` with ``Reboot(b interactive)`` and ``CanReboot() -> s``
(logind's names and signatures)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dbus_fast.aio import MessageBus
from dbus_fast.annotations import DBusBool, DBusStr
from dbus_fast.service import ServiceInterface, dbus_method

from edgeheal.lab.networkmanager import FakeNetworkManager
from edgeheal.lab.standin import BusStandIn

__all__ = ["DENY_REBOOT", "LOGIND_POLICY", "FakeLogind", "FakeNetworkManager"]

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
