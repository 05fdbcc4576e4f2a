"""The ``usb-reauthorize`` rung: the modem's USB device de-authorized and authorized again.

Why third: a modem whose firmware hangs answers neither a new session nor a link bounce;
writing ``0`` then ``1`` to its sysfs ``authorized`` attribute makes the kernel unbind
every driver of the device and bind them again — the modem re-enumerates as if re-plugged
(most modems reset their baseband on it), without a reboot. The new interface comes back
with TX checksum offload on, which the offload enforcer turns off again within a second:
the incident's own case.

Only where configured (``[remediation.uplink] usb_device``): ``modem`` takes the USB device
ModemManager reports for the modem (``Modem.Device``, a sysfs path), or a device name under
``/sys/bus/usb/devices`` (``1-1``, ``2-1.4``). Root hubs (``usb1``) are refused: that would
de-authorize every device behind them. The attribute must exist (a USB device, not an
interface). Privilege: write access to that one sysfs file (root, or a udev rule giving it
to the agent's user; docs/remediation-uplink.md).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeheal.remedies import (
    UPLINK,
    Availability,
    RemedyError,
    RemedyOutcome,
    RemedyRegistration,
    register,
)

if TYPE_CHECKING:
    from edgeheal.config import Config

MODE = "usb-reauthorize"
USB_PORT = re.compile(r"\d{1,3}-\d{1,3}(\.\d{1,3}){0,6}")
"""A USB device's sysfs name (bus-port[.port...]); root hubs (``usbN``) never match."""
SETTLE = 1.0
"""Seconds between ``authorized`` 0 and 1 (the drivers unbind)."""


class UsbReauthorize:
    mode = MODE

    def __init__(self, config: Config, *, sysfs: str | Path = "/sys",
                 modem_manager: Any = None, settle: float = SETTLE) -> None:
        self.device = config.remediation.uplink.usb_device
        self.sysfs = Path(sysfs)
        self.address = config.uplink.dbus_address
        self._mm = modem_manager
        self.settle = settle

    async def _path(self) -> Path:
        name = self.device
        if name == "modem":
            from edgeheal.boundaries.modemmanager.client import ModemManager
            from edgeheal.boundaries.modemmanager.readings import ModemError

            if self._mm is None:
                self._mm = ModemManager(self.address or None)
            try:
                modems = await self._mm.modems()
            except ModemError as err:
                raise RemedyError(f"ModemManager: {err}") from err
            if len(modems) != 1:
                raise RemedyError(f"usb_device = \"modem\" needs exactly one modem, "
                                  f"ModemManager knows {len(modems)}")
            device = Path(modems[0].device)
            if device.is_absolute() and device.parts[:2] == ("/", "sys"):
                device = self.sysfs.joinpath(*device.parts[2:])
            path = device
        else:
            path = self.sysfs / "bus" / "usb" / "devices" / name
        if not USB_PORT.fullmatch(path.name):
            raise RemedyError(f"{path.name!r} is not a USB device (bus-port name); refused",
                              config_problem=True)
        if not path.exists():
            raise RemedyError(f"no USB device {path.name!r}: nothing at {path} (unplugged, "
                              "or not the device's name)")
        if not (path / "authorized").is_file():
            raise RemedyError(f"{path} has no 'authorized' attribute (not a USB device, or "
                              "gone)")
        return path

    async def probe(self) -> Availability:
        try:
            path = await self._path()
        except RemedyError as err:
            return Availability(False, str(err))
        return Availability(True, f"re-authorizes USB device {path.name}")

    async def restart(self) -> RemedyOutcome:
        path = await self._path()
        attr = path / "authorized"
        try:
            await asyncio.to_thread(attr.write_text, "0\n", encoding="ascii")
        except OSError as err:
            raise RemedyError(f"cannot write {attr}: {err.strerror}",
                              config_problem=isinstance(err, PermissionError)) from err
        try:
            await asyncio.sleep(self.settle)
        finally:
            try:
                await asyncio.to_thread(attr.write_text, "1\n", encoding="ascii")
            except OSError as err:
                raise RemedyError(f"de-authorized {path.name} but cannot authorize it "
                                  f"again: {err.strerror}; a human is needed") from err
        return RemedyOutcome(target=f"usb {path.name}")


def _unavailable(config: Config) -> str:
    return "" if config.remediation.uplink.usb_device else \
        "remediation.uplink.usb_device is empty"


def _validate(config: Config) -> None:
    from edgeheal.config import ConfigError

    device = config.remediation.uplink.usb_device
    if device and device != "modem" and not USB_PORT.fullmatch(device):
        raise ConfigError("remediation.uplink.usb_device",
                          f"expected \"modem\" or a USB device name such as \"1-1\" or "
                          f"\"2-1.4\" (never a root hub), got {device!r}")


register(RemedyRegistration(
    mode=MODE, module="usb_reauthorize", ladder=UPLINK,
    factory=lambda needs: UsbReauthorize(needs.config), restart_bound=lambda config: 30.0,
    unavailable=_unavailable, settings="remediation.uplink", validate=_validate,
    doc="Uplink rung 3: the modem's USB device re-authorized (sysfs `authorized` 0 then "
        "1), only where `usb_device` is configured."))
