"""Helpers of test_guest_kernel.py (kept apart so that module stays readable; the tests
themselves stay in one module, so ``--dist loadfile`` runs them on one worker, one VM):
the guest's NICs and features, the enforcer running in the guest, QMP replug, the check's
cases running in the guest, and the shell that builds the diagnose and agent tunnels in the
guest."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tests.qemu import bed
from tests.support import wait_until

SRC = bed.SRC + "/tests/qemu"


def nics(vm: bed.VM) -> dict[str, str]:
    """{driver: interface name} in the guest's root namespace."""
    out = vm.sh("for d in /sys/class/net/*/device/driver; do "
                "n=${d#/sys/class/net/}; echo ${n%%/*} $(basename $(readlink $d)); done")
    pairs = [line.split() for line in out.splitlines()]
    return {p[1]: p[0] for p in pairs if len(p) == 2}  # (one going away has no driver)


USBNET = ("cdc_ether", "cdc_subset", "rndis_host")
"""usbnet drivers: QEMU's usb-net (the Linux gadget's IDs) binds cdc_subset on Debian 12's
kernel; like cdc_ether (most 4G modems) it offers no checksum offload at all."""


def usb_nic(names: dict[str, str]) -> str:
    found = [names[d] for d in USBNET if d in names]
    assert found, f"no usbnet NIC in the guest: {names}"
    return found[0]


def features(vm: bed.VM, ifname: str) -> dict[str, str]:
    out = vm.run(["ethtool", "-k", ifname]).check("ethtool -k").out
    feats = {}
    for line in out.splitlines()[1:]:
        name, _, value = line.strip().partition(": ")
        feats[name] = value
    return feats


class Enforcing:
    """guest_enforce.py running in the guest; ``state()`` reads what it wrote."""

    OUT = "/tmp/enforcer.json"

    def __init__(self, vm: bed.VM) -> None:
        self.vm = vm

    def start(self) -> None:
        self.vm.sh(f"rm -f {self.OUT}; setsid python3 {SRC}/guest_enforce.py {self.OUT} "
                   f"'en*' 'eth*' 'usb*' >/tmp/enforcer.log 2>&1 </dev/null & echo $! "
                   ">/tmp/enforcer.pid")

    def state(self) -> dict[str, Any]:
        res = self.vm.run(["cat", self.OUT])
        return dict(json.loads(res.out)) if res.rc == 0 and res.out else {}

    def until(self, what: str, predicate: Any, within: float = 90.0) -> dict[str, Any]:
        """Generous: under TCG on a loaded 2-core machine the first pass (imports included)
        has taken 20 s; typical is a few seconds."""
        return wait_until(self.state, holds=lambda st: bool(st) and predicate(st),
                          within=within, every=0.2, what=what,
                          report=lambda _: self.vm.run(["cat", "/tmp/enforcer.log"]).out)

    def stop(self) -> None:
        self.vm.run("kill $(cat /tmp/enforcer.pid) 2>/dev/null; sleep 0.3")

    def log(self) -> str:
        return self.vm.run(["cat", "/tmp/enforcer.log"]).out


def count(st: dict[str, Any], name: str, **labels: str) -> float:
    return float(sum(v for n, lab, v in st["samples"]
                     if n == name and all(lab.get(k) == x for k, x in labels.items())))


def labelled(st: dict[str, Any], iface: str) -> list[Any]:
    return [s for s in st["samples"] if s[1].get("interface") == iface]


def replug(vm: bed.VM, dev_id: str, device: dict[str, Any]) -> float:
    """device_del, wait for the guest to release it, device_add; the time device_add took."""
    vm.qmp("device_del", id=dev_id)
    deadline = time.monotonic() + 30
    while any(d.get("qdev_id") == dev_id for d in _devices(vm)):
        assert time.monotonic() < deadline, f"{dev_id} not released by the guest"
        time.sleep(0.2)
    vm.qmp("device_add", **device)
    return time.monotonic()


def _devices(vm: bed.VM) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for bus in vm.qmp("query-pci"):
        out.extend(bus["devices"])
    return out


VERDICTS_OUT = "/tmp/verdicts.json"


