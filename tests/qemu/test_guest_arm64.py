"""arm64 on a real arm64 kernel: Debian 12's ``linux-image-arm64`` booted under
``qemu-system-aarch64 -M virt`` (TCG), its userland and the agent's dependencies arm64
(tests/qemu/arm64.py), the checkout's code. qemu-user cannot run these: it has no ethtool
ioctl (ENOSYS) and no generic netlink (EPROTONOSUPPORT), so this is where the offload fix
and the kernel WireGuard reader are proven on arm64.

What runs (one guest for the module; the check's cases start with the first fixture and
run while the other tests do, as in test_guest_kernel.py):

- the guest is what it claims: an aarch64 kernel and Python, the arm64 wheels' compiled
  modules loaded (not their pure-Python fallbacks);
- the generic-netlink WireGuard reader against ``wg show dump`` on kernel WireGuard (IPv6
  endpoint, a never-handshaked peer with 3,001 allowed IPs, a dump split by the kernel),
  and its errors;
- the offload enforcer turning TX checksum offload off on **virtio_net** at its first pass
  (``boot``) and again after ``ethtool -K ... on`` (``link_event``);
- ``edgeheal diagnose`` on a kernel device: ``healthy``, then ``checksum_offload``;
- the ``wireguard`` check's verdicts on kernel WireGuard at K = 25 s: every case of
  guest_check.py, the incident's 180 s included (~4.5 min of the module, mostly waiting on
  the protocol's timers); ``EDGEHEAL_TEST_ARM64=quick`` keeps :data:`QUICK` (~2.3 min);
- the whole agent (``edgeheal run``) on a kernel tunnel, its probes read from the host;
- last, the module gone: the error names it.
"""

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
from tests.qemu import arm64, bed, guest_check, proofs
from tests.qemu.support import CheckCases, Enforcing, count, features, nics

pytestmark = [pytest.mark.slow, pytest.mark.netns]

SRC = bed.SRC + "/tests/qemu"
QUICK = ("blackhole", "no_address", "peer_removed")
"""The check's cases of a quick run (``EDGEHEAL_TEST_ARM64=quick``, for a developer): a
fault of each kind of evidence (rx flat, sends failing, the peer gone), without the
protocol's 120-180 s timers. CI and ``scripts/test --arm64`` run every case."""
MODE = os.environ.get("EDGEHEAL_TEST_ARM64", "")
if MODE not in ("", "quick"):
    raise ValueError(f"EDGEHEAL_TEST_ARM64: expected 'quick' or nothing, got {MODE!r}")
CASES = QUICK if MODE == "quick" else guest_check.CASES
NICS = (
    # virtio_net on a tap with vnet_hdr (the only way QEMU offers it checksum offload),
    # at a fixed slot of the virt board's PCIe bus: udev names it enp0s9
    "-netdev", "tap,id=nv,ifname=qv0,script=no,downscript=no,vnet_hdr=on",
    "-device", "virtio-net-pci,netdev=nv,id=nic_v,addr=0x9,mac=52:54:00:00:00:09",
)


@pytest.fixture(scope="module")
def arm_image() -> bed.Image:
    if os.geteuid() != 0:
        pytest.skip("the QEMU bed needs root (network namespaces, taps)")
    cache = Path(os.environ.get("EDGEHEAL_TEST_CACHE", str(nspawn.DEFAULT_CACHE)))
    return arm64.image(cache)


@pytest.fixture(scope="module")
def arm_vm(arm_image: bed.Image) -> Iterator[bed.VM]:
    """Module-scoped, unlike the amd64 guest: torn down before another module's guest."""
    sandbox = Sandbox()
    machine = bed.VM(arm_image, netns=sandbox.netns("qa"), devices=NICS)
    try:
        machine.boot(timeout=360)
        print(f"\narm64 guest booted in {machine.boot_seconds:.1f} s (image built in "
              f"{arm_image.build_seconds:.0f} s; 0 = cached)")
        yield machine
    finally:
        machine.close()
        sandbox.close()


@pytest.fixture(scope="module")
def arm_cases(arm_vm: bed.VM) -> Iterator[CheckCases]:
    cases = CheckCases(arm_vm, CASES)
    try:
        cases.start()
        yield cases
    finally:
        cases.stop()


@pytest.fixture(scope="module")
def wg_pair(arm_vm: bed.VM, arm_cases: CheckCases) -> dict[str, Any]:
    """(Also starts the check's cases, which run while the tests before theirs do.)"""
    res = arm_vm.run(["python3", f"{SRC}/guest_wg.py", "setup"], timeout=240)
    return dict(json.loads(res.check("wg setup").out))


