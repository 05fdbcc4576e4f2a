"""``edgeheal diagnose``: the incident engineers' tcpdump + ``wg show`` + ``ethtool -k`` in one.

In the field incident it took tcpdump on both ends, ``wg show``, ``ethtool -k`` and hours to
see that rekey packets left the edge with bad checksums and were dropped at the cloud. This
module collects that evidence on the edge node in one pass and names the likely cause:

1. the tunnel devices' listen port(s) and peers (:mod:`edgeheal.wg`, before and after);
2. the uplink's TX checksum offload (:mod:`edgeheal.ethtool`, the configured features);
3. the kernel's UDP ``InCsumErrors`` / ``InErrors`` (``/proc/net/snmp``, before and after);
4. N seconds of the tunnel's UDP on the uplink, captured with scapy (imported only inside
   :func:`capture`, so neither the agent nor any other command pays for it), each datagram
   classified by :func:`classify` and counted per peer endpoint and direction.

Then :func:`judge`, a pure function of that :class:`Evidence`, gives one verdict per peer
and overall (the worst), in plain words. Verdicts (``Code``)::

    healthy             transport data / keepalives arrive, handshakes complete
    checksum_offload    handshakes sent, never answered, TX checksum offload on: the
                        incident ("rekey packets are probably leaving with bad checksums")
    path_down           we send, nothing at all comes back: uplink or cloud path down
    handshake_rejected  responses arrive but the handshake does not complete, or the peer's
                        initiations are never answered here: keys / endpoint mismatch
    unanswered          handshakes sent, never answered, offload off: the peer does not
                        accept them or the path drops them on the way out
    no_traffic          no tunnel UDP at all during the capture (wrong interface? idle?)
    no_tunnel           none of the configured WireGuard interfaces exists

WireGuard messages are recognised by the first payload byte and the exact size (type 1
initiation 148 bytes, 2 response 92, 3 cookie reply 64, 4 transport >= 32 in 16-byte steps;
a keepalive is transport with an empty payload, 32 bytes), so nothing is decrypted and no
key is needed. Direction comes from the addresses (ours vs. the peer's), not from the ports:
Flannel peers all use 51820 on both ends.

The capture socket gets a classic BPF program (:func:`bpf_program`) that passes only UDP on
the listen ports, built here rather than by libpcap (which scapy needs for filter strings
and edge nodes rarely have). It addresses the IP header with the kernel's ``SKF_NET_OFF``,
so it works on Ethernet and on raw-IP 4G interfaces (wwan) alike. Every packet is checked
again in Python, so the filter only saves work, never decides.

Errors: :class:`DiagnoseError` for what the operator must fix: a bad argument or an uplink
that cannot be found (exit 2), or, as :class:`EnvironmentProblem` (exit 3), scapy missing,
no CAP_NET_RAW (:class:`CaptureUnavailable`) or a WireGuard device that cannot be read.
"""

from __future__ import annotations

import enum
import errno
import ipaddress
import logging
import select
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

log = logging.getLogger(__name__)

REJECT_AFTER_TIME = 180.0
"""A session older than this is refused (wireguard-go device/constants.go)."""
DEFAULT_MIN_SECONDS = 10.0
"""Two REKEY_TIMEOUTs: an unanswered handshake is retried every 5 s."""
MAX_SECONDS = 600.0
CAP_NET_RAW = 13
SNAPLEN = 262144


class DiagnoseError(Exception):
    """Diagnosis cannot run as asked; the message says what to fix."""


class EnvironmentProblem(DiagnoseError):
    """The host lacks something diagnose needs (exit 3): a privilege, a program, a daemon."""


class CaptureUnavailable(EnvironmentProblem):
    """scapy is not installed, or the process lacks CAP_NET_RAW."""


# --- the message classifier (pure) -------------------------------------------------------

class MessageType(enum.Enum):
    INITIATION = "initiation"
    RESPONSE = "response"
    COOKIE_REPLY = "cookie_reply"
    TRANSPORT = "transport"
    KEEPALIVE = "keepalive"
    OTHER = "other"
    """On the tunnel's port, but not a well-formed WireGuard message."""


_FIXED_SIZE = {1: (MessageType.INITIATION, 148), 2: (MessageType.RESPONSE, 92),
               3: (MessageType.COOKIE_REPLY, 64)}
TRANSPORT_HEADER = 16
AEAD_TAG = 16
KEEPALIVE_SIZE = TRANSPORT_HEADER + AEAD_TAG


def classify(payload: bytes) -> MessageType:
    """One UDP payload -> its WireGuard message type (by type byte and exact size).

    The three reserved bytes after the type are zero in every valid message; a transport
    message is a 16-byte header plus the encrypted, 16-byte-padded packet plus a 16-byte tag.
    """
    if len(payload) < 4 or payload[1:4] != b"\0\0\0":
        return MessageType.OTHER
    kind = payload[0]
    if kind in _FIXED_SIZE:
        mtype, size = _FIXED_SIZE[kind]
        return mtype if len(payload) == size else MessageType.OTHER
    if kind == 4:
        if len(payload) == KEEPALIVE_SIZE:
            return MessageType.KEEPALIVE
        if len(payload) > KEEPALIVE_SIZE and (len(payload) - KEEPALIVE_SIZE) % 16 == 0:
            return MessageType.TRANSPORT
    return MessageType.OTHER


