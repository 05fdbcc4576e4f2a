"""The QEMU bed as a fixture: one guest per test session (per xdist worker; all the guest
tests live in one module, so ``--dist loadfile`` keeps them on one worker), booted with
-snapshot inside a network namespace of the test's own, with three NICs on real drivers:
e1000e and virtio_net (on taps that exist only in that namespace) and a USB cdc_ether NIC
on a hub that goes nowhere. Always torn down (QEMU killed, files and namespace removed).
Also the module's long-running guest jobs: the check's cases, the usb-reauthorize rung.

A missing QEMU/debootstrap/busybox is a failure, not a skip: CI installs them
(``install.sh --dev``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeheal.lab import nspawn
from edgeheal.lab.netns import Sandbox
from tests.qemu import bed
from tests.qemu.support import CheckCases, Enforcing, nics, usb_nic

NICS = (
    # e1000e: PCI slot 8 -> udev names it ens8; the kernel's name is ethN first
    "-netdev", "tap,id=ne,ifname=qe0,script=no,downscript=no",
    "-device", "e1000e,netdev=ne,id=nic_e,addr=0x8,mac=52:54:00:00:00:08",
    # virtio_net on a tap with vnet_hdr: the only way QEMU offers it checksum offload
    "-netdev", "tap,id=nv,ifname=qv0,script=no,downscript=no,vnet_hdr=on",
    "-device", "virtio-net-pci,netdev=nv,id=nic_v,addr=0x9,mac=52:54:00:00:00:09",
    # cdc_ether (usbnet), like most 4G modems: no checksum offload at all
    "-netdev", "hubport,id=nu,hubid=7",
    "-device", "usb-net,netdev=nu,id=nic_u,mac=52:54:00:00:00:0a",
)


@pytest.fixture(scope="session")
def guest_image() -> bed.Image:
    if os.geteuid() != 0:
        pytest.skip("the QEMU bed needs root (network namespaces, taps)")
    cache = Path(os.environ.get("EDGEHEAL_TEST_CACHE", str(nspawn.DEFAULT_CACHE)))
    return bed.image(cache)


@pytest.fixture(scope="session")
def vm(guest_image: bed.Image) -> Iterator[bed.VM]:
    sandbox = Sandbox()
    machine = bed.VM(guest_image, netns=sandbox.netns("q"), devices=NICS)
    try:
        began = time.monotonic()
        machine.boot()
        print(f"\nQEMU guest booted in {time.monotonic() - began:.1f} s "
              f"(image built in {guest_image.build_seconds:.0f} s; 0 = cached)")
        yield machine
    finally:
        machine.close()
        sandbox.close()


@pytest.fixture(scope="module")
def check_cases(vm: bed.VM) -> Iterator[CheckCases]:
    cases = CheckCases(vm)
    try:
        cases.start()
        yield cases
    finally:
        cases.stop()


@pytest.fixture
def check_verdicts(check_cases: CheckCases) -> dict[str, Any]:
    return check_cases.outcome()


@pytest.fixture(scope="module")
def usb_rung(vm: bed.VM) -> Iterator[dict[str, Any]]:
    """One guest Python (imports cost seconds under TCG) for both tests: the rung's refusals
    on the real tree, then the rung as the uplink actor runs it (guest_usb.py: probe, then
    ``restart()`` within its bound, ``usb_device`` = the NIC's USB device name) while the
    enforcer runs; what the enforcer holds 1 s after it saw the re-enumerated NIC."""
    enforcer = Enforcing(vm)
    try:
        enforcer.start()
        usb = usb_nic(nics(vm))
        enforcer.until("boot pass", lambda s: usb in s["interfaces"])
        res = vm.run(["python3", f"{bed.SRC}/tests/qemu/guest_usb.py", "refusals",
                      "reauthorize"], timeout=120)
        got = json.loads(res.check("guest_usb.py").out)
        if len(after := got["reauthorize"].get("after") or []) == 1:  # else the test says
            ((final, index),) = after
            enforcer.until("re-enumerated NIC seen",
                           lambda s: s["ifindex"].get(final) == index)
            time.sleep(1.0)  # let any storm show
        yield {**got, "usb": usb, "nics": nics(vm), "enforcer": enforcer.state(),
               "log": enforcer.log()}
    finally:
        enforcer.stop()
