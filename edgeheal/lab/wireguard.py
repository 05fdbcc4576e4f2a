"""Real WireGuard tunnels between network namespaces, with faults on demand — always removed.

The kernel WireGuard module is not available on the machines edgeheal is developed and
tested on; ``wireguard-go`` is, and gives real tunnels over TUN devices that speak the same
protocol with the same timers. This harness builds a small Flannel-like full mesh and lets
the lab, the tests, the remediation tests and the benchmark break it the way the field
breaks it.

API (everything is recorded in a :class:`~edgeheal.lab.netns.Sandbox` and removed by
:meth:`WgMesh.close`, also on failure)::

    with WgMesh(nodes=3, keepalive=5) as mesh:   # or mesh = WgMesh(...); mesh.close()
        a, b = mesh.nodes[0], mesh.nodes[1]
        a.ns, a.ifname, a.public_key, a.overlay, a.pod_cidr, a.uplinks
        mesh.endpoint(a, b)            # "10.200.0.2:51820": where a sends b's packets
        mesh.wait_handshake(a, b)      # poll (bounded) until a reports a handshake with b
        mesh.dump(a)                   # `wg show <if> dump` rows for a's peers (lab only)
        mesh.last_handshake(a, b)      # a's reported handshake time with b (0 = never)
        mesh.remove_peer(a, b); mesh.add_peer(a, b)
        mesh.recreate_device(a)        # what Flannel does when it rebuilds flannel-wg
        mesh.stop_node(c)              # a powered-off edge box (its daemon stops)
        mesh.corrupt_handshakes(a, b)  # the incident: bad UDP checksum on types 1 and 2,
                                       # output chain of both, TX offload off on uplinks
        mesh.blackhole(a, b)           # drop all tunnel UDP on arrival at both
        mesh.loss(10, a, b)            # drop 10 % of tunnel UDP on arrival at both
        mesh.clear_faults(a, b)        # remove the nft fault table(s) (all nodes: no args)
        mesh.fault_counter(a)          # packets a's fault rule has matched
        mesh.set_tx_offload(a, on=False)  # TX checksum offload of a's veth uplinks
        mesh.in_csum_errors(b)         # Udp InCsumErrors from b's /proc/net/snmp

Topology: node *i* lives in its own namespace; every pair (i, j) is joined by its own
veth pair on ``10.200.<pair>.0/24`` (i = .1, j = .2), so each node has one uplink per peer
and faults can be aimed at one link. Each node runs ``wireguard-go -f <ifname>`` with a
fresh key pair, listens on 51820, and is addressed as Flannel's WireGuard backend addresses
a node (flannel-io/flannel ``pkg/backend/wireguard``: ``Configure`` puts the lease's first
address on the device as a /32 and routes the whole cluster network through it;
``handleSubnetEvents`` gives each peer exactly its node's lease as allowed IPs): pod subnet
(lease) ``10.42.<i>.0/24``, device address ``10.42.<i>.0/32`` (``overlay``), a route
``10.42.0.0/16 dev <ifname>``, and every other node as a peer with allowed IPs exactly
``10.42.<j>.0/24`` and the given persistent keepalive. :mod:`edgeheal.lab.kubeproxy` adds
what kube-proxy adds (a ClusterIP DNATed to a pod address, the masquerade into the tunnel).
Interface names are unique per run (every wireguard-go socket lives in the
shared ``/var/run/wireguard/``); addresses may repeat across runs because every node is in
a namespace of its own.

Why TX offload matters for the checksum fault: a packet sent while the veth's TX checksum
offload is on reaches the peer as CHECKSUM_PARTIAL and is never verified, so a corrupted
checksum has no effect; with TX offload off the checksum is computed in software, the
receiver verifies it, drops the packet and counts ``InCsumErrors`` — as in the incident.

Lab code: it runs ``ip``, ``nft``, ``ethtool``, ``wg`` and ``wireguard-go`` (the agent never
does). Private keys are held in memory only and passed to ``wg`` on stdin.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgeheal.lab.kubeproxy import CLUSTER_CIDR
from edgeheal.lab.netns import LabError, Sandbox, require_programs, require_root, run, unique
from edgeheal.lab.netns import stop_process as _stop

log = logging.getLogger(__name__)

UAPI_DIR = Path("/var/run/wireguard")
PORT = 51820
FAULT_TABLE = "edgeheal_fault"
HANDSHAKE_INITIATION, HANDSHAKE_RESPONSE = 1, 2


@dataclass
class WgNode:
    """One namespace with one wireguard-go device."""

    index: int
    ns: str
    ifname: str
    public_key: str
    private_key: str = field(repr=False)
    overlay: str
    pod_cidr: str
    uplinks: dict[int, str] = field(default_factory=dict)
    """peer index -> this node's veth toward that peer."""
    underlay: dict[int, str] = field(default_factory=dict)
    """peer index -> this node's address on the link toward that peer."""
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def socket(self) -> Path:
        return UAPI_DIR / f"{self.ifname}.sock"