class Direction(enum.Enum):
    SENT = "sent"
    RECEIVED = "received"


def direction(src: str, sport: int, dst: str, dport: int, *, local: frozenset[str],
              ports: frozenset[int]) -> Direction:
    """Which way a datagram went: by our addresses first, then by our listen ports."""
    if src in local and dst not in local:
        return Direction.SENT
    if dst in local and src not in local:
        return Direction.RECEIVED
    return Direction.SENT if sport in ports and dport not in ports else Direction.RECEIVED


def endpoint_text(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@dataclass
class Tally:
    """What the capture saw: counts per (peer endpoint, direction, message type)."""

    counts: Counter[tuple[str, Direction, MessageType]] = field(default_factory=Counter)
    packets: int = 0
    link_down: int = 0
    """How often the capture socket reported the link going down (ENETDOWN)."""

    def add(self, src: str, sport: int, dst: str, dport: int, payload: bytes, *,
            local: frozenset[str], ports: frozenset[int]) -> None:
        way = direction(src, sport, dst, dport, local=local, ports=ports)
        remote = endpoint_text(dst, dport) if way is Direction.SENT else endpoint_text(
            src, sport)
        self.counts[(remote, way, classify(payload))] += 1
        self.packets += 1

    def endpoints(self) -> list[str]:
        return sorted({key[0] for key in self.counts})

    def of(self, endpoint: str, way: Direction) -> dict[str, int]:
        return {m.value: n for (ep, d, m), n in sorted(
            self.counts.items(), key=lambda kv: list(MessageType).index(kv[0][2]))
            if ep == endpoint and d is way}


# --- the kernel's UDP counters -----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class UdpCounters:
    in_csum_errors: int
    in_errors: int

    def to_json(self) -> dict[str, int]:
        return {"InCsumErrors": self.in_csum_errors, "InErrors": self.in_errors}


def parse_snmp(text: str) -> UdpCounters:
    """``/proc/net/snmp`` -> the ``Udp:`` InCsumErrors and InErrors (ValueError if absent)."""
    rows = [line.split() for line in text.splitlines() if line.startswith("Udp:")]
    if len(rows) < 2:
        raise ValueError("no Udp: lines in /proc/net/snmp")
    names, values = rows[0], rows[1]
    try:
        return UdpCounters(int(values[names.index("InCsumErrors")]),
                           int(values[names.index("InErrors")]))
    except (ValueError, IndexError) as err:
        raise ValueError(f"unexpected Udp: lines in /proc/net/snmp: {err}") from None


def read_udp_counters(path: str = "/proc/net/snmp") -> UdpCounters | None:
    try:
        with open(path, encoding="ascii") as f:
            return parse_snmp(f.read())
    except (OSError, ValueError) as err:
        log.warning("cannot read UDP counters: %s", err)
        return None


# --- the evidence and the verdict (pure) ------------------------------------------------

def _frozen(data: Mapping[str, int] | None) -> Mapping[str, int]:
    return MappingProxyType(dict(data or {}))


@dataclass(frozen=True, slots=True)
class PeerEvidence:
    """One peer endpoint: what we sent it, what it sent us, and the device's view."""

    endpoint: str
    """``ip:port`` on the wire (or the device's endpoint for a peer that was silent)."""
    public_key: str | None = None
    """The device's peer with this endpoint (public, not a secret); None: not matched."""
    interface: str | None = None
    sent: Mapping[str, int] = field(default_factory=dict)
    """Message type value -> count."""
    received: Mapping[str, int] = field(default_factory=dict)
    handshake_before: float | None = None
    """Wall-clock last handshake reported before the capture; None = never/unknown."""
    handshake_after: float | None = None
    rx_bytes_delta: int | None = None
    tx_bytes_delta: int | None = None
    persistent_keepalive: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "sent", _frozen(self.sent))
        object.__setattr__(self, "received", _frozen(self.received))

    @property
    def advanced(self) -> bool | None:
        """Did a handshake complete during the capture? None: the device was not read."""
        if self.public_key is None:
            return None
        if self.handshake_after is None:
            return False
        return self.handshake_before is None or self.handshake_after > self.handshake_before

    def handshake_age(self, now: float) -> float | None:
        return None if self.handshake_after is None else max(0.0, now - self.handshake_after)

    @property
    def name(self) -> str:
        peer = f"peer {self.public_key[:8]}" if self.public_key else "unknown peer"
        return f"{peer} ({self.endpoint})"


