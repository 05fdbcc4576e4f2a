"""A stand-in ModemManager on a real dbus-daemon, for the lab and the modem tests.

Why a stand-in: the real ``ModemManager`` daemon installs and runs in the tests (it is
started on a private bus to prove discovery copes with "no modem"), but it manages real
modems only — there is no modem to give it here. So the lab serves the subset of
ModemManager's D-Bus API that :mod:`edgeheal.boundaries.modemmanager` uses, with ModemManager's
names, object paths, signatures and error names, on a real ``dbus-daemon``
(:func:`edgeheal.lab.systemd_bus.start_system_bus` with :data:`BUS_POLICY`: ModemManager's
own bus policy, reduced to what is used):

- ``/org/freedesktop/ModemManager1``: ``org.freedesktop.DBus.ObjectManager.GetManagedObjects``
  answering the modems only (ModemManager exports bearers outside its object manager), and
  ``InterfacesAdded``/``InterfacesRemoved`` from that path when a modem comes or goes;
- ``/org/freedesktop/ModemManager1/Modem/N``: ``org.freedesktop.ModemManager1.Modem``
  (``State`` ``i``, ``SignalQuality`` ``(ub)``, ``Device`` ``s``, ``Ports`` ``a(su)``,
  ``Bearers`` ``ao``, ``PrimaryPort``, ``Manufacturer``, ``Model``; signal
  ``StateChanged(iiu)``), ``.Modem.Modem3gpp`` (``RegistrationState`` ``u``,
  ``OperatorName``), ``.Modem.Simple`` (``Connect(a{sv}) -> o``, ``Disconnect(o)``);
- ``/org/freedesktop/ModemManager1/Bearer/N``: ``org.freedesktop.ModemManager1.Bearer``
  (``Interface``, ``Connected``, ``Suspended``, ``Properties`` ``a{sv}``);
- ``org.freedesktop.DBus.Properties`` with ``PropertiesChanged`` on every change.

(One extra: dbus-fast also sends an ``InterfacesAdded`` from the object's own path when it
exports one; ModemManager does not. Clients match on the manager's path, as they must.)

Since the second round also: ``Modem.StateFailedReason`` ``u`` and ``UnlockRequired`` ``u``,
``Modem3gpp.NetworkRejection`` ``a{sv}`` (``error`` ``u``, ModemManager 1.24), and
``Modem.Enable(b)``, which behaves as ModemManager's ``handle_enable_auth_ready``
(``src/mm-iface-modem.c``): below ``locked`` (a ``failed`` modem) it answers
``Core.WrongState`` "modem in failed state"; disabling tears the bearers down and goes
``disabling`` -> ``disabled`` (registration ``idle``); enabling goes ``enabling`` ->
``enabled`` -> ``searching`` -> ``registered`` (or registration ``denied`` with the reject
cause while :meth:`FakeModemManager.deny_registration` holds), and does not reconnect a
bearer (ModemManager never does that by itself; a connection manager does). Lab controls
make a modem ``failed`` with a reason (:meth:`FakeModemManager.fail`), vanish and return
(:meth:`remove_modem`, :meth:`add_modem`), and be refused by the network.

``Simple.Connect`` behaves as ModemManager's: unknown property keys or wrong types are
``Core.InvalidArgs``; without registration (home/roaming) it fails with
``MobileEquipment.NoNetwork``; a bearer with the same properties is reused, else one is
created; ``Connected`` goes true and the modem ``connected``. ``on_connect`` runs then: the
lab's ``stuck-modem`` scenario lifts the carrier's silent drop there. ``deny_control``
answers ``Core.Unauthorized`` to Connect/Disconnect, what ModemManager says when polkit
refuses ``org.freedesktop.ModemManager1.Device.Control``.

Lab code: it imports dbus-fast at the top; the agent never imports it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from dbus_fast import DBusError, Message, MessageType, PropertyAccess
from dbus_fast import Variant as V
from dbus_fast.aio import MessageBus
from dbus_fast.annotations import (
    DBusBool,
    DBusDict,
    DBusInt32,
    DBusObjectPath,
    DBusSignature,
    DBusStr,
    DBusUInt32,
)
from dbus_fast.service import ServiceInterface, dbus_method, dbus_property, dbus_signal

from edgeheal.boundaries.modemmanager.client import SIMPLE_IFACE
from edgeheal.boundaries.modemmanager.readings import (
    BEARER_IFACE,
    BEARER_PREFIX,
    FAILED_REASONS,
    LOCKS,
    MODEM_3GPP_IFACE,
    MODEM_IFACE,
    MODEM_PREFIX,
    MODEM_STATES,
    OBJECT_MANAGER_IFACE,
    REGISTRATION_STATES,
    ROOT_PATH,
    SERVICE,
)
from edgeheal.lab.standin import BusStandIn

log = logging.getLogger(__name__)

BUS_POLICY = f"""\
    <allow own="{SERVICE}"/>
    <allow send_destination="{SERVICE}"/>
