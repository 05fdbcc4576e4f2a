"""The client of ModemManager's D-Bus API: read every modem, reconnect, enable; the bus.

The calls are the ones ``mmcli`` makes: ``GetManagedObjects`` and each bearer's
``Properties.GetAll`` to read (what they hold and how a reply is checked:
:mod:`edgeheal.boundaries.modemmanager.readings`), ``Simple.Disconnect`` then
``Simple.Connect`` with the bearer's own ``Properties`` to reconnect, ``Modem.Enable`` to
turn the radio off and on.

Privilege: reading needs nothing (ModemManager's bus policy lets anyone call
``Properties`` and ``ObjectManager``). ``Simple.Connect``/``Disconnect`` and
``Modem.Enable`` (the ``radio-cycle`` rung: ``mmcli --disable`` then ``--enable``) are
allowed by the bus policy and then authorized by polkit action
``org.freedesktop.ModemManager1.Device.Control``
(``systemd/49-edgeheal-uplink.rules`` grants it to user ``edgeheal``); a refusal is a
:class:`~edgeheal.boundaries.modemmanager.readings.ModemError` with ``reason == "denied"``.

The bus is :mod:`edgeheal.boundaries.bus` (which imports dbus-fast only when used: the agent's
memory budget is tight and a node without ModemManager never pays for it); its errors map into
``ModemError`` reasons here. One connection is kept between calls and dropped on any
transport error, so a restarted dbus-daemon or ModemManager costs one failed read.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from edgeheal.base import compat
from edgeheal.boundaries.bus import NO_LIBRARY, Bus, BusError, open_bus, system_address
from edgeheal.boundaries.modemmanager.readings import (
    BEARER_IFACE,
    BEARER_PREFIX,
    MODEM_IFACE,
    MODEM_PREFIX,
    OBJECT_MANAGER_IFACE,
    PROPERTIES_IFACE,
    ROOT_PATH,
    SERVICE,
    Bearer,
    Modem,
    ModemError,
    check_path,
    managed_modems,
    read_bearer,
    read_modem,
)

log = logging.getLogger("edgeheal.modem")  # the name operators grep for

SIMPLE_IFACE = "org.freedesktop.ModemManager1.Modem.Simple"
DEVICE_CONTROL_ACTION = "org.freedesktop.ModemManager1.Device.Control"
"""The polkit action ModemManager checks for ``Simple.Connect``/``Disconnect``."""


class ModemManager:
    """ModemManager's D-Bus API, the few calls edgeheal makes. Not safe for concurrent use
    from several tasks at once (the uplink check and a remedy each hold their own)."""

    def __init__(self, bus_address: str | None = None, *, timeout: float = 5.0,
                 connect_timeout: float = 60.0) -> None:
        """``bus_address`` None: the system bus (``$DBUS_SYSTEM_BUS_ADDRESS`` honoured).
        ``timeout`` bounds one read of all modems; ``connect_timeout`` the reconnect, whose
        ``Simple.Connect`` waits for the network (ModemManager's own limit is minutes)."""
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("ModemManager timeouts must be greater than zero")
        self.bus_address = system_address(bus_address)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._bus: Bus | None = None

    # --- public -------------------------------------------------------------------------

    async def modems(self) -> tuple[Modem, ...]:
        """Every modem ModemManager manages; ``()`` when it runs with none."""
        try:
            async with compat.timeout(self.timeout):
                (objects,) = await self._call(ROOT_PATH, OBJECT_MANAGER_IFACE,
                                              "GetManagedObjects", signature_out="a{oa{sa{sv}}}")
                return await self._parse(objects)
        except compat.TimeoutErrors:
            await self._drop()
            raise ModemError(f"ModemManager did not answer within {self.timeout:g}s on "
                             f"{self.bus_address}", reason="timeout") from None

    async def reconnect(self, modem: Modem, bearer: Bearer) -> None:
        """``Simple.Disconnect(bearer)`` then ``Simple.Connect(bearer's Properties)`` on the
        modem, as ``mmcli --simple-disconnect`` / ``--simple-connect`` would."""
        from dbus_fast import Variant

        check_path(modem.path, MODEM_PREFIX, "modem path")
        check_path(bearer.path, BEARER_PREFIX, "bearer path")
        settings = dict(bearer.properties)
        if not settings or not all(isinstance(k, str) and isinstance(v, Variant)
                                   for k, v in settings.items()):
            raise ModemError(f"bearer {bearer.path} has no usable Properties to reconnect with",
                             reason="malformed")
        try:
            async with compat.timeout(self.connect_timeout):
                try:
                    await self._call(modem.path, SIMPLE_IFACE, "Disconnect", "o",
                                     [bearer.path])
                except ModemError as err:
                    if err.reason in ("denied", "absent", "timeout"):
                        raise
                    # a session the network already dropped may not disconnect cleanly;
                    # Connect is what heals, and ModemManager serializes the two
                    log.warning("Simple.Disconnect of %s failed, connecting anyway: %s",
                                bearer.path, err, extra={"modem": modem.path})
                (path,) = await self._call(modem.path, SIMPLE_IFACE, "Connect", "a{sv}",
                                           [settings], signature_out="o")
        except compat.TimeoutErrors:
            await self._drop()
            raise ModemError(f"reconnecting {modem.path} took longer than "
                             f"{self.connect_timeout:g}s", reason="timeout") from None
        log.info("modem %s reconnected: bearer %s", modem.path, path,
                 extra={"modem": modem.path})

    async def enable(self, modem: Modem, on: bool) -> None:
        """``Modem.Enable(on)``: what ``mmcli -m X --disable``/``--enable`` do. Disabling
        turns the radio off (ModemManager tears the sessions down and the modem detaches
        from the network); enabling powers it on again and re-registers, which is how a
        refused attach is retried without a power cycle. Bounded by ``connect_timeout``."""
        check_path(modem.path, MODEM_PREFIX, "modem path")
        try:
            async with compat.timeout(self.connect_timeout):
                await self._call(modem.path, MODEM_IFACE, "Enable", "b", [on])
        except compat.TimeoutErrors:
            await self._drop()
            raise ModemError(f"{'enabling' if on else 'disabling'} {modem.path} took longer "
                             f"than {self.connect_timeout:g}s", reason="timeout") from None
        log.info("modem %s %s", modem.path, "enabled" if on else "disabled",
                 extra={"modem": modem.path})

    async def close(self) -> None:
        await self._drop()

    # --- the bus ------------------------------------------------------------------------

    async def _connect(self) -> Bus:
        if self._bus is not None and self._bus.connected:
            return self._bus
        await self._drop()
        try:
            # bounded by the caller's timeout (a read's or a reconnect's), as the calls are
            self._bus = await open_bus(self.bus_address, limit=None,
                                       auth_timeout=self.timeout)
        except BusError as err:
            prefix = "reading ModemManager " if err.name == NO_LIBRARY else ""
            raise ModemError(f"{prefix}{err}", reason="absent") from err
        return self._bus

    async def _drop(self) -> None:
        bus, self._bus = self._bus, None
        if bus is not None:
            await bus.close()

    async def _call(self, path: str, interface: str, member: str, signature: str = "",
                    body: list[Any] | None = None, *, signature_out: str = "") -> list[Any]:
        bus = await self._connect()
        try:
            return await bus.call(SERVICE, path, interface, member, signature, body or [],
                                  limit=None, returns=signature_out)
        except BusError as err:
            raise await self._error(err, path) from err

    async def _error(self, err: BusError, path: str) -> ModemError:
        """``err`` as a ModemError: its kind is the reason, in ModemManager's words."""
        what, name = err.call, err.name
        if err.kind == "disconnected":
            await self._drop()
            return ModemError(str(err), reason="absent")
        if err.kind == "absent":
            return ModemError(f"ModemManager ({SERVICE}) is not running on the bus at "
                              f"{self.bus_address} ({what}: {name})", reason="absent")
        if err.kind == "denied":
            return ModemError(f"{what} on {path} was refused ({name}): allow polkit "
                              f"action {DEVICE_CONTROL_ACTION} to this user "
                              "(systemd/49-edgeheal-uplink.rules) or fix the bus policy",
                              reason="denied")
        if err.kind == "malformed":
            return ModemError(f"{what} on {path}: {err.detail}", reason="malformed")
        return ModemError(f"{what} on {path} failed: {name}: {err.detail[:200]}",
                          reason="gone" if err.kind == "gone" else "failed")

    # --- reading -----------------------------------------------------------------------

    async def _parse(self, objects: dict[str, dict[str, dict[str, Any]]]) -> tuple[Modem, ...]:
        modems = []
        for path, props, gpp in managed_modems(objects):
            modem, bearer_paths = read_modem(path, props, gpp)
            bearers = []
            for bearer_path in bearer_paths:
                check_path(bearer_path, BEARER_PREFIX, f"{path}: Bearers")
                bearer = await self._bearer(bearer_path)
                if bearer is not None:
                    bearers.append(bearer)
            modems.append(dataclasses.replace(modem, bearers=tuple(bearers)))
        return tuple(modems)

    async def _bearer(self, path: str) -> Bearer | None:
        try:
            (props,) = await self._call(path, PROPERTIES_IFACE, "GetAll", "s", [BEARER_IFACE],
                                        signature_out="a{sv}")
        except ModemError as err:
            if err.reason == "gone":  # deleted between the two reads
                log.debug("bearer %s went away while reading it", path)
                return None
            raise
        return read_bearer(path, props)


__all__ = ["DEVICE_CONTROL_ACTION", "SIMPLE_IFACE", "ModemManager"]