@dataclass(frozen=True, slots=True)
class Evidence:
    uplink: str
    seconds: float
    ports: tuple[int, ...]
    interfaces: tuple[str, ...]
    """The WireGuard interfaces found (configured and present)."""
    missing_interfaces: tuple[str, ...] = ()
    offload: Mapping[str, bool] | None = None
    """Uplink TX checksum feature -> on; None: could not be read."""
    uplink_down: str | None = None
    """``down`` / ``no carrier`` / ``went down during the capture``; None: up."""
    udp_before: UdpCounters | None = None
    udp_after: UdpCounters | None = None
    peers: tuple[PeerEvidence, ...] = ()
    packets: int = 0
    now: float = 0.0
    """Wall-clock time at the end of the capture (for handshake ages only)."""
    notes: tuple[str, ...] = ()

    @property
    def offload_on(self) -> bool | None:
        return None if self.offload is None else any(self.offload.values())

    @property
    def csum_errors(self) -> int | None:
        if self.udp_before is None or self.udp_after is None:
            return None
        return self.udp_after.in_csum_errors - self.udp_before.in_csum_errors

    @property
    def in_errors(self) -> int | None:
        if self.udp_before is None or self.udp_after is None:
            return None
        return self.udp_after.in_errors - self.udp_before.in_errors


class Code(enum.Enum):
    """Verdicts, from the most to the least specific diagnosis."""

    CHECKSUM_OFFLOAD = "checksum_offload"
    PATH_DOWN = "path_down"
    HANDSHAKE_REJECTED = "handshake_rejected"
    UNANSWERED = "unanswered"
    NO_TUNNEL = "no_tunnel"
    NO_TRAFFIC = "no_traffic"
    QUIET = "quiet"
    """One peer had no traffic (a neighbour that is off); never the overall verdict alone."""
    HEALTHY = "healthy"


_PRIORITY = list(Code)

SUMMARY = {
    Code.CHECKSUM_OFFLOAD: "handshakes are sent but never answered while TX checksum offload "
                           "is on: rekey packets are probably leaving with bad checksums; run "
                           "`edgeheal offload apply`",
    Code.PATH_DOWN: "nothing at all comes back from the peer: the uplink or the cloud path "
                    "is down",
    Code.HANDSHAKE_REJECTED: "handshake messages arrive but the handshake never completes: "
                             "look at the peer's keys (public and preshared) and endpoint",
    Code.UNANSWERED: "handshakes are sent but never answered (TX checksum offload is off): "
                     "the peer does not accept them (keys, endpoint) or the path drops them",
    Code.NO_TUNNEL: "none of the configured WireGuard interfaces exists",
    Code.NO_TRAFFIC: "no tunnel traffic at all during the capture",
    Code.QUIET: "no traffic with this peer during the capture",
    Code.HEALTHY: "the tunnel is healthy: handshakes complete and data or keepalives arrive",
}

ADVICE = {
    Code.CHECKSUM_OFFLOAD: "Run `edgeheal offload apply` (and keep the agent's [offload] "
                           "interfaces covering this uplink); then run diagnose again.",
    Code.PATH_DOWN: "Check the uplink (link, SIM/carrier, default route) and the cloud "
                    "endpoint's reachability; ping the peer's endpoint address directly.",
    Code.HANDSHAKE_REJECTED: "Compare the public keys (and preshared key) on both ends and "
                             "the peer's endpoint; a restarted peer with a new key does this.",
    Code.UNANSWERED: "Check that the peer has this node's current public key and endpoint, "
                     "and that nothing between drops UDP to the peer's port.",
    Code.NO_TUNNEL: "Check that Flannel runs with the WireGuard backend and the [wireguard] "
                    "interfaces setting names its devices.",
    Code.NO_TRAFFIC: "Check --interface (the uplink the tunnel uses) or capture longer than "
                     "the peers' keepalive interval (--seconds).",
    Code.QUIET: "",
    Code.HEALTHY: "",
}


@dataclass(frozen=True, slots=True)
class Finding:
    peer: PeerEvidence
    code: Code
    why: str
    """The evidence in one sentence."""


@dataclass(frozen=True, slots=True)
class Verdict:
    code: Code
    summary: str
    advice: str
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]

    @property
    def problem(self) -> bool:
        return self.code is not Code.HEALTHY


def _total(counts: Mapping[str, int], *types: MessageType) -> int:
    wanted = {t.value for t in types} if types else None
    return sum(n for k, n in counts.items() if wanted is None or k in wanted)


