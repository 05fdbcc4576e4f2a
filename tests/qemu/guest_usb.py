"""Runs inside the QEMU guest (tests/qemu): the uplink ladder's ``usb-reauthorize`` rung as
the uplink actor uses it — built by :func:`edgeheal.agent.remediation.modes.factory` from a
validated config whose ``[remediation.uplink] usb_device`` names the USB NIC's device the
way an operator would (``1-1``), probed through :func:`~edgeheal.agent.remediation.modes.probe`,
then ``restart()`` within the registration's own bound — against the real kernel's sysfs.
While it acts, the USB device's ``authorized`` and its network interface (name, ifindex)
are sampled every 20 ms, so the host test sees the kernel tear the interface down and
re-enumerate it. Then the refusals on the real tree: the root hub, a device that does not
exist, a USB interface (not a device). Prints one JSON document, one entry per job.

Usage: ``python3 guest_usb.py [refusals] [reauthorize]`` (root: the sysfs writes are
root's; one process for both, as an import costs seconds under TCG)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from edgeheal import remedies
from edgeheal import settings as validation
from edgeheal.agent.remediation import modes
from edgeheal.base import compat
from edgeheal.config import ConfigError
from edgeheal.remedies import RemedyError

USBNET = ("cdc_ether", "cdc_subset", "rndis_host")
DEVICES = Path("/sys/bus/usb/devices")
MODE = "usb-reauthorize"


def usb_nic() -> tuple[str, Path]:
    """(interface, its USB device's real sysfs directory) of the guest's usbnet NIC."""
    for net in Path("/sys/class/net").iterdir():
        driver = net / "device" / "driver"
        if driver.exists() and driver.resolve().name in USBNET:
            return net.name, (net / "device").resolve().parent  # interface -> device
    raise SystemExit("no usbnet NIC in the guest")


def nets(device: Path) -> list[tuple[str, int]]:
    """The network interfaces under ``device``'s USB interfaces: (name, ifindex)."""
    out = []
    for net in device.glob("*:*/net/*"):
        with contextlib.suppress(OSError, ValueError):  # going away
            out.append((net.name, int((net / "ifindex").read_text())))
    return out


def sample(device: Path, t0: float) -> dict[str, Any]:
    try:
        authorized = (device / "authorized").read_text().strip()
    except OSError:
        authorized = "?"
    return {"t": round(time.monotonic() - t0, 3), "authorized": authorized,
            "nets": nets(device)}


def no_kube() -> Any:
    raise AssertionError("the usb-reauthorize rung asked for a Kubernetes client")


def rung(usb_device: str) -> tuple[Any, float]:
    """The rung as the uplink actor builds it, and the registration's bound on restart()."""
    config = validation.loads(f'[uplink]\ninterfaces = ["en*", "usb*"]\n'
                              f'[remediation.uplink]\nusb_device = "{usb_device}"\n')
    make = modes.factory(config, no_kube, remedies.UPLINK)
    reg = remedies.by_mode(MODE, remedies.UPLINK)
    assert reg is not None
    return make(MODE), reg.restart_bound(config)


async def reauthorize() -> dict[str, Any]:
    ifname, device = usb_nic()
    name = device.name
    assert (DEVICES / name).resolve() == device, (name, device)
    before = nets(device)
    remedy, bound = rung(name)
    availability = await modes.probe(remedy)
    out: dict[str, Any] = {"ifname": ifname, "usb_device": name, "device": str(device),
                           "before": before, "bound": bound, "usable": availability.usable,
                           "why": availability.why}
    if not availability.usable:
        return out
    attr = device / "authorized"
    attr.chmod(0o664)  # as the udev rule of docs/uplink-privileges.md gives it to a group
    t0 = time.monotonic()
    timeline = [sample(device, t0)]

    async def watch() -> None:
        while True:
            s = sample(device, t0)
            if (s["authorized"], s["nets"]) != (timeline[-1]["authorized"],
                                                  timeline[-1]["nets"]):
                timeline.append(s)
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    try:
        async with compat.timeout(bound):
            outcome = await remedy.restart()
        out["restart_seconds"] = round(time.monotonic() - t0, 3)
        out["target"] = outcome.target
        out["after_restart"] = sample(device, t0)
        old = {index for _, index in before}
        # the new interface may come after restart() returned; udev's rename of it surely
        for _ in range(400):  # 20 s
            if (now := nets(device)) and not {i for _, i in now} & old:
                break
            await asyncio.sleep(0.05)
        out["back_seconds"] = round(time.monotonic() - t0, 3)
        settle = await asyncio.create_subprocess_exec("udevadm", "settle", "--timeout=20")
        await settle.wait()
        out["settled_seconds"] = round(time.monotonic() - t0, 3)
    except RemedyError as err:
        out["error"] = str(err)
    finally:
        watcher.cancel()
        timeline.append(sample(device, t0))
    out["after"] = nets(device)
    out["mode_after"] = oct(attr.stat().st_mode & 0o777)  # the device's node survived?
    attr.chmod(0o644)
    out["timeline"] = timeline
    return out


async def refusals() -> dict[str, Any]:
    _, device = usb_nic()
    before = nets(device)
    hub = device.parent  # the root hub the NIC hangs off (usb1)
    interface = next(device.glob("*:*"))  # 1-1:1.0, which has an authorized file too
    out: dict[str, Any] = {"hub": hub.name, "hub_exists": (DEVICES / hub.name).is_dir(),
                           "interface": interface.name, "nets_before": before}
    try:
        validation.loads(f'[remediation.uplink]\nusb_device = "{hub.name}"\n')
        out["config_hub"] = "accepted"
    except ConfigError as err:
        out["config_hub"] = str(err)
    remedy, _ = rung(device.name)
    cases = {"root_hub": hub.name, "missing": "7-7", "usb_interface": interface.name}
    for case, name in cases.items():
        # what ``usb_device = "modem"`` may resolve to, past the config rule
        remedy.device = name
        availability = await modes.probe(remedy)
        try:
            await remedy.restart()
            acted = "acted"
        except RemedyError as err:
            acted = f"RemedyError(config_problem={err.config_problem}): {err}"
        out[case] = {"usable": availability.usable, "why": availability.why,
                     "restart": acted}
    out["hub_authorized"] = (hub / "authorized").read_text().strip()
    out["nets"] = nets(device)
    return out


if __name__ == "__main__":
    jobs = {"reauthorize": reauthorize, "refusals": refusals}
    print(json.dumps({name: asyncio.run(jobs[name]()) for name in sys.argv[1:]}))