"""
"""What the stand-in needs of the bus: own ModemManager's name, be called (the host's
policy allows Properties/ObjectManager to all and Simple.* to be authorized by polkit)."""

ERR = "org.freedesktop.ModemManager1.Error."
BEARER_KEYS = {"apn": "s", "ip-type": "u", "allowed-auth": "u", "user": "s", "password": "s",
               "allow-roaming": "b", "rm-protocol": "u", "number": "s", "profile-id": "i",
               "apn-type": "u", "multiplex": "u"}
"""The bearer settings ModemManager's Simple.Connect accepts, and their D-Bus types."""
STATE_CODES = {name: code for code, name in MODEM_STATES.items()}
FAILED_CODES = {name: code for code, name in FAILED_REASONS.items()}
LOCK_CODES = {name: code for code, name in LOCKS.items()}
REGISTRATION_CODES = {name: code for code, name in REGISTRATION_STATES.items()}
PORT_NET, PORT_AT, PORT_QMI = 2, 3, 6
"""MMModemPortType values."""

Hook = Callable[["FakeModem"], Awaitable[None] | None]


@dataclass
class FakeBearer:
    index: int
    interface: str
    properties: dict[str, V] = field(repr=False)
    connected: bool = True

    @property
    def path(self) -> str:
        return f"{BEARER_PREFIX}{self.index}"


@dataclass
class FakeModem:
    index: int
    device: str
    """The physical device's sysfs path (``Modem.Device``)."""
    interface: str
    """The data interface (the net port, the bearer's ``Interface``)."""
    state: str = "connected"
    registration: str = "home"
    signal: int = 75
    signal_recent: bool = True
    has_3gpp: bool = True
    bearers: list[FakeBearer] = field(default_factory=list)
    failed_reason: str = "none"
    unlock_required: str = "none"
    reject_cause: int = 0
    """NetworkRejection's ``error`` (0: none, the property's dict is empty)."""
    denied: int = 0
    """While non-zero, every registration attempt is denied with this reject cause."""

    @property
    def path(self) -> str:
        return f"{MODEM_PREFIX}{self.index}"

    @property
    def ports(self) -> list[tuple[str, int]]:
        return [("cdc-wdm0", PORT_QMI), ("ttyUSB2", PORT_AT), (self.interface, PORT_NET)]


def _modem_props(modem: FakeModem) -> dict[str, V]:
    return {"State": V("i", STATE_CODES[modem.state]),
            "SignalQuality": V("(ub)", [modem.signal, modem.signal_recent]),
            "Device": V("s", modem.device), "Ports": V("a(su)", [list(p) for p in modem.ports]),
            "Bearers": V("ao", [b.path for b in modem.bearers]),
            "PrimaryPort": V("s", "cdc-wdm0"), "Manufacturer": V("s", "edgeheal lab"),
            "Model": V("s", "stand-in LTE modem"),
            "StateFailedReason": V("u", FAILED_CODES[modem.failed_reason]),
            "UnlockRequired": V("u", LOCK_CODES[modem.unlock_required])}


def _rejection(modem: FakeModem) -> dict[str, V]:
    return {"error": V("u", modem.reject_cause)} if modem.reject_cause else {}


