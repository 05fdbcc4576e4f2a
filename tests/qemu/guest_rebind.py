"""Runs inside the QEMU guest (tests/qemu): the uplink ladder's ``driver-rebind`` rung as
the uplink actor uses it — built by :func:`edgeheal.agent.remediation.modes.factory` from a
validated config listing ``driver-rebind`` in ``[remediation.uplink] rungs``, probed, then
``restart()`` within the registration's own bound — against the real kernel's sysfs and
the real usbnet driver of the guest's USB NIC. While it acts, the interface's driver link
and its network interface (name, ifindex) are sampled every 20 ms, so the host test sees
the kernel unbind the driver (the netdev goes) and bind it again (a new netdev). Then the
refusal on the real tree: a PCI NIC is not a USB interface. Prints one JSON document.

Usage: ``python3 guest_rebind.py`` (root: the driver's ``bind``/``unbind`` are root's)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from edgeheal import remedies
from edgeheal import settings as validation
from edgeheal.agent.remediation import modes
from edgeheal.base import compat
from edgeheal.remedies import RemedyError
from edgeheal.remedies.driver_rebind import resolve

USBNET = ("cdc_ether", "cdc_subset", "rndis_host")
MODE = "driver-rebind"
NET = Path("/sys/class/net")


def usb_nic() -> tuple[str, Path]:
    """(interface, its USB interface's real sysfs directory) of the guest's usbnet NIC."""
    for net in NET.iterdir():
        driver = net / "device" / "driver"
        if driver.exists() and driver.resolve().name in USBNET:
            return net.name, (net / "device").resolve()
    raise SystemExit("no usbnet NIC in the guest")


def sample(interface: Path, t0: float) -> dict[str, Any]:
    driver = interface / "driver"
    nets = []
    for net in interface.glob("net/*"):
        with contextlib.suppress(OSError, ValueError):  # going away
            nets.append((net.name, int((net / "ifindex").read_text())))
    return {"t": round(time.monotonic() - t0, 3),
            "driver": driver.resolve().name if driver.exists() else "", "nets": nets}


def refusals(usb: str) -> dict[str, str]:
    """What the rung's resolution says of every other device's NIC (the PCI ones)."""
    out = {}
    for net in NET.iterdir():
        if net.name == usb or not (net / "device").exists():
            continue
        try:
            resolve(Path("/sys"), net.name)
            out[net.name] = "resolved"
        except RemedyError as err:
            out[net.name] = f"RemedyError(config_problem={err.config_problem}): {err}"
    return out


def no_kube() -> Any:
    raise AssertionError("the driver-rebind rung asked for a Kubernetes client")


async def rebind() -> dict[str, Any]:
    ifname, interface = usb_nic()
    config = validation.loads('[uplink]\ninterfaces = ["en*", "usb*"]\n[remediation.uplink]\n'
                              'rungs = ["link-bounce", "driver-rebind"]\n')
    remedy = modes.factory(config, no_kube, remedies.UPLINK)(MODE)
    reg = remedies.by_mode(MODE, remedies.UPLINK)
    assert reg is not None
    bound = reg.restart_bound(config)
    t0 = time.monotonic()
    before = sample(interface, t0)
    availability = await modes.probe(remedy)
    out: dict[str, Any] = {"ifname": ifname, "interface": interface.name, "before": before,
                           "bound": bound, "usable": availability.usable,
                           "why": availability.why}
    out["refusals"] = refusals(ifname)
    if not availability.usable:
        return out
    timeline = [before]

    async def watch() -> None:
        while True:
            s = sample(interface, t0)
            if (s["driver"], s["nets"]) != (timeline[-1]["driver"], timeline[-1]["nets"]):
                timeline.append(s)
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    try:
        async with compat.timeout(bound):
            outcome = await remedy.restart()
        out["restart_seconds"] = round(time.monotonic() - t0, 3)
        out["target"] = outcome.target
        old = {i for _, i in before["nets"]}
        for _ in range(400):  # 20 s: the new netdev may come after restart() returned
            now = sample(interface, t0)
            if now["nets"] and not {i for _, i in now["nets"]} & old:
                break
            await asyncio.sleep(0.05)
        settle = await asyncio.create_subprocess_exec("udevadm", "settle", "--timeout=20")
        await settle.wait()
    except RemedyError as err:
        out["error"] = str(err)
    finally:
        watcher.cancel()
    out["after"] = sample(interface, t0)
    out["timeline"] = timeline
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(rebind())))
