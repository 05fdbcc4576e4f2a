"""The verdict: a pure judgement of the :class:`~edgeheal.tools.diagnose.evidence.CaptureEvidence`,
and its rendering as text for an operator or JSON for a tool.

:func:`judge` gives one finding per peer and an overall verdict (the worst, in the order
of :class:`Code`), in plain words, with what to do. Kept apart from the gathering so every
rule is a table-driven test without a capture or a clock (``tests/diagnose/test_verdict.py``).
Verdicts (``Code``)::

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
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgeheal.tools.diagnose.evidence import CaptureEvidence, PeerEvidence, UdpCounters
from edgeheal.tools.diagnose.wire import MessageType


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
class PeerFinding:
    peer: PeerEvidence
    code: Code
    why: str
    """The evidence in one sentence."""


@dataclass(frozen=True, slots=True)
class Verdict:
    code: Code
    summary: str
    advice: str
    findings: tuple[PeerFinding, ...]
    notes: tuple[str, ...]

    @property
    def problem(self) -> bool:
        return self.code is not Code.HEALTHY


def _total(counts: Mapping[str, int], *types: MessageType) -> int:
    wanted = {t.value for t in types} if types else None
    return sum(n for k, n in counts.items() if wanted is None or k in wanted)


def judge_peer(peer: PeerEvidence, *, offload_on: bool | None) -> PeerFinding:
    """One peer's evidence -> its finding (pure; the rules of the module docstring)."""
    sent, received = peer.sent, peer.received
    init_out = _total(sent, MessageType.INITIATION)
    resp_out = _total(sent, MessageType.RESPONSE)
    resp_in = _total(received, MessageType.RESPONSE)
    init_in = _total(received, MessageType.INITIATION)
    data_in = _total(received, MessageType.TRANSPORT, MessageType.KEEPALIVE)
    if not sent and not received:
        return PeerFinding(peer, Code.QUIET, "nothing sent or received")
    if not _total(received) and init_out and offload_on:
        # Behind a carrier NAT the cloud often cannot reach us first, so the incident can
        # look like this too; TX offload on is a known cause and cheap to rule out.
        return PeerFinding(peer, Code.CHECKSUM_OFFLOAD,
                       f"{init_out} initiation(s) sent, nothing received at all, while TX "
                       "checksum offload is on (if the fix does not help, the uplink or the "
                       "cloud path is down)")
    if not _total(received):
        return PeerFinding(peer, Code.PATH_DOWN,
                       f"sent {_total(sent)} packet(s) ({_list(sent)}), received none")
    advanced = peer.advanced
    if resp_in and advanced is False:
        return PeerFinding(peer, Code.HANDSHAKE_REJECTED,
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
            return PeerFinding(peer, Code.CHECKSUM_OFFLOAD, why + "; TX checksum offload is on")
        return PeerFinding(peer, Code.UNANSWERED, why)
    if init_in and not resp_out and not data_in and advanced is not True:
        return PeerFinding(peer, Code.HANDSHAKE_REJECTED,
                       f"received {init_in} initiation(s) from the peer and answered none: "
                       "this device does not accept its key")
    if data_in or advanced or (resp_in and advanced is None):
        return PeerFinding(peer, Code.HEALTHY,
                       f"received {data_in} transport/keepalive message(s)"
                       + ("; a handshake completed" if advanced else "")
                       + (f", {resp_in} handshake response(s)" if resp_in else ""))
    return PeerFinding(peer, Code.UNANSWERED,
                   f"received only {_list(received)}; no data or keepalive arrived")


def _list(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counts.items()) or "nothing"


def judge(evidence: CaptureEvidence) -> Verdict:
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


def to_json(evidence: CaptureEvidence, verdict: Verdict) -> dict[str, Any]:
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


def render(evidence: CaptureEvidence, verdict: Verdict) -> str:
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


__all__ = ["ADVICE", "SUMMARY", "Code", "PeerFinding", "Verdict", "judge", "judge_peer", "render",
           "to_json"]