class WgMesh:
    """A full mesh of ``nodes`` wireguard-go peers in namespaces; see the module doc."""

    def __init__(self, nodes: int = 2, *, keepalive: int = 5, sandbox: Sandbox | None = None,
                 log_dir: Path | None = None, start_timeout: float = 10.0) -> None:
        if not 2 <= nodes <= 20:
            raise ValueError("a mesh needs 2 to 20 nodes (one /24 per pair of nodes)")
        require_root()
        require_programs("ip", "nft", "wg", "wireguard-go", "ethtool", "ping")
        self.keepalive = keepalive
        self.sandbox = sandbox or Sandbox()
        self._own_sandbox = sandbox is None
        self.log_dir = log_dir
        self.start_timeout = start_timeout
        self.nodes: list[WgNode] = []
        try:
            self._build(nodes)
        except BaseException:
            self.close()
            raise

    # --- building ------------------------------------------------------------------------
    def _build(self, count: int) -> None:
        for i in range(count):
            ns = self.sandbox.netns(f"n{i}")
            private = run(["wg", "genkey"]).stdout.strip()
            public = run(["wg", "pubkey"], input=private + "\n").stdout.strip()
            node = WgNode(index=i, ns=ns, ifname=unique(f"w{i}"), public_key=public,
                          private_key=private, overlay=f"10.42.{i}.0",
                          pod_cidr=f"10.42.{i}.0/24")
            self.nodes.append(node)
        pair = 0
        for i in range(count):
            for j in range(i + 1, count):
                a, b = self.nodes[i], self.nodes[j]
                va, vb = self.sandbox.veth(a.ns, b.ns, addr_a=f"10.200.{pair}.1/24",
                                           addr_b=f"10.200.{pair}.2/24")
                a.uplinks[j], b.uplinks[i] = va, vb
                a.underlay[j], b.underlay[i] = f"10.200.{pair}.1", f"10.200.{pair}.2"
                pair += 1
        for node in self.nodes:
            self._start_device(node)

    def _start_device(self, node: WgNode) -> None:
        self.sandbox.track(node.socket)
        log_path = self.log_dir / f"{node.ifname}.log" if self.log_dir else None
        node.process = self.sandbox.spawn(["wireguard-go", "-f", node.ifname], ns=node.ns,
                                          log_path=log_path)
        self._wait(node.socket.exists, self.start_timeout,
                   f"wireguard-go socket {node.socket}")
        run(["wg", "set", node.ifname, "private-key", "/dev/stdin", "listen-port", str(PORT)],
            ns=node.ns, input=node.private_key + "\n")
        for other in self.nodes:
            if other is not node:
                self.add_peer(node, other)
        run(["ip", "addr", "add", f"{node.overlay}/32", "dev", node.ifname], ns=node.ns)
        run(["ip", "link", "set", node.ifname, "up"], ns=node.ns)
        run(["ip", "route", "replace", CLUSTER_CIDR, "dev", node.ifname, "scope", "link"],
            ns=node.ns)

    # --- reading -------------------------------------------------------------------------
    def endpoint(self, node: WgNode, peer: WgNode) -> str:
        """Where ``node`` sends ``peer``'s packets."""
        return f"{peer.underlay[node.index]}:{PORT}"

    def dump(self, node: WgNode) -> dict[str, list[str]]:
        """``wg show <if> dump`` peer rows by public key (lab only; no private key kept)."""
        rows = run(["wg", "show", node.ifname, "dump"], ns=node.ns).stdout.splitlines()[1:]
        return {r.split("\t")[0]: r.split("\t") for r in rows if r}

    def last_handshake(self, node: WgNode, peer: WgNode) -> int:
        row = self.dump(node).get(peer.public_key)
        return int(row[4]) if row else 0

    def wait_handshake(self, node: WgNode, peer: WgNode, timeout: float = 15.0) -> None:
        """Poll until ``node`` reports a handshake with ``peer`` (pinging to provoke one)."""
        def done() -> bool:
            run(["ping", "-c", "1", "-W", "1", peer.overlay], ns=node.ns, check=False)
            return self.last_handshake(node, peer) > 0
        self._wait(done, timeout, f"handshake {node.ifname} -> {peer.ifname}")

    def in_csum_errors(self, node: WgNode) -> int:
        """The ``Udp: InCsumErrors`` counter of ``node``'s namespace."""
        lines = [ln.split() for ln in run(["cat", "/proc/net/snmp"], ns=node.ns).stdout
                 .splitlines() if ln.startswith("Udp:")]
        if len(lines) < 2 or "InCsumErrors" not in lines[0]:
            raise LabError(f"no Udp InCsumErrors in /proc/net/snmp of {node.ns}")
        return int(lines[1][lines[0].index("InCsumErrors")])

    # --- changing the mesh ---------------------------------------------------------------
    def add_peer(self, node: WgNode, peer: WgNode) -> None:
        run(["wg", "set", node.ifname, "peer", peer.public_key,
             "endpoint", self.endpoint(node, peer),
             "allowed-ips", peer.pod_cidr,
             "persistent-keepalive", str(self.keepalive) if self.keepalive else "off"],
            ns=node.ns)

    def remove_peer(self, node: WgNode, peer: WgNode) -> None:
        run(["wg", "set", node.ifname, "peer", peer.public_key, "remove"], ns=node.ns)

    def stop_node(self, node: WgNode) -> None:
        """Stop ``node``'s daemon (a powered-off box): its device and socket disappear."""
        proc = node.process
        if proc is not None and proc in self.sandbox.processes:
            _stop(proc)
            self.sandbox.processes.remove(proc)
        node.process = None
        node.socket.unlink(missing_ok=True)

    def recreate_device(self, node: WgNode) -> None:
        """Delete and re-create ``node``'s device with the same key and peers (counters and
        handshakes start from zero), like Flannel rebuilding ``flannel-wg``."""
        self.stop_node(node)
        self._wait(lambda: not node.socket.exists(), 5.0, f"{node.socket} removed")
        run(["ip", "link", "del", node.ifname], ns=node.ns, check=False)
        self._start_device(node)

    # --- faults (nftables inside the namespaces) -----------------------------------------
    def _apply(self, node: WgNode, chains: str) -> None:
        self.sandbox.nft(node.ns, f"table inet {FAULT_TABLE}\n"
                                  f"delete table inet {FAULT_TABLE}\n"
                                  f"table inet {FAULT_TABLE} {{\n{chains}\n}}\n")

    def set_tx_offload(self, node: WgNode, on: bool) -> None:
        for uplink in node.uplinks.values():
            run(["ethtool", "-K", uplink, "tx", "on" if on else "off"], ns=node.ns)

    def corrupt_handshakes(self, *nodes: WgNode, offload_off: bool = True) -> None:
        """The incident: every handshake packet these nodes send leaves with a bad UDP
        checksum (first payload byte 1 = initiation, 2 = response)."""
        for node in nodes:
            if offload_off:
                self.set_tx_offload(node, on=False)
            self._apply(node, (
                "  chain out { type filter hook output priority 0; policy accept;\n"
                f"    udp sport {PORT} @th,64,8 {{ {HANDSHAKE_INITIATION}, "
                f"{HANDSHAKE_RESPONSE} }} udp checksum set 0xdead counter\n  }}"))

    def blackhole(self, *nodes: WgNode) -> None:
        """Drop all tunnel UDP arriving at these nodes (senders' tx counters still grow,
        as when the path drops packets in transit)."""
        for node in nodes:
            self._apply(node, (
                "  chain in { type filter hook input priority 0; policy accept;\n"
                f"    udp dport {PORT} counter drop\n  }}"))

    def loss(self, percent: int, *nodes: WgNode) -> None:
        """Drop ``percent`` % of tunnel UDP arriving at these nodes, at random."""
        if not 0 <= percent <= 100:
            raise ValueError("percent must be 0-100")
        for node in nodes:
            self._apply(node, (
                "  chain in { type filter hook input priority 0; policy accept;\n"
                f"    udp dport {PORT} numgen random mod 100 < {percent} counter drop\n  }}"))

    def clear_faults(self, *nodes: WgNode) -> None:
        for node in nodes or tuple(self.nodes):
            self.sandbox.nft(node.ns, f"table inet {FAULT_TABLE}\n"
                                      f"delete table inet {FAULT_TABLE}\n")

    def fault_counter(self, node: WgNode) -> int:
        """Packets matched by ``node``'s fault rule so far (0 without a fault)."""
        out = run(["nft", "list", "table", "inet", FAULT_TABLE], ns=node.ns, check=False)
        total = 0
        for word_before, word in zip(out.stdout.split(), out.stdout.split()[1:], strict=False):
            if word_before == "packets":
                with contextlib.suppress(ValueError):
                    total += int(word)
        return total

    # --- lifetime ------------------------------------------------------------------------
    @staticmethod
    def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return
            if time.monotonic() >= deadline:
                raise LabError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(0.05)

    def close(self) -> None:
        """Stop every daemon, delete namespaces (veths and nft tables go with them) and
        sockets. Safe to call twice."""
        if self._own_sandbox:
            self.sandbox.close()
        else:
            for node in self.nodes:
                self.stop_node(node)
        for node in self.nodes:
            node.socket.unlink(missing_ok=True)

    def __enter__(self) -> WgMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
