"""A minimal D-Bus client for the uplink rungs: connect, call, typed errors.

Why not :mod:`edgeheal.modem`: that is ModemManager's boundary; the rungs also ask
NetworkManager (does it own the modem's connection?) and logind (``Reboot``), one call each,
once in a long while. One connection per use (a fresh connection survives a restarted
dbus-daemon); dbus-fast is imported only here, only when a rung acts or is probed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

DEFAULT_BUS_ADDRESS = "unix:path=/run/dbus/system_bus_socket"
BUS_ENV = "DBUS_SYSTEM_BUS_ADDRESS"
CALL_TIMEOUT = 10.0
DENIED = frozenset({"org.freedesktop.DBus.Error.AccessDenied",
                    "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"})
NOT_THERE = frozenset({"org.freedesktop.DBus.Error.ServiceUnknown",
                       "org.freedesktop.DBus.Error.NameHasNoOwner"})


class BusError(Exception):
    """A call failed: ``name`` is the D-Bus error name (or ``timeout``/``connect``)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def system_address(configured: str = "") -> str:
    return configured or os.environ.get(BUS_ENV) or DEFAULT_BUS_ADDRESS


class Bus:
    def __init__(self, raw: Any) -> None:
        self.raw = raw

    async def call(self, destination: str, path: str, interface: str, member: str,
                   signature: str = "", *body: Any) -> list[Any]:
        from dbus_fast import Message, MessageType  # noqa: PLC0415

        msg = Message(destination=destination, path=path, interface=interface,
                      member=member, signature=signature, body=list(body))
        try:
            reply = await asyncio.wait_for(self.raw.call(msg), CALL_TIMEOUT)
        except TimeoutError as err:
            raise BusError("timeout", f"{interface}.{member} did not answer within "
                           f"{CALL_TIMEOUT:g}s") from err
        if reply.message_type == MessageType.ERROR:
            text = str(reply.body[0]) if reply.body else ""
            raise BusError(str(reply.error_name), f"{interface}.{member}: "
                           f"{reply.error_name}: {text[:300]}")
        return list(reply.body)

    async def has_owner(self, name: str) -> bool:
        (owned,) = await self.call("org.freedesktop.DBus", "/org/freedesktop/DBus",
                                   "org.freedesktop.DBus", "NameHasOwner", "s", name)
        return bool(owned)


@contextlib.asynccontextmanager
async def connect(address: str) -> AsyncIterator[Bus]:
    """A connection to the bus at ``address``; :class:`BusError` ``connect`` if none."""
    from dbus_fast import BusType  # noqa: PLC0415
    from dbus_fast.aio import MessageBus  # noqa: PLC0415

    try:
        raw = MessageBus(bus_address=address, bus_type=BusType.SYSTEM,
                         auth_timeout=CALL_TIMEOUT)
        await asyncio.wait_for(raw.connect(), CALL_TIMEOUT)
    except Exception as err:
        raise BusError("connect", f"cannot connect to the D-Bus at {address}: "
                       f"{type(err).__name__}: {err}") from err
    try:
        yield Bus(raw)
    finally:
        with contextlib.suppress(Exception):
            raw.disconnect()