def judge_peer(peer: PeerEvidence, *, offload_on: bool | None) -> Finding:
    """One peer's evidence -> its finding (pure; the rules of the module docstring)."""
    sent, received = peer.sent, peer.received
    init_out = _total(sent, MessageType.INITIATION)
    resp_out = _total(sent, MessageType.RESPONSE)
    resp_in = _total(received, MessageType.RESPONSE)
    init_in = _total(received, MessageType.INITIATION)
    data_in = _total(received, MessageType.TRANSPORT, MessageType.KEEPALIVE)
    if not sent and not received:
        return Finding(peer, Code.QUIET, "nothing sent or received")
    if not _total(received) and init_out and offload_on:
        # Behind a carrier NAT the cloud often cannot reach us first, so the incident can
        # look like this too; TX offload on is a known cause and cheap to rule out.
        return Finding(peer, Code.CHECKSUM_OFFLOAD,
                       f"{init_out} initiation(s) sent, nothing received at all, while TX "
                       "checksum offload is on (if the fix does not help, the uplink or the "
                       "cloud path is down)")
    if not _total(received):
        return Finding(peer, Code.PATH_DOWN,
                       f"sent {_total(sent)} packet(s) ({_list(sent)}), received none")
    advanced = peer.advanced
    if resp_in and advanced is False:
        return Finding(peer, Code.HANDSHAKE_REJECTED,
                       f"received {resp_in} handshake response(s) but the last handshake "
                       "did not change")
    unanswered_init = init_out > 0 and resp_in == 0
    unconfirmed_resp = resp_out > 0 and data_in == 0
    if (unanswered_init or unconfirmed_resp) and advanced is not True:
        what = []
        if unanswered_init:
            what.append(f"{init_out} initiation(s) sent, no response received")
        if unconfirmed_resp:
            what.append(f"{resp_out} response(s) sent to the peer's initiations, never "
                        "confirmed by data")
        why = "; ".join(what)
        if offload_on:
            return Finding(peer, Code.CHECKSUM_OFFLOAD, why + "; TX checksum offload is on")
        return Finding(peer, Code.UNANSWERED, why)
    if init_in and not resp_out and not data_in and advanced is not True:
        return Finding(peer, Code.HANDSHAKE_REJECTED,
                       f"received {init_in} initiation(s) from the peer and answered none: "
                       "this device does not accept its key")
    if data_in or advanced or (resp_in and advanced is None):
        return Finding(peer, Code.HEALTHY,
                       f"received {data_in} transport/keepalive message(s)"
                       + ("; a handshake completed" if advanced else "")
                       + (f", {resp_in} handshake response(s)" if resp_in else ""))
    return Finding(peer, Code.UNANSWERED,
                   f"received only {_list(received)}; no data or keepalive arrived")


def _list(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counts.items()) or "nothing"


def judge(evidence: Evidence) -> Verdict:
    """The evidence -> the overall verdict (the worst peer's), with notes. Pure."""
    notes = list(evidence.notes)
    if not evidence.interfaces:
        return Verdict(Code.NO_TUNNEL, SUMMARY[Code.NO_TUNNEL], ADVICE[Code.NO_TUNNEL], (),
                       tuple(notes))
    findings = tuple(judge_peer(p, offload_on=evidence.offload_on) for p in evidence.peers)
    active = [f for f in findings if f.code is not Code.QUIET]
    code = min((f.code for f in active), key=_PRIORITY.index, default=Code.NO_TRAFFIC)
    if evidence.uplink_down:
        notes.insert(0, f"the uplink {evidence.uplink} is {evidence.uplink_down}")
        if code is Code.NO_TRAFFIC:
            code = Code.PATH_DOWN
    if evidence.offload_on and code is not Code.CHECKSUM_OFFLOAD:
        on = ", ".join(k for k, v in (evidence.offload or {}).items() if v)
        notes.append(f"TX checksum offload is on on {evidence.uplink} ({on}): handshakes may "
                     "leave with bad checksums; run `edgeheal offload apply`")
    if evidence.csum_errors:
        notes.append(f"the kernel counted {evidence.csum_errors} UDP datagram(s) with a bad "
                     "checksum arriving here (InCsumErrors): a sender's NIC or the path "
                     "corrupts them; check the peer's TX checksum offload")
    for f in findings:
        if f.code is Code.QUIET and active:
            notes.append(f"{f.peer.name}: no traffic during the capture")
    if any(_total(f.peer.received, MessageType.COOKIE_REPLY) for f in findings):
        notes.append("cookie replies arrived: a peer is under load and asks for proof of "
                     "address (normal under a handshake flood)")
    return Verdict(code, SUMMARY[code], ADVICE[code], findings, tuple(notes))


# --- rendering ----------------------------------------------------------------------------

def _age(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.0f} s ago"