@dataclass
class CheckCases:
    """tests/qemu/guest_check.py, started in the guest when the module starts (all cases
    at once, ~4-5 min: the incident needs the protocol's 180 s) so the other guest tests
    run meanwhile; :meth:`outcome` waits for it. A case that missed a guest-side bound
    carries its ``error``; the tests assert the rest."""

    vm: bed.VM
    names: Sequence[str] = ()
    """guest_check.py's cases to run (all of them when empty)."""
    began: float = 0.0
    cases: dict[str, Any] | None = None

    def start(self) -> None:
        self.vm.sh("ip netns add edge && ip -n edge link set lo up")
        self.vm.sh(f"rm -f {VERDICTS_OUT}; setsid ip netns exec edge python3 "
                   f"{bed.SRC}/tests/qemu/guest_check.py {VERDICTS_OUT} {' '.join(self.names)} "
                   ">/tmp/check.log 2>&1 "
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


DIAG_SETUP = """set -e
for ns in da db; do ip netns add $ns; ip -n $ns link set lo up; done
ip link add vda netns da type veth peer name vdb netns db
ip -n da addr add 10.50.0.1/24 dev vda; ip -n db addr add 10.50.0.2/24 dev vdb
ip -n da link set vda up; ip -n db link set vdb up
wg genkey >/tmp/dka; wg genkey >/tmp/dkb
for side in a:b:1:2 b:a:2:1; do IFS=: read me other mine theirs <<EOT
$side
EOT
  ip -n d$me link add wgd type wireguard
  ip netns exec d$me wg set wgd private-key /tmp/dk$me listen-port 51820 \\
    peer $(wg pubkey </tmp/dk$other) endpoint 10.50.0.$theirs:51820 \\
    allowed-ips 10.51.0.$theirs/32 persistent-keepalive 3
  ip -n d$me addr add 10.51.0.$mine/24 dev wgd; ip -n d$me link set wgd up
done
printf '[wireguard]\\ninterfaces = ["wgd"]\\n' >/tmp/diag.toml
"""
DIAGNOSE = ("cd /tmp && ip netns exec da python3 -m edgeheal diagnose --config /tmp/diag.toml "
            "--interface vda --seconds 8")


AGENT_SETUP = """set -e
for ns in ag ac; do ip netns add $ns; ip -n $ns link set lo up; done
ip link add vag netns ag type veth peer name vac netns ac
ip -n ag addr add 10.60.0.1/24 dev vag; ip -n ac addr add 10.60.0.2/24 dev vac
ip -n ag link set vag up; ip -n ac link set vac up
umask 077; wg genkey >/tmp/aka; wg genkey >/tmp/akc
ip -n ag link add wga type wireguard; ip -n ac link add wgc type wireguard
ip netns exec ag wg set wga private-key /tmp/aka listen-port 51820 peer $(wg pubkey </tmp/akc) \\
  endpoint 10.60.0.2:51820 allowed-ips 10.61.0.2/32 persistent-keepalive 25
ip netns exec ac wg set wgc private-key /tmp/akc listen-port 51820 peer $(wg pubkey </tmp/aka) \\
  endpoint 10.60.0.1:51820 allowed-ips 10.61.0.1/32 persistent-keepalive 25
ip -n ag addr add 10.61.0.1/24 dev wga; ip -n ac addr add 10.61.0.2/24 dev wgc
ip -n ag link set wga up; ip -n ac link set wgc up
printf 'listener 1883 10.61.0.2\\nallow_anonymous true\\n' >/tmp/mq.conf
setsid ip netns exec ac mosquitto -c /tmp/mq.conf >/tmp/mq.log 2>&1 </dev/null &
ip link set {nic} netns ag
ip -n ag addr add 10.77.0.2/24 dev {nic}; ip -n ag link set {nic} up
mkdir -p /tmp/agent-state
cat >/tmp/agent.toml <<EOT
[agent]
state_dir = "/tmp/agent-state"
[http]
listen = ["10.77.0.2:9917"]
[offload]
enabled = false
[wireguard]
interfaces = ["wga"]
[[mqtt.targets]]
name = "cloud"
host = "10.61.0.2"
path = "tunnel"
EOT
cd /tmp; setsid ip netns exec ag python3 -m edgeheal run --config /tmp/agent.toml \\
  >/tmp/agent.log 2>&1 </dev/null & echo $! >/tmp/agent.pid
"""
