"""What every stand-in service on the lab's private bus shares: connect, own the name, close.

Why a base: the stand-in systemd (:mod:`edgeheal.lab.systemd_bus`), the stand-in
ModemManager (:mod:`edgeheal.lab.modemmanager`) and the tests' logind and NetworkManager
serve their objects the same way — connect to the bus as a system service, export their
objects, own their well-known name (a refusal by the bus policy is an error, not a silent
second owner), and on close drop the connection and wait until dbus-daemon has seen it go,
so the name is free for the next test. A subclass names its service and exports its objects
in :meth:`BusStandIn._serve`; everything else is here.

Lab code: it imports dbus-fast at the top; the agent never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import ClassVar

from dbus_fast import BusType, RequestNameReply
from dbus_fast.aio import MessageBus

from edgeheal.base.compat import Self
from edgeheal.lab.netns import LabError


class BusStandIn:
    """A stand-in D-Bus service. Use ``async with`` (or start/close)."""

    SERVICE: ClassVar[str]
    """The well-known name the stand-in owns."""
    address: str
    _bus: MessageBus | None = None

    def _serve(self, bus: MessageBus) -> None:
        """Export the objects (before the name is owned, as a real service does)."""
        raise NotImplementedError

    async def _stop(self) -> None:
        """Before the connection closes: cancel the stand-in's own work."""

    async def start(self) -> Self:
        try:
            self._bus = await MessageBus(bus_address=self.address,
                                         bus_type=BusType.SYSTEM).connect()
            self._serve(self._bus)
            reply = await self._bus.request_name(self.SERVICE)
            if reply is not RequestNameReply.PRIMARY_OWNER:
                raise LabError(f"could not own {self.SERVICE} on {self.address}: {reply}")
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        await self._stop()
        if self._bus is not None:
            with contextlib.suppress(Exception):
                self._bus.disconnect()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._bus.wait_for_disconnect(), 5.0)  # type: ignore[no-untyped-call]
            self._bus = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def _connected(self) -> bool:
        return self._bus is not None and self._bus.connected
