"""The faulty-NIC emulator: the incident's 4G NIC, between an edge and the cloud.

Runs in a *gateway* namespace (the carrier's NAT of a real 4G link) as a UDP relay for the
WireGuard port: the edge's WireGuard peer endpoint for the cloud is the relay, and the
relay forwards to the cloud's real endpoint. While the edge uplink's TX checksum offload is
on, every WireGuard *handshake* message from the edge (first payload byte 1 = initiation,
2 = response) is re-emitted towards the cloud from a raw socket with a wrong UDP checksum,
so the cloud's kernel drops it and counts ``InCsumErrors`` — the incident's exact mechanism.
Transport data and keepalives pass untouched, as they did in the field (the established
session kept working until it had to rekey). With offload off, everything passes.

Like the carrier's NAT, the relay keeps one mapping for the edge's current source: when the
edge's packets start coming from a new address (the modem got a new one with a new data
session) or a new port (the agent's ``rebind``), it opens a new mapping on a new port, so
the cloud sees the edge at a new endpoint and learns it by WireGuard's roaming (the next
authenticated packet), as in the field. The same source keeps its mapping, whatever
happens behind it: a Flannel restart re-creates the device on port 51820, same flow.

Port drift (flannel-io/flannel#1770: both nodes of a pair see each other at a random
port, not 51820, and stop talking until a Flannel pod is deleted), three signals, each the
NAT's own doing: ``SIGUSR1`` re-maps the edge's flow to a new random public port and
forgets the old one (what the cloud still sends there is dropped, as a NAT drops what
matches no mapping); ``SIGUSR2`` moves the cloud's side of the flow to a random port too
(the edge now sees the cloud's packets come from ``--listen``'s address and a random port,
and roams to it: a NAT in front of the hub, as for 1770's node pairs); ``SIGHUP`` forgets
the drifted mappings (expired, or the NAT restarted): both ends now send to random ports
that nothing forwards. Packets to ``--listen`` (the port the edge is configured with) still
get a fresh mapping on the next one.

Why a relay and not an nftables rule in the edge: on veth, a packet sent while TX offload is
on reaches the peer as CHECKSUM_PARTIAL and is never verified, so ``udp checksum set`` in
the edge has no effect exactly when offload is on. A datagram sent from a raw socket with a
wrong checksum is verified and dropped by the receiving namespace (both verified on these
machines).

The edge uplink's offload state is read with the ``ETHTOOL_GFEATURES`` ioctl on a socket
created inside the edge namespace (:mod:`edgeheal.lab.nsutil`), every 200 ms. Events
(corrupted handshakes, offload changes) go to a JSON-lines file for the lab's timeline.

    python -m edgeheal.lab.faultynic --edge-ns NS --uplink IF --listen IP:PORT \
        --upstream IP:PORT --source IP --events FILE
"""

from __future__ import annotations

import argparse
import array
import fcntl
import json
import selectors
import signal
import socket
import struct
import sys
import time
from pathlib import Path

from edgeheal.lab.nsutil import inside

SIOCETHTOOL = 0x8946
ETHTOOL_GFEATURES = 0x0000003A
UDP_CSUM_BITS = (1, 3, 4)
"""NETIF_F_IP_CSUM, NETIF_F_HW_CSUM, NETIF_F_IPV6_CSUM (``enum netdev_features``, stable
since 2.6): the features ethtool calls tx-checksum-ipv4, -ip-generic and -ipv6 — the ones
that checksum a UDP datagram. (The legacy ETHTOOL_GTXCSUM also counts SCTP and FCoE CRC
offload, which veth keeps on, so it would report "on" after edgeheal's fix.)"""
HANDSHAKE_TYPES = (1, 2)
BAD_CHECKSUM = 0xBEEF


class OffloadProbe:
    """Reads whether TX checksumming is on for ``ifname`` in namespace ``ns`` (cached)."""

    def __init__(self, ns: str, ifname: str, ttl: float = 0.2) -> None:
        with inside(ns):
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.ifname, self.ttl = ifname, ttl
        self._value: bool | None = None
        self._at = -1e9

    def on(self) -> bool | None:
        now = time.monotonic()
        if now - self._at >= self.ttl:
            self._at, self._value = now, self._read()
        return self._value

    def _read(self) -> bool | None:
        blocks = 2
        buf = array.array("B", struct.pack("II", ETHTOOL_GFEATURES, blocks)
                          + bytes(16 * blocks))
        addr, _ = buf.buffer_info()
        ifreq = struct.pack("16sP", self.ifname.encode(), addr)
        try:
            fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, ifreq)
        except OSError:
            return None  # interface gone (modem re-enumerating): treat as unknown
        _available, _requested, active, _never = struct.unpack_from("IIII", buf.tobytes(), 8)
        return any(active & (1 << bit) for bit in UDP_CSUM_BITS)


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return int(~total & 0xFFFF)


def ipv4_udp(src: str, sport: int, dst: str, dport: int, payload: bytes, *, udp_sum: int,
             ) -> bytes:
    """An IPv4+UDP packet with a given UDP checksum (the IP header checksum is correct)."""
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), udp_sum) + payload
    total = 20 + len(udp)
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, socket.IPPROTO_UDP,
                         0, socket.inet_aton(src), socket.inet_aton(dst))
    header = header[:10] + struct.pack("!H", checksum(header)) + header[12:]
    return header + udp