def _gpp_props(modem: FakeModem) -> dict[str, V]:
    return {"RegistrationState": V("u", REGISTRATION_CODES[modem.registration]),
            "OperatorName": V("s", "Lab Carrier"),
            "NetworkRejection": V("a{sv}", _rejection(modem))}


class _Modem(ServiceInterface):
    def __init__(self, fake: FakeModemManager, modem: FakeModem) -> None:
        super().__init__(MODEM_IFACE)
        self.fake, self.modem = fake, modem

    @dbus_property(access=PropertyAccess.READ)
    def State(self) -> DBusInt32:
        return STATE_CODES[self.modem.state]

    @dbus_property(access=PropertyAccess.READ)
    def SignalQuality(self) -> Annotated[list[Any], DBusSignature("(ub)")]:
        return [self.modem.signal, self.modem.signal_recent]

    @dbus_property(access=PropertyAccess.READ)
    def Device(self) -> DBusStr:
        return self.modem.device

    @dbus_property(access=PropertyAccess.READ)
    def Ports(self) -> Annotated[list[list[Any]], DBusSignature("a(su)")]:
        return [list(p) for p in self.modem.ports]

    @dbus_property(access=PropertyAccess.READ)
    def Bearers(self) -> Annotated[list[str], DBusSignature("ao")]:
        return [b.path for b in self.modem.bearers]

    @dbus_property(access=PropertyAccess.READ)
    def PrimaryPort(self) -> DBusStr:
        return "cdc-wdm0"

    @dbus_property(access=PropertyAccess.READ)
    def Manufacturer(self) -> DBusStr:
        return "edgeheal lab"

    @dbus_property(access=PropertyAccess.READ)
    def Model(self) -> DBusStr:
        return "stand-in LTE modem"

    @dbus_property(access=PropertyAccess.READ)
    def StateFailedReason(self) -> DBusUInt32:
        return FAILED_CODES[self.modem.failed_reason]

    @dbus_property(access=PropertyAccess.READ)
    def UnlockRequired(self) -> DBusUInt32:
        return LOCK_CODES[self.modem.unlock_required]

    @dbus_method()
    async def Enable(self, enable: DBusBool):  # type: ignore[no-untyped-def]
        await self.fake.enable(self.modem, bool(enable))

    @dbus_signal()
    def StateChanged(self, old: int, new: int,
                     reason: int) -> Annotated[tuple[int, int, int], DBusSignature("iiu")]:
        return old, new, reason


class _Modem3gpp(ServiceInterface):
    def __init__(self, modem: FakeModem) -> None:
        super().__init__(MODEM_3GPP_IFACE)
        self.modem = modem

    @dbus_property(access=PropertyAccess.READ)
    def RegistrationState(self) -> DBusUInt32:
        return REGISTRATION_CODES[self.modem.registration]

    @dbus_property(access=PropertyAccess.READ)
    def OperatorName(self) -> DBusStr:
        return "Lab Carrier"

    @dbus_property(access=PropertyAccess.READ)
    def NetworkRejection(self) -> DBusDict:
        return _rejection(self.modem)


class _Simple(ServiceInterface):
    def __init__(self, fake: FakeModemManager, modem: FakeModem) -> None:
        super().__init__(SIMPLE_IFACE)
        self.fake, self.modem = fake, modem

    @dbus_method()
    async def Connect(self, properties: DBusDict) -> DBusObjectPath:
        return await self.fake.simple_connect(self.modem, properties)

    @dbus_method()
    async def Disconnect(self, bearer: DBusObjectPath):  # type: ignore[no-untyped-def]
        await self.fake.simple_disconnect(self.modem, bearer)


class _Bearer(ServiceInterface):
    def __init__(self, bearer: FakeBearer) -> None:
        super().__init__(BEARER_IFACE)
        self.bearer = bearer

    @dbus_property(access=PropertyAccess.READ)
    def Interface(self) -> DBusStr:
        return self.bearer.interface if self.bearer.connected else ""

    @dbus_property(access=PropertyAccess.READ)
    def Connected(self) -> DBusBool:
        return self.bearer.connected

    @dbus_property(access=PropertyAccess.READ)
    def Suspended(self) -> DBusBool:
        return False

    @dbus_property(access=PropertyAccess.READ)
    def Properties(self) -> DBusDict:
        return dict(self.bearer.properties)


