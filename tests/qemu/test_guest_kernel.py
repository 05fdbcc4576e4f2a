"""A real kernel (Debian 12's, under QEMU/TCG): kernel WireGuard read through generic
netlink; the offload enforcer on real NIC drivers (e1000e, virtio_net, cdc_ether)
including PCI hot unplug/replug, where udev renames the NIC after it appeared (the rename
race of issue 18); the uplink ladder's ``usb-reauthorize`` rung re-enumerating the usbnet
NIC (guest_usb.py); ``edgeheal diagnose`` and the whole agent on kernel devices; the
``wireguard`` check's verdicts on kernel WireGuard at K = 25 s (guest_check.py, started
with the module's first fixture, so its ~4-5 minutes overlap the tests before theirs);
last, the module removed. One guest for the whole module (see conftest.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.qemu import bed, proofs
from tests.qemu.support import (
    USBNET,
    Enforcing,
    count,
    features,
    nics,
    replug,
    usb_nic,
)

pytestmark = [pytest.mark.slow, pytest.mark.netns]

SRC = bed.SRC + "/tests/qemu"
CSUM = ("tx-checksum-ipv4", "tx-checksum-ip-generic", "tx-checksum-ipv6")


# --- kernel WireGuard ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wg_pair(vm: bed.VM, check_cases: Any) -> dict[str, Any]:
    """(Also starts the check's cases, which run while the tests before theirs do.)"""
    res = vm.run(["python3", f"{SRC}/guest_wg.py", "setup"], timeout=120).check("wg setup")
    return dict(json.loads(res.out))


def test_the_netlink_reader_matches_wg_show_on_kernel_wireguard(
        vm: bed.VM, wg_pair: dict[str, Any]) -> None:
    proofs.reader_matches_wg_show(vm, wg_pair)


def test_the_netlink_reader_errors_on_kernel_wireguard(
        vm: bed.VM, wg_pair: dict[str, Any]) -> None:
    proofs.reader_errors(vm)


# --- the offload enforcer on real drivers ----------------------------------------------------

@pytest.fixture
def enforcer(vm: bed.VM) -> Iterator[Enforcing]:
    e = Enforcing(vm)
    try:
        yield e
    finally:
        e.stop()


def test_boot_and_link_event_enforcement_on_e1000e_virtio_net_and_cdc_ether(
        vm: bed.VM, enforcer: Enforcing) -> None:
    names = nics(vm)
    assert {"e1000e", "virtio_net"} <= set(names), names
    e1000e, virtio, usb = names["e1000e"], names["virtio_net"], usb_nic(names)
    for ifname in (e1000e, virtio):  # the drivers start with it on and changeable
        assert features(vm, ifname)["tx-checksum-ip-generic"] == "on"
    assert features(vm, usb)["tx-checksum-ip-generic"] == "off [fixed]"

    enforcer.start()
    st = enforcer.until("boot pass", lambda s: len(s["interfaces"]) >= 3)
    for ifname in (e1000e, virtio):
        # (the latest report may already be the link event our own change caused)
        assert st["interfaces"][ifname]["tx-checksum-ip-generic"] in ("changed", "already-off")
        assert count(st, "edgeheal_offload_corrections_total", interface=ifname,
                     cause="boot") == 1
        assert features(vm, ifname)["tx-checksum-ip-generic"] == "off"
    # cdc_ether: nothing to switch, not an error
    assert "error" not in st["interfaces"][usb]
    assert all(o in ("fixed-off", "not-present") for o in st["interfaces"][usb].values())
    assert count(st, "edgeheal_offload_corrections_total", interface=usb) == 0

    vm.sh(f"ethtool -K {e1000e} tx-checksum-ip-generic on")  # someone switches it back on
    st = enforcer.until("link-event correction", lambda s: count(
        s, "edgeheal_offload_corrections_total", interface=e1000e, cause="link_event") == 1)
    assert features(vm, e1000e)["tx-checksum-ip-generic"] == "off"
    assert [e["interface"] for e in st["events"]] == [e1000e]


def test_pci_replug_is_corrected_and_recorded_under_the_final_name(
        vm: bed.VM, enforcer: Enforcing) -> None:
    final = nics(vm)["e1000e"]
    enforcer.start()
    enforcer.until("boot pass", lambda s: final in s["interfaces"])
    for n in range(1, 4):
        plugged = replug(vm, "nic_e", {"driver": "e1000e", "netdev": "ne", "id": "nic_e",
                                       "addr": "0x8", "mac": "52:54:00:00:00:08"})
        st = enforcer.until(f"replug {n} corrected", lambda s, n=n: count(
            s, "edgeheal_offload_corrections_total", interface=final,
            cause="link_event") == n)
        took = time.monotonic() - plugged
        assert features(vm, final)["tx-checksum-ip-generic"] == "off"
        names = nics(vm)
        assert names["e1000e"] == final, names  # udev renamed it back to the slot name
        # nothing under the kernel's temporary name, in state, metrics or events
        assert set(st["interfaces"]) <= set(names.values()), st["interfaces"]
        assert not [s for s in st["samples"] if s[1].get("interface", final) not in
                    names.values()], st["samples"]
        assert all(e["interface"] == final for e in st["events"]), st["events"]
        print(f"replug {n}: corrected and recorded under {final} {took:.2f} s after "
              "device_add returned")
    log = enforcer.log()
    assert "vanished" not in log
    print(f"renames followed: {log.count('was renamed')} (the race is timing-dependent here; "
          "tests/offload/test_reconciler_kernel.py replays it deterministically)")


def test_usb_replug_of_a_nic_without_checksum_offload_is_quiet(
        vm: bed.VM, enforcer: Enforcing) -> None:
    enforcer.start()
    usb = usb_nic(nics(vm))
    enforcer.until("boot pass", lambda s: usb in s["interfaces"])
    vm.qmp("device_del", id="nic_u")
    deadline = time.monotonic() + 30
    while usb in nics(vm).values():
        assert time.monotonic() < deadline, "usb-net not released"
        time.sleep(0.2)
    vm.qmp("device_add", driver="usb-net", netdev="nu", id="nic_u", mac="52:54:00:00:00:0a")
    st = enforcer.until("usb NIC back", lambda s: any(
        n in s["interfaces"] for d, n in nics(vm).items() if d in USBNET))
    usb = usb_nic(nics(vm))
    time.sleep(1.0)  # let any storm show
    st = enforcer.state()
    assert "error" not in st["interfaces"][usb]
    assert all(o in ("fixed-off", "not-present") for o in st["interfaces"][usb].values())
    assert st["events"] == []
    assert st["drift_total"] == 0
    assert count(st, "edgeheal_offload_corrections_total", interface=usb) == 0
    assert "WARNING" not in enforcer.log()


# --- the uplink ladder's usb-reauthorize rung on the real sysfs ----------------------------

def test_usb_reauthorize_rung_re_enumerates_the_nic_and_the_enforcer_stays_quiet(
        usb_rung: dict[str, Any]) -> None:
    """``authorized`` 0 then 1: the kernel tears the interface down and re-enumerates it
    with a new ifindex, renamed by udev; the enforcer sees it, not applicable, quietly."""
    got, usb, st = usb_rung["reauthorize"], usb_rung["usb"], usb_rung["enforcer"]
    assert got["usable"], got["why"]
    assert "error" not in got, got
    assert got["target"] == f"usb {got['usb_device']}"
    assert got["restart_seconds"] <= got["bound"]
    timeline = got["timeline"]
    ((name, old),) = got["before"]
    assert name == usb
    # de-authorized: the interface gone; authorized again: back with a new ifindex
    assert any(s["authorized"] == "0" and not s["nets"] for s in timeline), timeline
    ((final, new),) = got["after"]  # udev's name (at boot it may have kept usb0)
    assert new != old, got["after"]
    assert final == usb_nic(usb_rung["nics"])
    assert got["mode_after"] == "0o664"  # the USB device's node (and a udev mode) survived
    assert st["ifindex"][final] == new
    assert "error" not in st["interfaces"][final]
    assert all(o in ("fixed-off", "not-present") for o in st["interfaces"][final].values())
    assert set(st["interfaces"]) <= set(usb_rung["nics"].values())  # nothing stale (usb0)
    assert st["events"] == []
    assert st["drift_total"] == 0
    assert count(st, "edgeheal_offload_corrections_total", interface=final) == 0
    assert "WARNING" not in usb_rung["log"]
    print(f"\nusb-reauthorize {got['usb_device']}: restart() {got['restart_seconds']:.2f} s "
          f"(bound {got['bound']:g} s), interface back at {got['back_seconds']:.2f} s, udev "
          f"settled at {got['settled_seconds']:.2f} s; {usb} (ifindex {old}) -> {final} "
          f"(ifindex {new}); timeline {timeline}\nenforcer log:\n{usb_rung['log']}")


def test_usb_reauthorize_rung_refusals_on_the_real_sysfs(usb_rung: dict[str, Any]) -> None:
    got = usb_rung["refusals"]
    assert got["hub"].startswith("usb"), got
    assert got["hub_exists"], got
    assert "remediation.uplink.usb_device" in got["config_hub"]  # refused by the config
    hub, missing, interface = got["root_hub"], got["missing"], got["usb_interface"]
    assert not hub["usable"], hub
    assert "not a USB device" in hub["why"]
    assert "config_problem=True" in hub["restart"]
    assert got["hub_authorized"] == "1"  # never de-authorized
    assert not missing["usable"], missing
    assert "no USB device '7-7': nothing at /sys/bus/usb/devices/7-7" in missing["why"]
    assert "no USB device '7-7'" in missing["restart"]
    assert not interface["usable"], interface
    assert "not a USB device" in interface["why"]
    assert got["nets"] == got["nets_before"]  # nothing re-enumerated
    print(f"\nrefusals: {got}")


# --- edgeheal diagnose on a kernel device -----------------------------------------------------

def test_diagnose_on_a_kernel_device_healthy_then_the_incidents_look(vm: bed.VM) -> None:
    """The device read through generic netlink, the capture on a veth: healthy; then the
    cloud drops every handshake (as it dropped the incident's bad checksums) with TX
    offload on at the edge: ``checksum_offload``. No private key in either report."""
    proofs.diagnose(vm)


# --- the whole agent in the guest ---------------------------------------------------------------

def test_the_whole_agent_in_the_guest_served_to_the_host(vm: bed.VM) -> None:
    """``edgeheal run`` on kernel WireGuard, its probes read from the host (proofs.py)."""
    proofs.whole_agent(vm)


# --- the wireguard check's verdicts on kernel WireGuard ------------------------------------
# guest_check.py: every case at once, K = 25 s (Flannel's), the shipped check settings
# (interval 2 s, fail_after 2, recover_after 2, auto thresholds). Bounds are causal, with
# generous slack: TCG on a loaded 2-core host runs the guest's timers and our loop late.

def test_the_check_keeps_a_healthy_kernel_tunnel_ok_across_its_rekey(
        check_verdicts: dict[str, Any]) -> None:
    proofs.healthy(proofs.case(check_verdicts, "healthy"))


def test_the_check_finds_a_blackholed_kernel_tunnel_stalled(
        check_verdicts: dict[str, Any]) -> None:
    proofs.blackhole(proofs.case(check_verdicts, "blackhole"))


def test_the_check_finds_a_kernel_tunnel_whose_uplink_lost_its_address_send_failing(
        check_verdicts: dict[str, Any]) -> None:
    proofs.no_address(proofs.case(check_verdicts, "no_address"))


def test_a_local_output_drop_on_kernel_wireguard_is_seen_by_the_handshake_age(
        check_verdicts: dict[str, Any]) -> None:
    """Unlike wireguard-go, kernel WireGuard counts tx bytes for the packets its output
    hook drops (udp_tunnel_xmit_skb returns no error), and the peer's handshake
    initiations keep arriving: tx never goes flat, so no ``send_failing`` (and no cause
    ``local``); the session ages out instead, as in the incident."""
    proofs.local(proofs.case(check_verdicts, "local"))


def test_a_removed_kernel_peer_is_no_peers_and_its_counters_restart(
        check_verdicts: dict[str, Any]) -> None:
    proofs.peer_removed(proofs.case(check_verdicts, "peer_removed"))


def test_a_recreated_kernel_device_restarts_its_counters_without_an_alarm(
        check_verdicts: dict[str, Any]) -> None:
    proofs.recreated(proofs.case(check_verdicts, "recreated"))


def test_the_incident_on_kernel_wireguard_rekey_failing_then_dead_with_in_csum_errors(
        check_verdicts: dict[str, Any]) -> None:
    """Handshake packets leave both ends with UDP checksum 0xdead (TX offload off, so the
    receiving kernel verifies it): the receiving kernel drops them, counting InCsumErrors."""
    proofs.incident(proofs.case(check_verdicts, "incident"))


# --- last: the module gone ---------------------------------------------------------------------

def test_reading_without_the_wireguard_module_names_it(vm: bed.VM) -> None:
    """Every WireGuard device gone, the module unloaded and its autoload blocked (the
    kernel's generic netlink loads ``wireguard`` on the family's first lookup otherwise):
    a clear error naming the module. Last in the module: it changes the guest."""
    proofs.module_absent(vm)
