"""The uplink ladder's ``driver-rebind`` rung on a real kernel (the QEMU guest of
tests/qemu): the guest's USB NIC (QEMU's usb-net, bound by a usbnet driver as most 4G
modems are) unbound from its driver and bound again through the real sysfs, and a PCI NIC
refused as not a USB interface."""

from __future__ import annotations

import json
from typing import Any

from tests.qemu import bed
from tests.qemu.support import USBNET


def test_driver_rebind_unbinds_and_binds_the_usb_nics_driver_on_the_real_sysfs(
        vm: bed.VM) -> None:
    res = vm.run(["python3", f"{bed.SRC}/tests/qemu/guest_rebind.py"], timeout=120)
    got: dict[str, Any] = json.loads(res.check("guest_rebind.py").out)
    assert got["usable"], got
    assert "error" not in got, got
    driver = got["before"]["driver"]
    assert driver in USBNET, got
    assert got["target"] == f"usb {got['interface']} ({driver})"
    assert got["restart_seconds"] <= got["bound"]
    ((_, old),) = got["before"]["nets"]
    timeline = got["timeline"]
    # unbound: no driver and no netdev; bound again: the same driver, a new netdev
    assert any(s["driver"] == "" and not s["nets"] for s in timeline), timeline
    assert got["after"]["driver"] == driver, got["after"]
    ((_, new),) = got["after"]["nets"]
    assert new != old
    assert got["refusals"], "the guest has PCI NICs to refuse"
    for name, refusal in got["refusals"].items():
        assert "is not a USB interface" in refusal, (name, refusal)
        assert "config_problem=True" in refusal
    print(f"\ndriver-rebind {got['interface']} ({driver}): restart() "
          f"{got['restart_seconds']:.2f} s (bound {got['bound']:g} s); ifindex {old} -> "
          f"{new}; timeline {timeline}; refusals {got['refusals']}")
