"""The one D-Bus client: connect to the system bus, call a method, one typed error.

Why one: systemd (the ``k3s-service`` remedy), ModemManager
(:mod:`edgeheal.boundaries.modemmanager`), NetworkManager and logind (the uplink rungs) are all
asked the same way, and the parts that go wrong are the bus's, not theirs: an address that is not
usable, a bus that is not there or goes away mid-call, a call nobody answers, a refusal by the bus
policy or polkit, a service that is not running. This module turns each into a :class:`BusError`
with the D-Bus error name and a :attr:`BusError.kind`; the callers map the kind into their own
errors (a remedy's ``config_problem``, a
:class:`~edgeheal.boundaries.modemmanager.readings.ModemError` reason) and add what only
they know (which polkit rule to install).

The bus address: the configured one, else ``$DBUS_SYSTEM_BUS_ADDRESS``, else the system
bus's socket (:func:`system_address`). A reply's error text is cut short and only the error
message is kept, never the call's arguments: a bearer's ``Properties`` (APN credentials)
are sent as arguments, so they cannot reach an error or a log through here.

dbus-fast is imported inside the functions only, never when this module is imported: the
agent's memory budget is tight and a node that never talks D-Bus never pays for it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from edgeheal.base import compat

if TYPE_CHECKING:
    from dbus_fast import Message
    from dbus_fast.aio import MessageBus

DEFAULT_BUS_ADDRESS = "unix:path=/run/dbus/system_bus_socket"
BUS_ENV = "DBUS_SYSTEM_BUS_ADDRESS"
CALL_TIMEOUT = 10.0
"""Seconds one call (or the connection) may take by default: a service on the system bus
answers in milliseconds unless it is stuck."""
DBUS = "org.freedesktop.DBus"
DBUS_PATH = "/org/freedesktop/DBus"
PROPERTIES = "org.freedesktop.DBus.Properties"

Kind = Literal["denied", "absent", "timeout", "gone", "disconnected", "malformed", "config",
               "other"]
"""How a call failed: ``denied`` (the bus policy or polkit said no), ``absent`` (the service
is not on the bus), ``timeout`` (no answer in time), ``gone`` (the object, interface or
method is not there: a modem removed meanwhile), ``disconnected`` (no bus to talk to, or it
went away), ``malformed`` (a reply of another type than asked for), ``config`` (the address
is not usable or dbus-fast is not installed), ``other`` (the service answered another
error)."""

DENIED = frozenset({
    "org.freedesktop.DBus.Error.AccessDenied",
    "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired",
    # ModemManager's answer when polkit refuses it (only ModemManager sends it)
    "org.freedesktop.ModemManager1.Error.Core.Unauthorized",
})
ABSENT = frozenset({
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
})
GONE = frozenset({
    "org.freedesktop.DBus.Error.UnknownObject",
    "org.freedesktop.DBus.Error.UnknownMethod",
    "org.freedesktop.DBus.Error.UnknownInterface",
})
# local error names, for failures that have no D-Bus error name
TIMEOUT = "timeout"
DISCONNECTED = "disconnected"
MALFORMED = "malformed"
NO_LIBRARY = "no-dbus-fast"
BAD_ADDRESS = "bad-address"
MAX_TEXT = 300
"""Characters of a D-Bus error's text kept in a message."""


class BusError(Exception):
    """A D-Bus connection or call failed. ``name`` is the D-Bus error name (or a local one:
    :data:`TIMEOUT`, :data:`DISCONNECTED`, ...), ``kind`` its classification (:data:`Kind`),
    ``call`` the ``Interface.Member`` asked ("" for the connection), ``detail`` the
    service's own error text (shortened). The message says all of it."""

    def __init__(self, message: str, *, name: str, kind: Kind, call: str = "",
                 detail: str = "") -> None:
        super().__init__(message)
        self.name, self.kind, self.call, self.detail = name, kind, call, detail


def classify(name: str) -> Kind:
    """The kind of a D-Bus error name."""
    if name in DENIED:
        return "denied"
    if name in ABSENT:
        return "absent"
    if name in GONE:
        return "gone"
    return "other"


def system_address(configured: str | None = None) -> str:
    """The system bus: ``configured``, else ``$DBUS_SYSTEM_BUS_ADDRESS``, else the socket."""
    return configured or os.environ.get(BUS_ENV) or DEFAULT_BUS_ADDRESS


