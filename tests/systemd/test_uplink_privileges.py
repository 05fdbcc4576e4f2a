"""What the uplink ladder's USB rung adds to the unit, only where configured: one writable
sysfs file, no capability, the same systemd-analyze exposure (<= 3.0, as scripts/test
requires of the shipped unit)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD / "edgeheal.service"
DROP_IN = SYSTEMD / "usb-reauthorize.conf"
UDEV = SYSTEMD / "70-edgeheal-usb-reauthorize.rules"


def exposure(directory: Path, unit: Path) -> float:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing (package systemd)")
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                          capture_output=True, text=True, timeout=60, check=False,
                          cwd=directory)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    return float(match.group(1))


def staged(tmp_path: Path, *, drop_in: bool) -> Path:
    unit = tmp_path / "edgeheal.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/edgeheal", "/bin/true"))
    if drop_in:
        (tmp_path / "edgeheal.service.d").mkdir()
        shutil.copy(DROP_IN, tmp_path / "edgeheal.service.d" / DROP_IN.name)
    return unit


def test_the_drop_in_keeps_the_units_exposure_and_verifies(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    base = exposure(tmp_path, staged(tmp_path / "a", drop_in=False))
    with_usb = exposure(tmp_path, staged(tmp_path / "b", drop_in=True))
    assert with_usb <= 3.0
    assert with_usb == base
    proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "b/edgeheal.service")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_drop_in_opens_exactly_one_sysfs_file_and_adds_no_capability() -> None:
    lines = [ln for ln in DROP_IN.read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines == ["[Service]", "ReadWritePaths=/sys/bus/usb/devices/1-1/authorized"]
    assert "/sys" not in "".join(ln for ln in UNIT.read_text().splitlines()
                                 if ln.startswith("ReadWritePaths")), \
        "the shipped unit must not open sysfs: only the drop-in, where configured"


def test_the_udev_rule_names_the_same_device_and_only_its_authorized_attribute() -> None:
    rule = " ".join(ln.rstrip("\\") for ln in UDEV.read_text().splitlines()
                    if ln and not ln.startswith("#"))
    kernel = re.search(r'KERNEL=="([^"]+)"', rule)
    assert kernel is not None
    assert kernel.group(1) == "1-1"
    assert re.findall(r"/sys%p/(\w+)", rule) == ["authorized", "authorized"]
    assert 'ENV{DEVTYPE}=="usb_device"' in rule
    assert "chmod 0664" in rule
    assert "chgrp edgeheal" in rule


# --- the driver-rebind rung: the same model, two attributes of one driver ----------------

REBIND_DROP_IN = SYSTEMD / "driver-rebind.conf"
REBIND_UDEV = SYSTEMD / "71-edgeheal-driver-rebind.rules"


def test_the_rebind_drop_in_opens_exactly_one_drivers_bind_and_unbind() -> None:
    lines = [ln for ln in REBIND_DROP_IN.read_text().splitlines()
             if ln and not ln.startswith("#")]
    assert lines == ["[Service]", "ReadWritePaths=/sys/bus/usb/drivers/qmi_wwan/bind "
                     "/sys/bus/usb/drivers/qmi_wwan/unbind"]


def test_the_rebind_drop_in_keeps_the_units_exposure_and_verifies(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    base = exposure(tmp_path, staged(tmp_path / "a", drop_in=False))
    unit = staged(tmp_path / "b", drop_in=False)
    (tmp_path / "b" / "edgeheal.service.d").mkdir()
    shutil.copy(REBIND_DROP_IN, tmp_path / "b" / "edgeheal.service.d" / REBIND_DROP_IN.name)
    assert exposure(tmp_path, unit) == base
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_rebind_udev_rule_names_the_same_driver_and_only_its_two_attributes() -> None:
    rule = " ".join(ln.rstrip("\\") for ln in REBIND_UDEV.read_text().splitlines()
                    if ln and not ln.startswith("#"))
    assert 'SUBSYSTEM=="drivers"' in rule
    assert 'DEVPATH=="/bus/usb/drivers/qmi_wwan"' in rule
    assert re.findall(r"/sys%p/(\w+)", rule) == ["bind", "unbind", "bind", "unbind"]
    assert "chmod 0220" in rule
    assert "chgrp edgeheal" in rule