@dataclass
class FakeModemManager(BusStandIn):
    """The stand-in ``org.freedesktop.ModemManager1``. Use ``async with`` (or start/close);
    change the modems only through the methods below, which emit what ModemManager emits."""

    SERVICE = SERVICE
    address: str
    modems: list[FakeModem] = field(default_factory=list)
    on_connect: Hook | None = None
    """Called once a Simple.Connect has connected the bearer (the lab heals the carrier)."""
    deny_control: bool = False
    """Connect/Disconnect answer ``Core.Unauthorized`` (polkit said no)."""
    connect_delay: float = 0.3
    """Simulated time to bring the data session up."""
    calls: list[tuple[str, str]] = field(default_factory=list)
    """Every Simple and Enable call: (method, modem path); Enable(false) is "Disable"."""
    connects: list[dict[str, Any]] = field(default_factory=list, repr=False)
    """The properties (plain values) of every Simple.Connect accepted."""
    _ifaces: dict[str, dict[str, ServiceInterface]] = field(default_factory=dict)
    _bearers: int = 0

    def _serve(self, bus: MessageBus) -> None:
        bus.add_message_handler(self._object_manager)
        for modem in self.modems:
            self._export(modem)

    # --- building -----------------------------------------------------------------------

    def add_modem(self, device: str, interface: str, *, apn: str = "internet",
                  **settings: Any) -> FakeModem:
        """A registered modem with one connected bearer (``settings``: more bearer
        properties, plain values, e.g. ``user="u", password="p"``)."""
        modem = FakeModem(index=len(self.modems), device=device, interface=interface)
        props = {"apn": apn, "ip-type": 1, **settings}  # MM_BEARER_IP_FAMILY_IPV4
        modem.bearers.append(self._new_bearer(modem, self._typed(props)))  # exported below
        self.modems.append(modem)
        if self._bus is not None:
            self._export(modem)
            self._bus.send(Message.new_signal(
                ROOT_PATH, OBJECT_MANAGER_IFACE, "InterfacesAdded", "oa{sa{sv}}",
                [modem.path, self._managed(modem)]))
        return modem

    def remove_modem(self, modem: FakeModem) -> None:
        self.modems.remove(modem)
        if self._bus is not None:
            for path in (modem.path, *(b.path for b in modem.bearers)):
                self._bus.unexport(path)
                self._ifaces.pop(path, None)
            self._bus.send(Message.new_signal(
                ROOT_PATH, OBJECT_MANAGER_IFACE, "InterfacesRemoved", "oas",
                [modem.path, list(self._managed(modem))]))

    @staticmethod
    def _typed(props: dict[str, Any]) -> dict[str, V]:
        return {k: v if isinstance(v, V) else V(BEARER_KEYS[k], v) for k, v in props.items()}

    def _new_bearer(self, modem: FakeModem, props: dict[str, V]) -> FakeBearer:
        """A bearer, not yet exported (its modem's export does it, or the caller)."""
        bearer = FakeBearer(self._bearers, modem.interface, props, connected=True)
        self._bearers += 1
        return bearer

    def _export(self, modem: FakeModem) -> None:
        assert self._bus is not None  # noqa: S101 - internal invariant
        ifaces: dict[str, ServiceInterface] = {MODEM_IFACE: _Modem(self, modem),
                                                SIMPLE_IFACE: _Simple(self, modem)}
        if modem.has_3gpp:
            ifaces[MODEM_3GPP_IFACE] = _Modem3gpp(modem)
        for iface in ifaces.values():
            self._bus.export(modem.path, iface)
        self._ifaces[modem.path] = ifaces
        for bearer in modem.bearers:
            self._export_bearer(bearer)

    def _export_bearer(self, bearer: FakeBearer) -> None:
        assert self._bus is not None  # noqa: S101 - internal invariant
        iface = _Bearer(bearer)
        self._bus.export(bearer.path, iface)
        self._ifaces[bearer.path] = {BEARER_IFACE: iface}

    def _managed(self, modem: FakeModem) -> dict[str, dict[str, V]]:
        out = {MODEM_IFACE: _modem_props(modem), SIMPLE_IFACE: {}}
        if modem.has_3gpp:
            out[MODEM_3GPP_IFACE] = _gpp_props(modem)
        return out

    def _object_manager(self, msg: Message) -> Message | None:
        """ModemManager's object manager: the modems, and nothing else (not the bearers
        dbus-fast's default handler would list)."""
        if (msg.message_type is not MessageType.METHOD_CALL or msg.path != ROOT_PATH
                or msg.interface != OBJECT_MANAGER_IFACE or msg.member != "GetManagedObjects"):
            return None
        return Message.new_method_return(msg, "a{oa{sa{sv}}}", [
            {m.path: self._managed(m) for m in self.modems}])

    # --- lab controls -------------------------------------------------------------------

    def set_state(self, modem: FakeModem, state: str) -> None:
        old, modem.state = modem.state, state
        if old != state:
            self._changed(modem.path, MODEM_IFACE, {"State": STATE_CODES[state]})
            iface = self._ifaces.get(modem.path, {}).get(MODEM_IFACE)
            if isinstance(iface, _Modem) and self._connected:
                iface.StateChanged(STATE_CODES[old], STATE_CODES[state], 0)

    def set_registration(self, modem: FakeModem, registration: str) -> None:
        modem.registration = registration
        self._changed(modem.path, MODEM_3GPP_IFACE,
                      {"RegistrationState": REGISTRATION_CODES[registration]})

    def set_signal(self, modem: FakeModem, quality: int, recent: bool = True) -> None:
        modem.signal, modem.signal_recent = quality, recent
        self._changed(modem.path, MODEM_IFACE, {"SignalQuality": [quality, recent]})

    def set_bearer(self, bearer: FakeBearer, connected: bool) -> None:
        bearer.connected = connected
        self._changed(bearer.path, BEARER_IFACE,
                      {"Connected": connected, "Interface": bearer.interface if connected
                       else ""})

    def lose_coverage(self, modem: FakeModem) -> None:
        """What ModemManager reports when the network is gone: the session drops, the
        modem searches, no signal."""
        for bearer in modem.bearers:
            self.set_bearer(bearer, False)
        self.set_registration(modem, "searching")
        self.set_signal(modem, 0)
        self.set_state(modem, "searching")

    def fail(self, modem: FakeModem, reason: str = "unknown") -> None:
        """ModemManager gives up on the modem: ``failed`` with ``StateFailedReason``."""
        for bearer in modem.bearers:
            if bearer.connected:
                self.set_bearer(bearer, False)
        modem.failed_reason = reason
        self._changed(modem.path, MODEM_IFACE, {"StateFailedReason": FAILED_CODES[reason]})
        self.set_state(modem, "failed")

    def lock(self, modem: FakeModem, lock: str = "sim-pin") -> None:
        """The SIM asks for a PIN (or PUK): ``locked`` with ``UnlockRequired``."""
        modem.unlock_required = lock
        self._changed(modem.path, MODEM_IFACE, {"UnlockRequired": LOCK_CODES[lock]})
        self.set_state(modem, "locked")

    def deny_registration(self, modem: FakeModem, cause: int) -> None:
        """The network refuses the modem (``cause``: an MMNetworkError, 0 lifts it): the
        session drops, registration ``denied`` with ``NetworkRejection``; the modem stays
        ``enabled`` (MMModemState has no "denied")."""
        modem.denied = cause
        if not cause:
            return
        for bearer in modem.bearers:
            if bearer.connected:
                self.set_bearer(bearer, False)
        self.register(modem)

    def register(self, modem: FakeModem) -> None:
        """A registration attempt: denied while ``denied`` holds, else registered."""
        if modem.denied:
            modem.reject_cause = modem.denied
            self._changed(modem.path, MODEM_3GPP_IFACE,
                          {"NetworkRejection": _rejection(modem)})
            self.set_registration(modem, "denied")
            self.set_state(modem, "enabled")
            return
        modem.reject_cause = 0  # cleared once registered (the property's documentation)
        self._changed(modem.path, MODEM_3GPP_IFACE, {"NetworkRejection": {}})
        self.set_registration(modem, "home")
        self.set_state(modem, "registered")

    async def enable(self, modem: FakeModem, on: bool) -> None:
        """``Modem.Enable``: see the module docstring."""
        self._authorize("Enable" if on else "Disable", modem)
        if STATE_CODES[modem.state] < STATE_CODES["locked"]:
            raise DBusError(ERR + "Core.WrongState", f"modem in {modem.state} state")
        if on:
            if STATE_CODES[modem.state] >= STATE_CODES["enabled"]:
                return
            self.set_state(modem, "enabling")
            await asyncio.sleep(self.connect_delay)
            self.set_state(modem, "enabled")
            self.set_state(modem, "searching")
            self.register(modem)
            return
        if STATE_CODES[modem.state] <= STATE_CODES["disabled"]:
            return
        self.set_state(modem, "disabling")
        for bearer in modem.bearers:
            if bearer.connected:
                self.set_bearer(bearer, False)
        await asyncio.sleep(0)
        self.set_registration(modem, "idle")
        self.set_state(modem, "disabled")

    def _changed(self, path: str, interface: str, values: dict[str, Any]) -> None:
        iface = self._ifaces.get(path, {}).get(interface)
        if iface is not None and self._connected:
            iface.emit_properties_changed(values)

    # --- Simple ---------------------------------------------------------------------------

    def _authorize(self, what: str, modem: FakeModem) -> None:
        self.calls.append((what, modem.path))
        if self.deny_control:
            raise DBusError(ERR + "Core.Unauthorized", "Not authorized to control the device")

    async def simple_connect(self, modem: FakeModem, properties: dict[str, V]) -> str:
        self._authorize("Connect", modem)
        for key, value in properties.items():
            want = BEARER_KEYS.get(key)
            if want is None:
                raise DBusError(ERR + "Core.InvalidArgs",
                                f"Invalid properties: Unexpected property '{key}'")
            if value.signature != want:
                raise DBusError(ERR + "Core.InvalidArgs",
                                f"Invalid properties: Invalid type for property '{key}'")
        if modem.registration not in ("home", "roaming"):
            raise DBusError(ERR + "MobileEquipment.NoNetwork", "No network service")
        self.connects.append({k: v.value for k, v in properties.items()})
        wanted = {k: (v.signature, v.value) for k, v in properties.items()}
        bearer = next((b for b in modem.bearers if {k: (v.signature, v.value)
                       for k, v in b.properties.items()} == wanted), None)
        if bearer is None:
            bearer = self._new_bearer(modem, dict(properties))
            modem.bearers.append(bearer)
            if self._bus is not None:
                self._export_bearer(bearer)
            self._changed(modem.path, MODEM_IFACE, {"Bearers": [b.path for b in modem.bearers]})
        self.set_state(modem, "connecting")
        await asyncio.sleep(self.connect_delay)
        self.set_bearer(bearer, True)
        self.set_state(modem, "connected")
        if self.on_connect is not None:
            maybe = self.on_connect(modem)
            if inspect.isawaitable(maybe):
                await maybe
        log.info("stand-in ModemManager: %s connected bearer %s", modem.path, bearer.path)
        return bearer.path

    async def simple_disconnect(self, modem: FakeModem, path: str) -> None:
        self._authorize("Disconnect", modem)
        chosen = [b for b in modem.bearers if path in ("/", b.path)]
        if not chosen:
            raise DBusError(ERR + "Core.NotFound", f"No bearer with path '{path}' found")
        self.set_state(modem, "disconnecting")
        await asyncio.sleep(0)
        for bearer in chosen:
            self.set_bearer(bearer, False)
        self.set_state(modem, "registered")