def test_the_guest_is_arm64_with_the_arm64_wheels_compiled_modules(
        arm_vm: bed.VM, arm_cases: CheckCases) -> None:
    assert arm_vm.sh("uname -m").strip() == "aarch64"
    assert arm_vm.sh("uname -r").strip().endswith("-arm64")  # Debian's linux-image-arm64
    res = arm_vm.python(
        "import json, platform, sys\n"
        "import multidict._multidict as m, yarl._quoting_c as y\n"
        "import aiohttp, pyroute2, prometheus_client, paho.mqtt.client, dbus_fast\n"
        "import edgeheal.agent\n"
        "print(json.dumps({'machine': platform.machine(), 'py': sys.version_info[:2],"
        " 'so': [m.__file__, y.__file__]}))\n", timeout=180)
    got = json.loads(res.check("imports").out)
    assert got["machine"] == "aarch64"
    assert got["py"] == [3, 11]
    assert all(f.endswith("-aarch64-linux-gnu.so") for f in got["so"]), got["so"]


def test_the_netlink_reader_matches_wg_show_on_arm64_kernel_wireguard(
        arm_vm: bed.VM, wg_pair: dict[str, Any]) -> None:
    began = time.monotonic()
    proofs.reader_matches_wg_show(arm_vm, wg_pair)
    print(f"\nnetlink reader vs wg show dump (3,001 allowed IPs): "
          f"{time.monotonic() - began:.1f} s")


def test_the_netlink_reader_errors_on_arm64_kernel_wireguard(
        arm_vm: bed.VM, wg_pair: dict[str, Any]) -> None:
    proofs.reader_errors(arm_vm)


def test_the_enforcer_switches_tx_checksum_off_on_virtio_net_at_boot_and_link_event(
        arm_vm: bed.VM) -> None:
    virtio = nics(arm_vm)["virtio_net"]
    assert features(arm_vm, virtio)["tx-checksum-ip-generic"] == "on"  # on, changeable
    enforcer = Enforcing(arm_vm)
    try:
        began = time.monotonic()
        enforcer.start()
        st = enforcer.until("boot pass", lambda s: virtio in s["interfaces"], within=180)
        first = time.monotonic() - began
        assert st["interfaces"][virtio]["tx-checksum-ip-generic"] in ("changed", "already-off")
        assert count(st, "edgeheal_offload_corrections_total", interface=virtio,
                     cause="boot") == 1
        assert features(arm_vm, virtio)["tx-checksum-ip-generic"] == "off"

        arm_vm.sh(f"ethtool -K {virtio} tx-checksum-ip-generic on")  # switched back on
        st = enforcer.until("link-event correction", lambda s: count(
            s, "edgeheal_offload_corrections_total", interface=virtio,
            cause="link_event") == 1, within=120)
        assert features(arm_vm, virtio)["tx-checksum-ip-generic"] == "off"
        assert [e["interface"] for e in st["events"]] == [virtio]
        assert "error" not in st["interfaces"][virtio]
        print(f"\nenforcer on virtio_net ({virtio}): first pass done {first:.1f} s after "
              "its start (imports included)")
    finally:
        enforcer.stop()


def test_diagnose_on_an_arm64_kernel_device_healthy_then_the_incidents_look(
        arm_vm: bed.VM) -> None:
    began = time.monotonic()
    proofs.diagnose(arm_vm)
    print(f"\nedgeheal diagnose, both runs: {time.monotonic() - began:.1f} s")


def test_the_whole_agent_on_arm64_served_to_the_host(arm_vm: bed.VM) -> None:
    """``edgeheal run`` on kernel WireGuard with a mosquitto behind the tunnel; its probes
    read from the host over the virtio NIC's tap (proofs.py)."""
    proofs.whole_agent(arm_vm)


@pytest.mark.parametrize("name", CASES)
def test_the_checks_verdict_on_arm64_kernel_wireguard(
        arm_cases: CheckCases, name: str) -> None:
    """The same bounds as on amd64 (proofs.py), on the arm64 kernel's WireGuard."""
    verdicts = arm_cases.outcome(within=900)
    c = proofs.case(verdicts, name)
    proofs.VERDICTS[name](c)
    took = {k: round(c[k] - c["fault_at"], 1) for k in ("detected_at", "failed_at")
            if k in c and "fault_at" in c}
    back = round(c["recovered_at"] - c["lifted_at"], 1) if "recovered_at" in c else None
    print(f"\n{name}: after the fault {took} s; ok again {back} s after it was lifted")


def test_reading_without_the_wireguard_module_names_it_on_arm64(arm_vm: bed.VM) -> None:
    """Last in the module: it unloads the module and blocks its autoload."""
    proofs.module_absent(arm_vm)
