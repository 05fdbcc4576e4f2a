"""The ``driver-rebind`` rung: the uplink's USB interface unbound from its driver and bound
again, through sysfs.

Why, and why before ``usb-reauthorize``: a modem whose control port hangs (a QMI request
that never answers, ``uqmi`` stuck forever; ModemManager then drops or fails the modem)
or whose data session is wedged in the driver is often cured by re-initialising the one
driver that serves it — ``qmi_wwan`` or ``cdc_mbim`` own both the net device and the
``cdc-wdm`` control port of their interface, ``cdc_ether``/``rndis_host`` the net device —
which is what LF EVE's mmagent does first ("reloads the drivers", docs/WIRELESS.md). It is
lighter than re-authorizing the whole USB device: the device is not re-enumerated, its
other interfaces (the AT and GNSS ports, a second function) stay bound, and the modem's
baseband is not reset.

How (the kernel's ``Documentation/ABI/testing/sysfs-bus-usb`` and the driver core's
``bind``/``unbind`` attributes, ``drivers/base/bus.c``): the uplink's net device
``/sys/class/net/<if>/device`` names its USB interface (``1-1:1.4``); that interface must
be ``/sys/bus/usb/devices/<interface>`` (the same node, resolved), its ``driver`` link must
resolve to ``/sys/bus/usb/drivers/<driver>``; the rung writes the interface's name to
``<driver>/unbind``, waits :data:`SETTLE`, then writes it to ``<driver>/bind``. Nothing
outside ``/sys/bus/usb`` is ever written, and the one link followed out of it is the net
device's own ``device`` link, only to read the interface's name and compare nodes: every
link is resolved and compared with the path built from validated names
(:data:`INTERFACE`, :data:`DRIVER`) under ``/sys/bus/usb`` (itself no symlink), and a name,
a link or an attribute that does not fit is refused with what was wrong. The hub
driver and the device-level ``usb`` driver are refused (rebinding either would cut every
device behind it, or re-probe every interface at once: that is ``usb-reauthorize``'s job).

Opt-in: only where ``driver-rebind`` is in ``[remediation.uplink] rungs`` (never in the
default). The interface after the rung comes back under the same name (udev renames it
as before); the ladder's verification — the uplink check and every direct-path target ok
again — decides whether it cured.

Privilege: write access to exactly that driver's ``bind`` and ``unbind`` (root's, mode
0200): a udev rule gives them to group ``edgeheal`` and a unit drop-in re-opens the two
files in the read-only ``/sys`` (``systemd/71-edgeheal-driver-rebind.rules``,
``systemd/driver-rebind.conf``; docs/uplink-privileges.md), as for ``usb-reauthorize``.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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

MODE = "driver-rebind"
INTERFACE = re.compile(r"\d{1,3}-\d{1,3}(\.\d{1,3}){0,6}:\d{1,3}\.\d{1,3}")
"""A USB interface's sysfs name (bus-port[.port...]:config.interface)."""
DRIVER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
REFUSED_DRIVERS = frozenset({"hub", "usb", "usbfs"})
"""Drivers never rebound: the hub (every device behind it), the device-level driver
(every interface at once: ``usb-reauthorize``), usbfs (a user-space program's claim)."""
SETTLE = 1.0
"""Seconds between unbind and bind (the driver's remove finishes, the netdev goes)."""
NETDEV = re.compile(r"[^/\x00\s]{1,15}")


@dataclass(frozen=True, slots=True)
class Target:
    netdev: str
    interface: str
    driver: str
    driver_dir: Path