def _short(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class Bus:
    """One connection. ``raw`` is dbus-fast's MessageBus, for signal handlers."""

    def __init__(self, raw: MessageBus, address: str) -> None:
        self.raw, self.address = raw, address

    @property
    def connected(self) -> bool:
        return bool(self.raw.connected)

    def check(self) -> None:
        """Raise :class:`BusError` ``disconnected`` if the bus went away."""
        if not self.raw.connected:
            raise BusError(f"lost the bus at {self.address}", name=DISCONNECTED,
                           kind="disconnected")

    async def call(self, destination: str, path: str, interface: str,  # noqa: PLR0917
                   member: str, signature: str = "", body: Sequence[Any] = (), *,
                   limit: float | None = CALL_TIMEOUT,
                   returns: str | None = None) -> list[Any]:
        """The reply's body (the arguments are a D-Bus message's fields, in its order).
        ``limit``: seconds to wait for the reply (None: bounded only by the caller's own
        timeout); ``returns``: the reply's signature must be this (else ``malformed``)."""
        from dbus_fast import DBusFastError, Message, MessageType

        what = f"{interface.rsplit('.', 1)[-1]}.{member}"
        msg = Message(destination=destination, path=path, interface=interface, member=member,
                      signature=signature, body=list(body))
        if not self.raw.connected:  # sending on a dead connection only leaves stray errors
            raise BusError(f"{what}: lost the bus at {self.address}", name=DISCONNECTED,
                           kind="disconnected", call=what)
        try:
            async with compat.timeout(limit):  # wait_for before 3.12 can swallow a cancel
                # typed as always a Message; dbus-fast answers None when the bus went away
                reply = cast("Message | None", await self.raw.call(msg))
        except compat.TimeoutErrors as err:
            raise BusError(f"{what}: no answer within {limit or 0:g}s", name=TIMEOUT,
                           kind="timeout", call=what) from err
        except (OSError, EOFError, DBusFastError) as err:
            raise BusError(f"{what}: lost the bus at {self.address}: "
                           f"{err or type(err).__name__}", name=DISCONNECTED,
                           kind="disconnected", call=what) from err
        if reply is None:
            raise BusError(f"{what}: lost the bus at {self.address}", name=DISCONNECTED,
                           kind="disconnected", call=what)
        if reply.message_type is MessageType.ERROR:
            name = reply.error_name or "unknown"
            text = _short(str(reply.body[0])) if reply.body else ""
            raise BusError(f"{what}: {name}: {text}", name=name, kind=classify(name),
                           call=what, detail=text)
        if returns is not None and reply.signature != returns:
            detail = f"reply of type {reply.signature!r}, expected {returns!r}"
            raise BusError(f"{what}: {detail}", name=MALFORMED, kind="malformed", call=what,
                           detail=detail)
        return list(reply.body)

    async def has_owner(self, name: str) -> bool:
        (owned,) = await self.call(DBUS, DBUS_PATH, DBUS, "NameHasOwner", "s", [name])
        return bool(owned)

    async def add_match(self, rule: str) -> None:
        await self.call(DBUS, DBUS_PATH, DBUS, "AddMatch", "s", [rule])

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.raw.disconnect()
        with contextlib.suppress(Exception):
            async with compat.timeout(2.0):
                await self.raw.wait_for_disconnect()  # type: ignore[no-untyped-call]


async def open_bus(address: str, *, limit: float | None = CALL_TIMEOUT,
                   auth_timeout: float = CALL_TIMEOUT) -> Bus:
    """A connection to the bus at ``address`` within ``limit`` seconds (None: bounded only
    by the caller's own timeout and ``auth_timeout``); :class:`BusError` if there is none."""
    try:
        from dbus_fast import BusType, DBusFastError
        from dbus_fast.aio import MessageBus
    except ImportError as err:
        raise BusError("needs dbus-fast, which is not installed (install edgeheal[dbus])",
                       name=NO_LIBRARY, kind="config") from err
    where = f"the D-Bus system bus at {address}"
    try:
        raw = MessageBus(bus_address=address, bus_type=BusType.SYSTEM,
                         **compat.bus_auth_timeout(auth_timeout))
    except (DBusFastError, ValueError) as err:
        raise BusError(f"not a usable D-Bus address: {address}: {err}", name=BAD_ADDRESS,
                       kind="config") from err
    try:
        async with compat.timeout(limit):  # wait_for before 3.12 can swallow a cancel
            await raw.connect()
    except (*compat.TimeoutErrors, OSError, EOFError, DBusFastError, ValueError) as err:
        with contextlib.suppress(Exception):
            raw.disconnect()
        if isinstance(err, compat.TimeoutErrors):
            raise BusError(f"{where} did not answer within {limit or 0:g}s", name=TIMEOUT,
                           kind="timeout") from err
        raise BusError(f"cannot connect to {where}: {err or type(err).__name__}",
                       name=DISCONNECTED, kind="disconnected") from err
    return Bus(raw, address)


@contextlib.asynccontextmanager
async def connect(address: str, *, limit: float = CALL_TIMEOUT) -> AsyncIterator[Bus]:
    """One connection for one use (a fresh connection survives a restarted dbus-daemon)."""
    bus = await open_bus(address, limit=limit, auth_timeout=limit)
    try:
        yield bus
    finally:
        await bus.close()
