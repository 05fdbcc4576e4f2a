"""What the QEMU bed proves on a kernel, shared by the amd64 guest (test_guest_kernel.py)
and the arm64 guest (test_guest_arm64.py): the generic-netlink WireGuard reader against
``wg show dump`` and its errors, ``edgeheal diagnose`` on a kernel device, the whole agent
served to the host, the ``wireguard``
check's verdicts from guest_check.py's timelines, the module gone. Each function asserts;
the test modules name the tests."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from typing import Any

from edgeheal.lab import nsutil
from edgeheal.lab.netns import run
from tests.qemu import bed
from tests.qemu.support import AGENT_SETUP, DIAG_SETUP, DIAGNOSE, nics

SRC = bed.SRC + "/tests/qemu"


# --- kernel WireGuard through generic netlink --------------------------------------------------

def reader_matches_wg_show(vm: bed.VM, wg_pair: dict[str, Any]) -> None:
    res = vm.run(["ip", "netns", "exec", "a", "python3", f"{SRC}/guest_wg.py", "compare", "wga"],
                 timeout=120).check("compare")
    got = json.loads(res.out)
    assert got["reader"] == "netlink"
    assert got["ours"] == got["dump"]  # every field of every peer
    pub = wg_pair["pub"]
    peers = got["ours"]["peers"]
    assert set(peers) == {pub["b"], pub["c"]}
    assert peers[pub["b"]]["endpoint"] == "[fd00::2]:51821"  # IPv6 endpoint
    assert peers[pub["b"]]["last_handshake"] is not None  # the ping made a handshake
    assert peers[pub["b"]]["rx_bytes"] > 0
    assert peers[pub["c"]]["last_handshake"] is None  # never handshaked
    assert len(peers[pub["c"]]["allowed_ips"]) == 3001
    assert got["parts"] >= 2, "the kernel was expected to split this dump"


def reader_errors(vm: bed.VM) -> None:
    res = vm.run(["ip", "netns", "exec", "a", "python3", f"{SRC}/guest_wg.py", "errors"],
                 timeout=60).check("errors")
    got = json.loads(res.out)
    assert got["absent"].startswith("NoSuchDevice")
    assert "no such interface" in got["absent"]
    assert got["not_wireguard"].startswith("NoSuchDevice")
    assert "not a WireGuard interface" in got["not_wireguard"]
    assert got["no_cap_net_admin"].startswith("PermissionDenied")


# --- edgeheal diagnose on a kernel device ----------------------------------------------------

def diagnose(vm: bed.VM) -> None:
    """The device read through generic netlink, the capture on a veth: healthy; then the
    cloud drops every handshake (as it dropped the incident's bad checksums) with TX
    offload on at the edge: ``checksum_offload``. No private key in either report."""
    try:
        vm.sh(DIAG_SETUP)
        res = vm.run(DIAGNOSE + " --json", timeout=180)
        assert res.rc == 0, res.out + res.err
        report = json.loads(res.out)
        assert report["verdict"]["code"] == "healthy"
        (peer,) = report["peers"]
        assert peer["finding"] == "healthy"
        assert peer["received"].get("keepalive", 0) > 0
        assert report["offload"]["on"] is True  # veth: tx-checksum-ip-generic on
        vm.sh("printf 'table inet f {\\n chain in { type filter hook input priority 0; "
              "policy accept;\\n udp dport 51820 drop\\n }\\n}\\n' | ip netns exec db nft -f -; "
              "pb=$(wg pubkey </tmp/dkb); ip netns exec da wg set wgd peer $pb remove; "
              "ip netns exec da wg set wgd peer $pb endpoint 10.50.0.2:51820 "
              "allowed-ips 10.51.0.2/32 persistent-keepalive 3; "
              # the cloud's old session goes too (the incident's expired session): else its
              # keepalives, which da can no longer decrypt, read as a live tunnel when a
              # slow guest's capture starts late (seen at load 10)
              "pa=$(wg pubkey </tmp/dka); ip netns exec db wg set wgd peer $pa remove; "
              "ip netns exec db wg set wgd peer $pa endpoint 10.50.0.1:51820 "
              "allowed-ips 10.51.0.1/32 persistent-keepalive 3")
        res = vm.run(DIAGNOSE, timeout=180)
        assert res.rc == 1, res.out + res.err
        assert "VERDICT: handshakes are sent but never answered while TX checksum offload " \
               "is on" in res.out
        assert "peer " in res.out
        assert ": checksum_offload" in res.out
        keys = vm.sh("cat /tmp/dka /tmp/dkb").split()
        assert not [k for k in keys if k in res.out + res.err + json.dumps(report)]
    finally:
        vm.run("ip netns del da; ip netns del db; rm -f /tmp/dka /tmp/dkb /tmp/diag.toml")


# --- the whole agent in the guest ------------------------------------------------------------

def whole_agent(vm: bed.VM) -> None:
    """``edgeheal run`` (the guest's Python) on a kernel WireGuard tunnel with a mosquitto
    behind it; its probes read from the host over the virtio NIC's tap, which lives only in
    the test's namespace; the watched peer removed: readiness and /status flip, and back."""
    assert vm.netns is not None
    nic = nics(vm)["virtio_net"]
    bed_ns = vm.netns  # the host side: the tap qv0 in the test's namespace
    run(["ip", "-n", bed_ns, "addr", "add", "10.77.0.1/24", "dev", "qv0"])
    run(["ip", "-n", bed_ns, "link", "set", "qv0", "up"])

    def get(path: str) -> tuple[int, Any]:
        try:
            return nsutil.get_json(bed_ns, "10.77.0.2", 9917, path, 5.0)
        except OSError as err:
            return 0, str(err)

    def wait(what: str, predicate: Any, within: float) -> Any:
        deadline = time.monotonic() + within
        while True:
            got = {p: get(p) for p in ("/livez", "/readyz", "/status")}
            if predicate(got):
                return got
            if time.monotonic() > deadline:
                log = vm.run(["tail", "-c", "3000", "/tmp/agent.log"]).out
                raise AssertionError(f"{what} not within {within:g} s: {got}\n{log}")
            time.sleep(1.0)

    def checks(got: dict[str, Any]) -> dict[str, Any]:
        doc = got["/status"][1]
        return dict(doc.get("checks", {})) if isinstance(doc, dict) else {}

    def state(got: dict[str, Any], name: str) -> tuple[str, str]:
        c = checks(got).get(name) or {}
        return c.get("state", ""), c.get("reason", "")

    try:
        vm.sh(AGENT_SETUP.format(nic=nic), timeout=60)
        began = time.monotonic()
        got = wait("ready", lambda g: g["/readyz"][0] == 200 and state(g, "cloud")[0] == "ok"
                   and state(g, "wireguard") == ("ok", "ok"), 180)
        print(f"\nagent in the guest ready, seen from the host, {time.monotonic() - began:.0f} s "
              "after its start")
        assert got["/livez"][0] == 200
        assert checks(got)["wireguard"]["detail"]["interfaces"]["wga"]["reader"] == "netlink"

        vm.sh("ip netns exec ag wg set wga peer $(wg pubkey </tmp/akc) remove")
        cut = time.monotonic()
        got = wait("not ready", lambda g: g["/readyz"][0] == 503
                   and state(g, "wireguard") == ("failed", "no_peers"), 60)
        print(f"peer removed -> /readyz 503 after {time.monotonic() - cut:.1f} s")
        assert got["/livez"][0] == 200  # alive, only not ready
        wait("the tunnel-path broker failed", lambda g: state(g, "cloud")[0] == "failed", 60)

        vm.sh("ip netns exec ag wg set wga peer $(wg pubkey </tmp/akc) endpoint 10.60.0.2:51820 "
              "allowed-ips 10.61.0.2/32 persistent-keepalive 25")
        back = time.monotonic()
        wait("ready again", lambda g: g["/readyz"][0] == 200
             and state(g, "wireguard") == ("ok", "ok"), 90)
        print(f"peer re-added -> /readyz 200 after {time.monotonic() - back:.1f} s")
        log = vm.run(["cat", "/tmp/agent.log"]).out
        keys = vm.sh("cat /tmp/aka /tmp/akc").split()
        assert not [k for k in keys if k in log + json.dumps(got["/status"][1])]
    finally:
        vm.run("kill $(cat /tmp/agent.pid) 2>/dev/null; ip netns del ag; ip netns del ac; "
               "rm -f /tmp/aka /tmp/akc")
        run(["ip", "-n", bed_ns, "addr", "flush", "dev", "qv0"], check=False)


# --- the wireguard check's verdicts on kernel WireGuard --------------------------------------
# guest_check.py: every case at once, K = 25 s (Flannel's), the shipped check settings
# (interval 2 s, fail_after 2, recover_after 2, auto thresholds). Bounds are causal, with
# generous slack: TCG on a loaded 2-core host runs the guest's timers and our loop late.

K = 25
DEBOUNCE = 3 * 2.0
SLACK = 30.0
SLOW = {"read_error"}
"""A netlink read that TCG (one vCPU shared by every case, diagnose and the agent) made
slower than the reader's 2 s deadline: no verdict on the tunnel, debounced like any other;
every reason *about the tunnel* besides the expected ones is still a failure."""


def case(verdicts: dict[str, Any], name: str) -> dict[str, Any]:
    c = verdicts[name]
    assert "error" not in c, c["error"]
    return dict(c)


def between(c: dict[str, Any], start: float, end: float = float("inf")) -> list[Any]:
    return [s for s in c["samples"] if start <= s["t"] <= end]


def first_read(samples: list[Any]) -> dict[str, Any]:
    """The first sample that read a peer's counters (a SLOW read carries none)."""
    read = [s for s in samples if s["rx"] is not None]
    assert read, "no sample read a peer's counters"
    return read[0]


def healthy(c: dict[str, Any]) -> None:
    after = between(c, c["ok_at"])
    assert {s["effective"] for s in after} == {"ok"}
    raw = {s["raw"] for s in after}
    assert raw <= {"ok", *SLOW}, [s["message"] for s in after if s["raw"] != "ok"]
    ages = [s["age"] for s in after if s["raw"] == "ok"]
    assert any(b < a - 60 for a, b in itertools.pairwise(ages)), \
        f"no rekey seen (handshake ages {ages})"


def blackhole(c: dict[str, Any]) -> None:
    took = c["detected_at"] - c["fault_at"]
    # rx may have last grown up to K before the fault: the 67.5 s window starts there
    assert 2.5 * K + 5 - K - 5 <= took <= 2.5 * K + 5 + DEBOUNCE + SLACK, took
    assert {s["raw"] for s in between(c, c["fault_at"], c["detected_at"])} <= {
        "ok", "stalled", *SLOW}
    assert c["fault_counter"] > 0
    assert c["recovered_at"] - c["lifted_at"] <= K + DEBOUNCE + SLACK


def no_address(c: dict[str, Any]) -> None:
    assert c["cause"] == "no_address"
    assert c["detected_at"] - c["fault_at"] <= K + 5 + DEBOUNCE + SLACK
    assert {s["raw"] for s in between(c, c["fault_at"], c["detected_at"])} <= {
        "ok", "send_failing", *SLOW}
    assert c["recovered_at"] - c["lifted_at"] <= K + DEBOUNCE + SLACK


def local(c: dict[str, Any]) -> None:
    """Unlike wireguard-go, kernel WireGuard counts tx bytes for the packets its output
    hook drops (udp_tunnel_xmit_skb returns no error), and the peer's handshake
    initiations keep arriving: tx never goes flat, so no ``send_failing`` (and no cause
    ``local``); the session ages out instead, as in the incident."""
    during = between(c, c["fault_at"], c["detected_at"])
    assert c["fault_counter"] > 0
    assert during[-1]["tx"] > during[0]["tx"], "kernel WireGuard was expected to count them"
    assert "send_failing" not in {s["raw"] for s in during}
    assert c["failed_age"] <= 180 + K + DEBOUNCE + SLACK
    assert during[-1]["effective"] in ("dead", "stalled")


def peer_removed(c: dict[str, Any]) -> None:
    assert c["detected_at"] - c["fault_at"] <= DEBOUNCE + SLACK
    back = between(c, c["lifted_at"])
    assert {s["raw"] for s in back} <= {"no_peers", "connecting", "ok", *SLOW}
    assert back[-1]["effective"] == "ok"
    assert first_read(back)["rx"] < c["before"]["rx"]
    assert first_read(back)["tx"] < c["before"]["tx"]


def recreated(c: dict[str, Any]) -> None:
    after = between(c, c["fault_at"])
    assert {s["effective"] for s in after} == {"ok"}
    assert {s["raw"] for s in after} <= {"ok", "connecting", *SLOW}
    assert first_read(after)["rx"] < c["before"]["rx"]
    assert first_read(after)["tx"] < c["before"]["tx"]


def incident(c: dict[str, Any]) -> None:
    """Handshake packets leave both ends with UDP checksum 0xdead (TX offload off, so the
    receiving kernel verifies it): the receiving kernel drops them, counting InCsumErrors."""
    assert 120 <= c["warned_age"] < 180, c["warned_age"]
    assert c["ping_when_warned"], "the session must still carry traffic when warned"
    before, warned, after = c["csum_before"], c["csum_when_warned"], c["csum_after"]
    # before 180 s only the session's initiator rekeys: one receiver counts the drops
    assert sum(warned.values()) > sum(before.values())
    assert 180 - 5 <= c["failed_age"] <= 180 + K + DEBOUNCE + SLACK, c["failed_age"]
    assert c["failed_reason"] in ("dead", "stalled")
    # once the session expired both ends initiate: both receivers drop the bad checksums
    assert all(after[k] > before[k] for k in before), (before, after)
    assert c["fault_counter"] > 0
    assert c["recovered_at"] - c["lifted_at"] <= K + DEBOUNCE + SLACK


VERDICTS: dict[str, Callable[[dict[str, Any]], None]] = {
    "healthy": healthy, "blackhole": blackhole, "no_address": no_address, "local": local,
    "peer_removed": peer_removed, "recreated": recreated, "incident": incident}
"""guest_check.py's case -> what its timeline must show."""


# --- the module gone ---------------------------------------------------------------------------

def module_absent(vm: bed.VM) -> None:
    """Every WireGuard device gone, the module unloaded and its autoload blocked (the
    kernel's generic netlink loads ``wireguard`` on the family's first lookup otherwise):
    a clear error naming the module. Last in the module: it changes the guest."""
    vm.run("for ns in a b edge da db; do ip netns del $ns 2>/dev/null; done")
    vm.sh("echo 'install wireguard /bin/false' >/etc/modprobe.d/edgeheal-test.conf; "
          "for i in $(seq 50); do rmmod wireguard 2>/dev/null && break; sleep 0.2; done; "
          "! grep -q '^wireguard ' /proc/modules")
    res = vm.python("import asyncio\nfrom edgeheal.boundaries import wg\ntry:\n"
                    "    asyncio.run(wg.read_device('flannel-wg'))\n"
                    "except wg.WireGuardError as err:\n"
                    "    print(type(err).__name__, err)\n", timeout=60).check("read")
    assert res.out.startswith("NoSuchDevice"), res.out
    assert "'wireguard' generic netlink family (kernel module not loaded)" in res.out