def good_udp_checksum(src: str, dst: str, sport: int, dport: int, payload: bytes) -> int:
    length = 8 + len(payload)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack(
        "!BBH", 0, socket.IPPROTO_UDP, length)
    value = checksum(pseudo + struct.pack("!HHHH", sport, dport, length, 0) + payload)
    return value or 0xFFFF


def relay(args: argparse.Namespace) -> None:  # noqa: PLR0915 - one event loop, read whole
    probe = OffloadProbe(args.edge_ns, args.uplink)
    lhost, lport = args.listen.rsplit(":", 1)
    uhost, uport = args.upstream.rsplit(":", 1)
    edge_side = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    edge_side.bind((lhost, int(lport)))

    def mapping(port: int) -> socket.socket:
        """The carrier NAT's mapping for the edge: a socket on the carrier's public side."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((args.source, port))
        sock.connect((uhost, int(uport)))
        return sock

    sel = selectors.DefaultSelector()

    def open_mapping(port: int = 0) -> socket.socket:
        sock = mapping(port)
        sel.register(sock, selectors.EVENT_READ, "cloud")
        return sock

    cloud_side: socket.socket | None = open_mapping(int(lport))
    to_edge = edge_side
    """Where the cloud's packets reach the edge from (``edge_side``, or a drifted port)."""
    stale: set[socket.socket] = set()
    """Mappings the NAT forgot: what arrives on them is dropped."""

    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    events = Path(args.events).open("a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def emit(event: str, **detail: object) -> None:
        events.write(json.dumps({"t": time.time(), "event": event, **detail}) + "\n")

    stop = False
    pending: list[str] = []

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    for signum, what in ((signal.SIGUSR1, "remap"), (signal.SIGUSR2, "drift"),
                         (signal.SIGHUP, "forget")):
        signal.signal(signum, lambda *_, w=what: pending.append(w))
    sel.register(edge_side, selectors.EVENT_READ, "edge")
    edge_addr: tuple[str, int] | None = None
    last_state: bool | None = None
    emit("started", uplink=args.uplink)
    while not stop:
        while pending:  # the port-drift faults, applied between packets
            what = pending.pop(0)
            if what == "remap" and cloud_side is not None:
                stale.add(cloud_side)
                old_port = cloud_side.getsockname()[1]
                cloud_side = open_mapping()
                emit("nat_remap", old=f"{args.source}:{old_port}",
                     public=f"{args.source}:{cloud_side.getsockname()[1]}")
            elif what == "drift":
                if to_edge is not edge_side:
                    stale.add(to_edge)
                to_edge = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                to_edge.bind((lhost, 0))
                sel.register(to_edge, selectors.EVENT_READ, "edge")
                emit("hub_drift", hub=f"{lhost}:{to_edge.getsockname()[1]}")
            elif what == "forget":
                forgotten = [s for s in (cloud_side, to_edge) if s not in (None, edge_side)]
                stale.update(s for s in forgotten if s is not None)
                emit("nat_forget", ports=[s.getsockname()[1] for s in forgotten
                                          if s is not None])
                cloud_side, to_edge = None, edge_side
        state = probe.on()
        if state != last_state:
            emit("offload", on=state)
            last_state = state
        for key, _ in sel.select(timeout=0.2):
            sock = key.fileobj  # not ``cloud_side``: a new mapping may have replaced it
            if not isinstance(sock, socket.socket):
                continue
            try:
                data, addr = sock.recvfrom(65535)
            except OSError:
                continue
            if sock in stale:
                continue  # no mapping any more: a NAT drops it, silently
            if key.data == "cloud":
                if edge_addr is not None:
                    to_edge.sendto(data, edge_addr)
                continue
            if cloud_side is None or (edge_addr is not None and addr != edge_addr):
                # The edge came back with a new address (a new data session) or port (a
                # rebind), or its mapping was forgotten: like a carrier NAT, a new
                # mapping, so the cloud sees the edge from a new endpoint and must learn
                # it from the next authenticated packet (roaming).
                if cloud_side is not None:
                    sel.unregister(cloud_side)
                    cloud_side.close()
                cloud_side = open_mapping()
                emit("nat_mapping", edge=f"{addr[0]}:{addr[1]}",
                     public=f"{args.source}:{cloud_side.getsockname()[1]}")
            edge_addr = addr
            if data and data[0] in HANDSHAKE_TYPES and state:
                src_port = cloud_side.getsockname()[1]
                good = good_udp_checksum(args.source, uhost, src_port, int(uport), data)
                bad = BAD_CHECKSUM if good != BAD_CHECKSUM else BAD_CHECKSUM ^ 1
                raw.sendto(ipv4_udp(args.source, src_port, uhost, int(uport), data, udp_sum=bad),
                           (uhost, 0))
                emit("corrupted", type=data[0], bytes=len(data))
            else:
                cloud_side.send(data)
    emit("stopped")
    events.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edge-ns", required=True)
    parser.add_argument("--uplink", required=True, help="the edge's uplink interface")
    parser.add_argument("--listen", required=True, help="IP:PORT facing the edge")
    parser.add_argument("--upstream", required=True, help="the cloud's WireGuard IP:PORT")
    parser.add_argument("--source", required=True, help="this gateway's IP facing the cloud")
    parser.add_argument("--events", required=True, help="JSON-lines event file")
    relay(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
