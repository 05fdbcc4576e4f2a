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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgeheal.lab import nspawn
from edgeheal.lab.netns import Sandbox
from tests.qemu import bed
from tests.qemu.support import Enforcing, nics, usb_nic

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


VERDICTS_OUT = "/tmp/verdicts.json"


@dataclass
class CheckCases:
    """tests/qemu/guest_check.py, started in the guest when the module starts (all cases
    at once, ~4-5 min: the incident needs the protocol's 180 s) so the other guest tests
    run meanwhile; :meth:`outcome` waits for it. A case that missed a guest-side bound
    carries its ``error``; the tests assert the rest."""

    vm: bed.VM
    began: float = 0.0
    cases: dict[str, Any] | None = None

    def start(self) -> None:
        self.vm.sh("ip netns add edge && ip -n edge link set lo up")
        self.vm.sh(f"rm -f {VERDICTS_OUT}; setsid ip netns exec edge python3 "
                   f"{bed.SRC}/tests/qemu/guest_check.py {VERDICTS_OUT} >/tmp/check.log 2>&1 "
                   "</dev/null & echo $! >/tmp/check.pid")
        self.began = time.monotonic()

    def outcome(self, within: float = 600.0) -> dict[str, Any]:
        deadline = self.began + within
        while self.cases is None:
            res = self.vm.run(["cat", VERDICTS_OUT])
            got = json.loads(res.out) if res.rc == 0 and res.out else {}
            if got.get("done"):
                self.cases = dict(got["cases"])
                print(f"\nthe check's kernel WireGuard cases took "
                      f"{time.monotonic() - self.began:.0f} s")
                break
            if time.monotonic() > deadline:
                log = self.vm.run(["cat", "/tmp/check.log"]).out
                raise AssertionError(f"guest_check.py not done in {within:g} s: {got}\n{log}")
            time.sleep(5)
        return self.cases

    def stop(self) -> None:
        self.vm.run("kill $(cat /tmp/check.pid) 2>/dev/null; for n in 1 2 3 4 5 6 7 8; do "
                    "ip netns del ehc$n 2>/dev/null; done; ip netns del edge 2>/dev/null")


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