def resolve(sysfs: Path, netdev: str) -> Target:
    """The USB interface and driver of net device ``netdev``, strictly under
    ``<sysfs>/bus/usb`` (see the module docstring); :class:`RemedyError` naming what did
    not fit."""
    if not NETDEV.fullmatch(netdev) or netdev in (".", ".."):
        raise RemedyError(f"{netdev!r} is not a network interface name", config_problem=True)
    link = sysfs / "class" / "net" / netdev / "device"
    if not link.is_symlink():
        raise RemedyError(f"{netdev} has no device link ({link}): gone, or not a device's "
                          "interface")
    real = Path(os.path.realpath(link))
    name = real.name
    if not INTERFACE.fullmatch(name):
        raise RemedyError(f"{netdev}'s device {name!r} is not a USB interface (not a "
                          "USB modem's net device); refused", config_problem=True)
    usb = sysfs / "bus" / "usb"
    node = usb / "devices" / name
    if not node.is_symlink() or Path(os.path.realpath(node)) != real:
        raise RemedyError(f"{netdev}'s device {name} is not {node}; refused")
    driver_link = node / "driver"
    if not driver_link.is_symlink():
        raise RemedyError(f"USB interface {name} has no driver bound (nothing to rebind)")
    driver_real = Path(os.path.realpath(driver_link))
    driver = driver_real.name
    drivers = Path(os.path.realpath(sysfs)) / "bus" / "usb" / "drivers"
    if Path(os.path.realpath(usb / "drivers")) != drivers:
        raise RemedyError(f"{usb / 'drivers'} is a link elsewhere; refused")
    if not DRIVER.fullmatch(driver) or driver_real.parent != drivers:
        raise RemedyError(f"USB interface {name}'s driver link leads outside "
                          f"{usb / 'drivers'} ({driver_real}); refused")
    if driver in REFUSED_DRIVERS:
        raise RemedyError(f"USB interface {name} is driven by {driver!r}, which is never "
                          "rebound; refused", config_problem=True)
    driver_dir = usb / "drivers" / driver
    for attr in ("unbind", "bind"):
        path = driver_dir / attr
        if path.is_symlink() or not path.is_file():
            raise RemedyError(f"{path} is not the driver's {attr} attribute; refused")
    return Target(netdev, name, driver, driver_dir)


class DriverRebind:
    mode = MODE

    def __init__(self, config: Config, *, sysfs: str | Path = "/sys",
                 settle: float = SETTLE) -> None:
        self.interfaces = config.uplink.interfaces
        self.sysfs = Path(sysfs)
        self.settle = settle

    def _target(self) -> Target:
        from edgeheal.base.ifglob import matches

        net = self.sysfs / "class" / "net"
        try:
            names = sorted(p.name for p in net.iterdir())
        except OSError as err:
            raise RemedyError(f"cannot list {net}: {err.strerror}") from err
        found: list[Target] = []
        errors: list[str] = []
        for name in names:
            if not matches(name, self.interfaces):
                continue
            try:
                found.append(resolve(self.sysfs, name))
            except RemedyError as err:
                errors.append(str(err))
        if len(found) == 1:
            return found[0]
        if found:
            raise RemedyError(f"{len(found)} uplink interfaces are USB interfaces ("
                              + ", ".join(t.netdev for t in found) + "): which modem is "
                              "meant is ambiguous; refused", config_problem=True)
        raise RemedyError("; ".join(errors) or "no uplink interface "
                          f"({', '.join(self.interfaces)}) exists")

    async def probe(self) -> Availability:
        try:
            target = self._target()
        except RemedyError as err:
            return Availability(False, str(err))
        return Availability(True, f"rebinds USB interface {target.interface} of "
                            f"{target.netdev} to driver {target.driver}")

    async def restart(self) -> RemedyOutcome:
        target = self._target()
        unbind, bind = target.driver_dir / "unbind", target.driver_dir / "bind"
        try:
            await asyncio.to_thread(unbind.write_text, target.interface, encoding="ascii")
        except OSError as err:
            raise RemedyError(f"cannot write {unbind}: {err.strerror}",
                              config_problem=isinstance(err, PermissionError)) from err
        try:
            await asyncio.sleep(self.settle)
        finally:
            try:
                await asyncio.to_thread(bind.write_text, target.interface, encoding="ascii")
            except OSError as err:
                raise RemedyError(f"unbound {target.interface} from {target.driver} but "
                                  f"cannot bind it again: {err.strerror}; `echo "
                                  f"{target.interface} > {bind}` as root, a person may be "
                                  "needed") from err
        return RemedyOutcome(target=f"usb {target.interface} ({target.driver})",
                             detail=f"{target.netdev}: unbind, {self.settle:g}s, bind")


def _unavailable(config: Config) -> str:
    return "" if config.uplink.interfaces else "no [uplink] interfaces"


register(RemedyRegistration(
    mode=MODE, module="driver_rebind", ladder=UPLINK,
    factory=lambda needs: DriverRebind(needs.config), restart_bound=lambda config: 30.0,
    unavailable=_unavailable, settings="remediation.uplink",
    doc="Uplink rung (opt-in) before `usb-reauthorize`: the uplink's USB interface unbound "
        "from its driver and bound again (sysfs, strictly under /sys/bus/usb)."))
