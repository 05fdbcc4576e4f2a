"""The verdict: pure functions of the evidence, table-driven (no capture, no clock)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

import pytest

from edgeheal.boundaries.wg.readings import DeviceStats, PeerStats
from edgeheal.tools.diagnose import (
    CaptureEvidence,
    Code,
    PeerEvidence,
    Tally,
    UdpCounters,
    bpf_program,
    build_evidence,
    choose_uplink,
    default_seconds,
    judge,
    judge_peer,
    render,
    to_json,
)

KEY = "LNIoDM5YyqVqlLhbJ0vBBtqqjMs4bwn7IIqV1b8l9CE="
OTHER_KEY = "8HY83dWFqDUp3sD3fqtiutKS1LFZZNbjxFBS4CqhqX4="
T0 = 1_796_000_000.0


def peer(sent: Mapping[str, int] | None = None, received: Mapping[str, int] | None = None,
         *, before: float | None = T0, after: float | None = T0, key: str | None = KEY,
         endpoint: str = "10.60.0.1:51820") -> PeerEvidence:
    return PeerEvidence(endpoint=endpoint, public_key=key, interface="flannel-wg",
                        sent=sent or {}, received=received or {}, handshake_before=before,
                        handshake_after=after)


CASES = [
    # (name, peer evidence, uplink TX checksum offload on?, expected finding)
    ("keepalives both ways", peer({"keepalive": 2}, {"keepalive": 2}), False, Code.HEALTHY),
    ("a rekey answered during the capture",
     peer({"initiation": 1, "transport": 5}, {"response": 1, "transport": 5},
          after=T0 + 120), True, Code.HEALTHY),
    ("we answered the peer's rekey and data followed",
     peer({"response": 1}, {"initiation": 1, "transport": 3}, after=T0 + 120), False,
     Code.HEALTHY),
    ("the incident: rekeys unanswered, old session still carries data, offload on",
     peer({"initiation": 3, "transport": 9}, {"transport": 4}), True,
     Code.CHECKSUM_OFFLOAD),
    ("the incident in the lab: our initiations and responses both lost, offload on",
     peer({"initiation": 1, "response": 1}, {"initiation": 1}, before=None, after=None),
     True, Code.CHECKSUM_OFFLOAD),
    ("same, offload off", peer({"initiation": 1, "response": 1}, {"initiation": 1},
                               before=None, after=None), False, Code.UNANSWERED),
    ("rekeys unanswered, offload off", peer({"initiation": 3}, {"transport": 4}), False,
     Code.UNANSWERED),
    ("rekeys unanswered, offload unknown", peer({"initiation": 3}, {"transport": 4}), None,
     Code.UNANSWERED),
    ("blackhole: data out, nothing back", peer({"transport": 1, "keepalive": 1}, {}), False,
     Code.PATH_DOWN),
    ("initiations unanswered, nothing back, offload on: the incident behind a NAT (the "
     "cloud cannot initiate towards us), and offload is the cheap thing to rule out first",
     peer({"initiation": 3}, {}), True, Code.CHECKSUM_OFFLOAD),
    ("data out, nothing back, offload on: no handshake evidence, the path is down",
     peer({"transport": 2, "keepalive": 1}, {}), True, Code.PATH_DOWN),
    ("responses arrive, the handshake never completes",
     peer({"initiation": 2}, {"response": 2}, before=None, after=None), False,
     Code.HANDSHAKE_REJECTED),
    ("responses arrive, the handshake age keeps growing, offload on too",
     peer({"initiation": 2, "transport": 3}, {"response": 2, "transport": 1}), True,
     Code.HANDSHAKE_REJECTED),
    ("the peer's initiations are never answered here",
     peer({}, {"initiation": 3}, before=None, after=None), False, Code.HANDSHAKE_REJECTED),
    ("an unknown endpoint answering our handshakes",
     peer({"initiation": 1}, {"response": 1}, key=None), False, Code.HEALTHY),
    ("only cookie replies come back", peer({"initiation": 2}, {"cookie_reply": 2}), False,
     Code.UNANSWERED),
    ("nothing either way", peer(), True, Code.QUIET),
]


@pytest.mark.parametrize(("name", "evidence", "offload_on", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_each_peer_pattern_gives_its_finding(name: str, evidence: PeerEvidence,
                                             offload_on: bool | None, expected: Code) -> None:
    finding = judge_peer(evidence, offload_on=offload_on)
    assert finding.code is expected, finding.why
    assert finding.why


def evidence(*peers: PeerEvidence, offload: Mapping[str, bool] | None = None,
             udp: tuple[int, int] = (0, 0), interfaces: tuple[str, ...] = ("flannel-wg",),
             ) -> CaptureEvidence:
    return CaptureEvidence(uplink="wwan0", seconds=10.0, ports=(51820,), interfaces=interfaces,
                    offload=offload if offload is not None else {"tx-checksum-ipv4": False},
                    udp_before=UdpCounters(0, 0), udp_after=UdpCounters(*udp),
                    peers=peers, packets=sum(sum(p.sent.values()) + sum(p.received.values())
                                              for p in peers), now=T0 + 30)


HEALTHY = peer({"keepalive": 2}, {"keepalive": 2})
INCIDENT = peer({"initiation": 3}, {"transport": 4}, endpoint="10.60.0.9:51820")
SILENT = peer(key=OTHER_KEY, endpoint="10.60.0.7:51820")


def test_no_tunnel_device_is_its_own_verdict() -> None:
    verdict = judge(evidence(interfaces=()))
    assert verdict.code is Code.NO_TUNNEL
    assert verdict.problem


def test_no_traffic_at_all_is_a_problem_not_health() -> None:
    verdict = judge(evidence(SILENT))
    assert verdict.code is Code.NO_TRAFFIC
    assert verdict.problem


def test_a_silent_neighbour_beside_a_healthy_peer_is_only_a_note() -> None:
    verdict = judge(evidence(HEALTHY, SILENT))
    assert verdict.code is Code.HEALTHY
    assert not verdict.problem
    assert any("10.60.0.7:51820" in n and "no traffic" in n for n in verdict.notes)


def test_the_worst_peer_decides_and_the_incident_says_what_to_run() -> None:
    verdict = judge(evidence(HEALTHY, INCIDENT, offload={"tx-checksum-ipv4": True}))
    assert verdict.code is Code.CHECKSUM_OFFLOAD
    assert "rekey packets are probably leaving with bad checksums" in verdict.summary
    assert "`edgeheal offload apply`" in verdict.summary
    assert [f.code for f in verdict.findings] == [Code.HEALTHY, Code.CHECKSUM_OFFLOAD]


def test_offload_on_is_noted_even_when_another_cause_wins() -> None:
    verdict = judge(evidence(peer({"keepalive": 1}, {}),
                             offload={"tx-checksum-ipv4": True, "tx-checksum-ipv6": False}))
    assert verdict.code is Code.PATH_DOWN
    assert "uplink or the cloud path is down" in verdict.summary
    assert any("tx-checksum-ipv4" in n and "offload apply" in n for n in verdict.notes)
    assert not any("tx-checksum-ipv6" in n for n in verdict.notes)


def test_growing_in_csum_errors_are_reported_as_evidence() -> None:
    verdict = judge(evidence(HEALTHY, udp=(4, 4)))
    assert any("4 UDP datagram(s) with a bad checksum" in n for n in verdict.notes)
    assert not any("bad checksum" in n for n in judge(evidence(HEALTHY)).notes)


def test_cookie_replies_are_noted() -> None:
    verdict = judge(evidence(peer({"keepalive": 1}, {"keepalive": 1, "cookie_reply": 1})))
    assert verdict.code is Code.HEALTHY
    assert any("cookie" in n for n in verdict.notes)


def test_the_json_document_carries_verdict_and_evidence() -> None:
    ev = evidence(HEALTHY, INCIDENT, offload={"tx-checksum-ipv4": True}, udp=(2, 3))
    doc = json.loads(json.dumps(to_json(ev, judge(ev))))
    assert doc["verdict"]["code"] == "checksum_offload"
    assert doc["verdict"]["problem"] is True
    assert doc["offload"] == {"on": True, "features": {"tx-checksum-ipv4": True}}
    assert doc["udp"]["delta"] == {"InCsumErrors": 2, "InErrors": 3}
    incident = next(p for p in doc["peers"] if p["endpoint"] == "10.60.0.9:51820")
    assert incident["sent"] == {"initiation": 3}
    assert incident["finding"] == "checksum_offload"
    assert incident["handshake_age_seconds"] == 30.0
    assert incident["handshake_completed_during_capture"] is False


def test_the_text_report_leads_with_the_verdict_in_plain_words() -> None:
    ev = evidence(INCIDENT, offload={"tx-checksum-ipv4": True})
    text = render(ev, judge(ev))
    assert text.splitlines()[2].startswith("VERDICT: handshakes are sent but never answered")
    assert "TX checksum offload ON" in text
    assert "initiation 3" in text


UPLINK_CASES = [
    (("wwan*",), ["lo", "eth0", "wwan0"], "eth0", "wwan0"),
    (("wwan*",), ["lo", "wwan0", "wwan1"], "wwan1", "wwan1"),
    (("wwan*",), ["lo", "wwan1", "wwan0"], None, "wwan0"),
    ((), ["lo", "eth0"], "eth0", "eth0"),
    (("wwan*",), ["lo", "eth0"], "eth0", "eth0"),
    (("wwan*",), ["lo", "eth0"], None, None),
]


@pytest.mark.parametrize(("patterns", "present", "routed", "expected"), UPLINK_CASES)
def test_the_uplink_is_an_offload_interface_else_the_routed_one(
        patterns: tuple[str, ...], present: list[str], routed: str | None,
        expected: str | None) -> None:
    assert choose_uplink(patterns, present, routed) == expected


def device(*peers: PeerStats, name: str = "flannel-wg") -> DeviceStats:
    return DeviceStats(interface=name, listen_port=51820, peers=peers)


def stats(key: str, endpoint: str | None, hs: float | None, keepalive: int = 25,
          rx: int = 0) -> PeerStats:
    return PeerStats(public_key=key, endpoint=endpoint, allowed_ips=(), last_handshake=hs,
                     rx_bytes=rx, tx_bytes=0, persistent_keepalive=keepalive)


@pytest.mark.parametrize(("keepalives", "expected"), [((25,), 30.0), ((), 10.0), ((0,), 10.0),
                                                      ((5, 20), 25.0), ((3600,), 600.0)])
def test_the_default_capture_outlasts_the_longest_keepalive(
        keepalives: tuple[int, ...], expected: float) -> None:
    dev = device(*(stats(f"k{i}", None, None, keepalive=k) for i, k in enumerate(keepalives)))
    assert default_seconds([dev]) == expected


def test_capture_and_device_peers_are_joined_by_endpoint() -> None:
    before = [device(stats(KEY, "[fd00::0:1]:51820", T0, rx=100),
                     stats(OTHER_KEY, "10.60.0.7:51820", None))]
    after = [device(stats(KEY, "[fd00::0:1]:51820", T0 + 120, rx=400),
                    stats(OTHER_KEY, "10.60.0.7:51820", None))]
    tally = Tally()
    local, ports = frozenset({"fd00::2"}), frozenset({51820})
    tally.add("fd00::2", 51820, "fd00::1", 51820, bytes([1, 0, 0, 0]) + bytes(144),
              local=local, ports=ports)
    tally.add("192.0.2.1", 51820, "fd00::2", 51820, bytes([4, 0, 0, 0]) + bytes(28),
              local=local, ports=ports)
    ev = build_evidence(uplink="wwan0", seconds=10, before=before, after=after, missing=(),
                        tally=tally, offload=None, udp_before=None, udp_after=None, now=T0)
    by_endpoint = {p.endpoint: p for p in ev.peers}
    assert set(by_endpoint) == {"[fd00::1]:51820", "192.0.2.1:51820", "10.60.0.7:51820"}
    ours = by_endpoint["[fd00::1]:51820"]
    assert (ours.public_key, ours.sent, ours.advanced, ours.rx_bytes_delta) == (
        KEY, {"initiation": 1}, True, 300)
    assert by_endpoint["192.0.2.1:51820"].public_key is None
    assert by_endpoint["10.60.0.7:51820"].sent == {}
    assert ev.ports == (51820,)
    assert ev.offload_on is None


@pytest.mark.parametrize("ports", [[51820], [51820, 51821], list(range(40000, 40032))])
def test_the_bpf_program_is_well_formed(ports: list[int]) -> None:
    program = bpf_program(ports)
    assert program[-2:] == [(0x06, 0, 0, 262144), (0x06, 0, 0, 0)]
    for index, (code, jt, jf, _k) in enumerate(program):
        if code & 0x07 == 0x05:  # jumps stay inside the program
            assert index + 1 + max(jt, jf) < len(program)
    for port in ports:
        assert sum(1 for c, _, _, k in program if c == 0x15 and k == port) == 4


@pytest.mark.parametrize("ports", [[], list(range(1, 34))])
def test_the_bpf_program_refuses_no_or_too_many_ports(ports: list[int]) -> None:
    with pytest.raises(ValueError, match="ports"):
        bpf_program(ports)


@pytest.mark.parametrize(("peers", "expected"), [((), Code.PATH_DOWN),
                                                 ((HEALTHY,), Code.HEALTHY),
                                                 ((INCIDENT,), Code.UNANSWERED)])
def test_an_uplink_that_is_down_explains_silence(peers: tuple[PeerEvidence, ...],
                                                 expected: Code) -> None:
    ev = dataclasses.replace(evidence(*peers), uplink_down="no carrier")
    verdict = judge(ev)
    assert verdict.code is expected
    assert verdict.notes[0] == "the uplink wwan0 is no carrier"