def to_json(evidence: Evidence, verdict: Verdict) -> dict[str, Any]:
    def delta(before: UdpCounters | None, after: UdpCounters | None) -> Any:
        if before is None or after is None:
            return None
        return {"InCsumErrors": after.in_csum_errors - before.in_csum_errors,
                "InErrors": after.in_errors - before.in_errors}

    return {
        "verdict": {"code": verdict.code.value, "problem": verdict.problem,
                    "summary": verdict.summary, "advice": verdict.advice},
        "uplink": evidence.uplink,
        "uplink_down": evidence.uplink_down,
        "seconds": evidence.seconds,
        "ports": list(evidence.ports),
        "interfaces": list(evidence.interfaces),
        "missing_interfaces": list(evidence.missing_interfaces),
        "offload": None if evidence.offload is None else {
            "on": evidence.offload_on, "features": dict(evidence.offload)},
        "udp": {"before": evidence.udp_before and evidence.udp_before.to_json(),
                "after": evidence.udp_after and evidence.udp_after.to_json(),
                "delta": delta(evidence.udp_before, evidence.udp_after)},
        "packets": evidence.packets,
        "peers": [{
            "endpoint": f.peer.endpoint, "public_key": f.peer.public_key,
            "interface": f.peer.interface, "sent": dict(f.peer.sent),
            "received": dict(f.peer.received),
            "handshake_age_seconds": _round(f.peer.handshake_age(evidence.now)),
            "handshake_completed_during_capture": f.peer.advanced,
            "rx_bytes_delta": f.peer.rx_bytes_delta, "tx_bytes_delta": f.peer.tx_bytes_delta,
            "finding": f.code.value, "why": f.why} for f in verdict.findings],
        "notes": list(verdict.notes),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def render(evidence: Evidence, verdict: Verdict) -> str:
    ports = ", ".join(str(p) for p in evidence.ports) or "-"
    lines = [f"edgeheal diagnose: {evidence.seconds:g} s of WireGuard UDP (port {ports}; "
             f"{', '.join(evidence.interfaces) or 'no tunnel device'}) on {evidence.uplink}",
             "", f"VERDICT: {verdict.summary}"]
    if verdict.advice:
        lines.append(f"  what to do: {verdict.advice}")
    lines.append("")
    for f in verdict.findings:
        p = f.peer
        lines.append(f"{p.name}{' on ' + p.interface if p.interface else ''}: {f.code.value}")
        lines.append(f"  sent:      {_list(p.sent)}")
        lines.append(f"  received:  {_list(p.received)}")
        if p.public_key is not None:
            during = "a handshake completed during the capture" if p.advanced else (
                "no handshake completed during the capture")
            lines.append(f"  handshake: {_age(p.handshake_age(evidence.now))}; {during}")
        lines.append(f"  why:       {f.why}")
    if evidence.offload is None:
        lines.append(f"uplink {evidence.uplink}: TX checksum offload unknown")
    else:
        state = "ON" if evidence.offload_on else "off"
        feats = ", ".join(f"{k} {'on' if v else 'off'}" for k, v in evidence.offload.items())
        lines.append(f"uplink {evidence.uplink}: TX checksum offload {state} ({feats})")
    if evidence.csum_errors is not None:
        lines.append(f"UDP counters during the capture: InCsumErrors +{evidence.csum_errors}, "
                     f"InErrors +{evidence.in_errors}")
    lines.append(f"captured {evidence.packets} tunnel packet(s)")
    for note in verdict.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


# --- the capture (scapy, imported here only) --------------------------------------------

SKF_AD_OFF = -0x1000
SKF_AD_PROTOCOL = 0
SKF_NET_OFF = -0x100000
_LD, _LDX, _ALU, _JMP, _RET, _MISC = 0x00, 0x01, 0x04, 0x05, 0x06, 0x07
_W, _H, _B = 0x00, 0x08, 0x10
_ABS, _IND = 0x20, 0x40
_JEQ, _JSET, _AND, _LSH, _K, _TAX = 0x10, 0x40, 0x50, 0x60, 0x00, 0x00


def bpf_program(ports: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Classic BPF: accept IPv4/IPv6 UDP with source or destination port in ``ports``.

    Offsets are relative to the network header (``SKF_NET_OFF``), and the family comes from
    ``skb->protocol`` (``SKF_AD_PROTOCOL``), so the link layer does not matter. IPv4
    fragments after the first are dropped (no UDP header); IPv6 extension headers are not
    followed (WireGuard sends none).
    """
    if not ports or len(ports) > 32:
        raise ValueError("between 1 and 32 ports")
    code: list[tuple[int, int | str, int | str, int] | str] = []
    """Instructions, and label strings marking the index of the next instruction."""

    def op(c: int, k: int = 0, jt: int | str = 0, jf: int | str = 0) -> None:
        code.append((c, jt, jf, k & 0xFFFFFFFF))

    def port_tests(final: bool) -> None:
        for i, port in enumerate(ports):
            last = i == len(ports) - 1
            op(_JMP | _JEQ | _K, port, "accept", "drop" if final and last else 0)

    op(_LD | _W | _ABS, SKF_AD_OFF + SKF_AD_PROTOCOL)
    op(_JMP | _JEQ | _K, 0x0800, "v4", 0)
    op(_JMP | _JEQ | _K, 0x86DD, "v6", "drop")
    code.append("v4")
    op(_LD | _B | _ABS, SKF_NET_OFF + 9)
    op(_JMP | _JEQ | _K, 17, 0, "drop")
    op(_LD | _H | _ABS, SKF_NET_OFF + 6)
    op(_JMP | _JSET | _K, 0x1FFF, "drop", 0)
    op(_LD | _B | _ABS, SKF_NET_OFF)
    op(_ALU | _AND | _K, 0x0F)
    op(_ALU | _LSH | _K, 2)
    op(_MISC | _TAX)
    op(_LD | _H | _IND, SKF_NET_OFF)
    port_tests(final=False)
    op(_LD | _H | _IND, SKF_NET_OFF + 2)
    port_tests(final=True)
    code.append("v6")
    op(_LD | _B | _ABS, SKF_NET_OFF + 6)
    op(_JMP | _JEQ | _K, 17, 0, "drop")
    op(_LD | _H | _ABS, SKF_NET_OFF + 40)
    port_tests(final=False)
    op(_LD | _H | _ABS, SKF_NET_OFF + 42)
    port_tests(final=True)
    code.append("accept")
    op(_RET | _K, SNAPLEN)
    code.append("drop")
    op(_RET | _K, 0)
    labels: dict[str, int] = {}
    real: list[tuple[int, int | str, int | str, int]] = []
    for row in code:
        if isinstance(row, str):
            labels[row] = len(real)
        else:
            real.append(row)

    def target(j: int | str, index: int) -> int:
        offset = labels[j] - index - 1 if isinstance(j, str) else j
        if not 0 <= offset <= 255:
            raise ValueError("BPF jump out of range")
        return offset

    return [(c, target(jt, i), target(jf, i), k) for i, (c, jt, jf, k) in enumerate(real)]


def attach_filter(sock: socket.socket, ports: Sequence[int]) -> None:
    """Attach :func:`bpf_program` to a packet socket (``SO_ATTACH_FILTER``)."""
    import ctypes  # noqa: PLC0415

    program = bpf_program(ports)
    insns = b"".join(struct.pack("HBBI", c, jt, jf, k) for c, jt, jf, k in program)
    buf = ctypes.create_string_buffer(insns)
    fprog = struct.pack("HL", len(program), ctypes.addressof(buf))
    so_attach_filter = 26
    sock.setsockopt(socket.SOL_SOCKET, so_attach_filter, fprog)


def has_cap_net_raw(status_path: str = "/proc/self/status") -> bool | None:
    """CAP_NET_RAW in the effective set (None: cannot tell)."""
    try:
        with open(status_path, encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_NET_RAW & 1)
    except (OSError, ValueError):
        return None
    return None


def require_capture() -> None:
    """Raise :class:`CaptureUnavailable` unless scapy imports and a packet socket opens."""
    try:
        import scapy  # noqa: PLC0415, F401
    except ImportError as err:
        raise CaptureUnavailable(
            "scapy is not installed; diagnose captures with it (install the Python package "
            "'scapy' into edgeheal's environment)") from err
    if has_cap_net_raw() is False:
        raise CaptureUnavailable(
            "capturing packets needs CAP_NET_RAW (run as root, e.g. with sudo)")
    try:
        probe = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    except PermissionError as err:
        raise CaptureUnavailable(
            "capturing packets needs CAP_NET_RAW (run as root, e.g. with sudo)") from err
    probe.close()


def capture(uplink: str, ports: Sequence[int], seconds: float) -> Tally:
    """Count the WireGuard messages on ``uplink`` for ``seconds`` (scapy, CAP_NET_RAW).

    Our own receive loop rather than scapy's ``sniff``: ``sniff`` drops a socket that
    reports an error and ends early, and a packet socket reports ENETDOWN once when its
    link flaps, which is exactly when a diagnosis must keep listening.
    """
    try:
        from scapy.arch.linux import L2ListenSocket  # noqa: PLC0415 - heavy, only here
        from scapy.config import conf  # noqa: PLC0415
        from scapy.layers.inet import IP, UDP  # noqa: PLC0415
        from scapy.layers.inet6 import IPv6  # noqa: PLC0415
    except ImportError as err:
        raise CaptureUnavailable(f"scapy is not installed or incomplete: {err}") from err
    try:
        iface = conf.ifaces.dev_from_name(uplink)
        local = frozenset(str(ipaddress.ip_address(a.split("%")[0]))
                          for family in (4, 6) for a in iface.ips.get(family, ()))
    except (ValueError, KeyError) as err:
        raise DiagnoseError(f"{uplink}: no such interface") from err
    wanted = frozenset(ports)
    tally = Tally()
    try:
        sock = L2ListenSocket(iface=uplink, promisc=False, nofilter=1)
    except PermissionError as err:
        raise CaptureUnavailable("capturing packets needs CAP_NET_RAW") from err
    except OSError as err:
        raise DiagnoseError(f"{uplink}: cannot capture: {err.strerror or err}") from err
    try:
        try:
            attach_filter(sock.ins, ports)
        except OSError as err:  # the Python check below still filters
            log.debug("BPF filter not attached: %s", err)
        deadline = time.monotonic() + seconds
        while (remain := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([sock.ins], [], [], remain)
            if not ready:
                continue
            try:
                pkt = sock.recv()
            except OSError as err:
                if err.errno not in (errno.ENETDOWN, errno.ENODEV, errno.ENXIO):
                    raise DiagnoseError(f"{uplink}: capture failed: {err}") from err
                tally.link_down += 1
                continue
            if pkt is None:
                continue
            ip = pkt.getlayer(IP) or pkt.getlayer(IPv6)
            udp = pkt.getlayer(UDP)
            if ip is None or udp is None or (
                    udp.sport not in wanted and udp.dport not in wanted):
                continue
            tally.add(str(ip.src), int(udp.sport), str(ip.dst), int(udp.dport),
                      bytes(udp.payload), local=local, ports=wanted)
    finally:
        sock.close()
    return tally


def link_down(ifname: str) -> str | None:
    """``"down"`` / ``"no carrier"`` when the link is not up and running, else None."""
    import fcntl  # noqa: PLC0415

    siocgifflags, iff_up, iff_running = 0x8913, 0x1, 0x40
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), siocgifflags,
                                 struct.pack("16sH22x", ifname.encode()[:15], 0))
        except OSError:
            return None
    (flags,) = struct.unpack_from("H", answer, 16)
    if not flags & iff_up:
        return "down"
    return None if flags & iff_running else "no carrier"


# --- gathering the evidence --------------------------------------------------------------

async def read_devices(names: Iterable[str]) -> tuple[list[Any], list[str]]:
    """Read each configured WireGuard interface; absent ones are listed, not errors."""
    from edgeheal.wg import NoSuchDevice, WireGuardError, read_device  # noqa: PLC0415

    found, missing = [], []
    for name in names:
        try:
            found.append(await read_device(name))
        except NoSuchDevice:
            missing.append(name)
        except WireGuardError as err:
            raise EnvironmentProblem(f"cannot read WireGuard interface {err}") from err
    return found, missing


def present_interfaces() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


async def route_interface(addresses: Iterable[str]) -> str | None:
    """The interface of the route to the first of ``addresses`` that has one (rtnetlink)."""
    from edgeheal import _pyroute2  # noqa: PLC0415

    _pyroute2.light()
    from pyroute2.iproute.linux import AsyncIPRoute  # noqa: PLC0415 - heavy, lazy

    ipr = AsyncIPRoute()
    try:
        for address in addresses:
            try:
                msgs = await ipr.route("get", dst=address)
                if hasattr(msgs, "__aiter__"):
                    msgs = [m async for m in msgs]
            except Exception as err:  # netlink says "unreachable" in many ways
                log.debug("no route to %s: %s", address, err)
                continue
            for msg in msgs:
                oif = msg.get_attr("RTA_OIF")
                if oif:
                    return socket.if_indextoname(int(oif))
    finally:
        ipr.close()
    return None


def choose_uplink(patterns: Sequence[str], present: Sequence[str], routed: str | None,
                  ) -> str | None:
    """The uplink: an ``[offload] interfaces`` match (the routed one if several), else the
    interface of the route to the peers' endpoints. Pure."""
    import fnmatch  # noqa: PLC0415

    matches = sorted(n for n in present if any(fnmatch.fnmatchcase(n, p) for p in patterns))
    if routed in matches or (not matches and routed):
        return routed
    return matches[0] if matches else None


def endpoint_host(endpoint: str) -> str:
    return endpoint.rsplit(":", 1)[0].strip("[]")


def default_seconds(devices: Iterable[Any]) -> float:
    """Long enough to see a keepalive from every peer (longest keepalive + 5 s), >= 10 s."""
    longest = max((p.persistent_keepalive for d in devices for p in d.peers), default=0)
    return min(MAX_SECONDS, max(DEFAULT_MIN_SECONDS, float(longest) + 5.0))


def read_offload(uplink: str, features: Sequence[str]) -> tuple[dict[str, bool] | None, str]:
    from edgeheal.ethtool import Ethtool, EthtoolError  # noqa: PLC0415

    try:
        with Ethtool() as source:
            present = source.features(uplink)
    except EthtoolError as err:
        return None, f"cannot read the uplink's offload state: {err}"
    return {name: present[name].on for name in features if name in present}, ""


def build_evidence(*, uplink: str, seconds: float, before: Sequence[Any],
                   after: Sequence[Any], missing: Sequence[str], tally: Tally,
                   offload: Mapping[str, bool] | None, udp_before: UdpCounters | None,
                   udp_after: UdpCounters | None, now: float, notes: Sequence[str] = (),
                   uplink_down: str | None = None) -> Evidence:
    """Join the capture with the devices' peers by endpoint. Pure."""
    peers_before = {(d.interface, p.public_key): p for d in before for p in d.peers}
    by_endpoint: dict[str, tuple[str, Any]] = {}
    for device in after:
        for peer in device.peers:
            if peer.endpoint:
                by_endpoint[_norm_endpoint(peer.endpoint)] = (device.interface, peer)
    out: list[PeerEvidence] = []
    seen: set[str] = set()
    for endpoint in tally.endpoints():
        match = by_endpoint.get(_norm_endpoint(endpoint))
        out.append(_peer_evidence(endpoint, match, peers_before, tally))
        seen.add(_norm_endpoint(endpoint))
    for endpoint, match in sorted(by_endpoint.items()):
        if endpoint not in seen:
            out.append(_peer_evidence(endpoint, match, peers_before, tally))
    ports = tuple(sorted({d.listen_port for d in after or before if d.listen_port}))
    return Evidence(uplink=uplink, seconds=seconds, ports=ports,
                    interfaces=tuple(d.interface for d in before),
                    missing_interfaces=tuple(missing), offload=offload,
                    uplink_down=uplink_down or (
                        "went down during the capture" if tally.link_down else None),
                    udp_before=udp_before, udp_after=udp_after, peers=tuple(out),
                    packets=tally.packets, now=now, notes=tuple(notes))


def _norm_endpoint(endpoint: str) -> str:
    host, _, port = endpoint.rpartition(":")
    try:
        host = str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return endpoint
    return endpoint_text(host, int(port)) if port.isdigit() else endpoint


def _peer_evidence(endpoint: str, match: tuple[str, Any] | None,
                   before: Mapping[tuple[str, str], Any], tally: Tally) -> PeerEvidence:
    sent, received = tally.of(endpoint, Direction.SENT), tally.of(endpoint, Direction.RECEIVED)
    if match is None:
        return PeerEvidence(endpoint=endpoint, sent=sent, received=received)
    ifname, peer = match
    prev = before.get((ifname, peer.public_key))
    return PeerEvidence(
        endpoint=endpoint, public_key=peer.public_key, interface=ifname, sent=sent,
        received=received,
        handshake_before=prev.last_handshake if prev is not None else None,
        handshake_after=peer.last_handshake,
        rx_bytes_delta=peer.rx_bytes - prev.rx_bytes if prev is not None else None,
        tx_bytes_delta=peer.tx_bytes - prev.tx_bytes if prev is not None else None,
        persistent_keepalive=peer.persistent_keepalive)


async def diagnose(config: Any, *, interface: str | None = None,
                   seconds: float | None = None,
                   capture_fn: Callable[..., Tally] | None = None,
                   ) -> tuple[Evidence, Verdict]:
    """Gather the evidence (blocking capture in a worker thread) and judge it."""
    import asyncio  # noqa: PLC0415

    if seconds is not None and not 0 < seconds <= MAX_SECONDS:
        raise DiagnoseError(f"--seconds must be between 0 and {MAX_SECONDS:g}")
    require_capture()
    devices, missing = await read_devices(config.wireguard.interfaces)
    endpoints = [p.endpoint for d in devices for p in d.peers if p.endpoint]
    if interface is not None:
        if interface not in present_interfaces():
            raise DiagnoseError(f"--interface {interface}: no such interface")
        uplink = interface
    else:
        hosts = [endpoint_host(e) for e in endpoints]
        routed = await route_interface(hosts) if hosts else None
        chosen = choose_uplink(config.offload.interfaces, present_interfaces(), routed)
        if chosen is None:
            raise DiagnoseError("cannot tell which interface is the uplink (no [offload] "
                                "interfaces match and no peer endpoint is routed); pass "
                                "--interface")
        uplink = chosen
    span = seconds if seconds is not None else default_seconds(devices)
    offload, problem = await asyncio.to_thread(read_offload, uplink, config.offload.features)
    notes = [problem] if problem else []
    if missing:
        notes.append("not present: " + ", ".join(missing))
    ports = sorted({d.listen_port for d in devices if d.listen_port})
    if not devices or not ports:
        evidence = Evidence(uplink=uplink, seconds=0.0, ports=(), interfaces=(),
                            missing_interfaces=tuple(missing), offload=offload,
                            uplink_down=link_down(uplink),
                            now=time.time(), notes=tuple(notes))
        return evidence, judge(evidence)
    down_before = link_down(uplink)
    udp_before = read_udp_counters()
    log.info("capturing %g s of UDP port(s) %s on %s", span, ports, uplink)
    tally = await asyncio.to_thread(capture_fn or capture, uplink, ports, span)
    udp_after = read_udp_counters()
    after, _ = await read_devices(d.interface for d in devices)
    evidence = build_evidence(uplink=uplink, seconds=span, before=devices, after=after,
                              missing=missing, tally=tally, offload=offload,
                              udp_before=udp_before, udp_after=udp_after, now=time.time(),
                              notes=notes, uplink_down=down_before or link_down(uplink))
    return evidence, judge(evidence)


__all__ = ["CaptureUnavailable", "Code", "DiagnoseError", "Direction", "EnvironmentProblem",
           "Evidence", "MessageType", "PeerEvidence", "Tally", "UdpCounters", "Verdict",
           "classify", "diagnose", "judge", "judge_peer", "parse_snmp", "render", "to_json"]

