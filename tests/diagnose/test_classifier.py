"""The WireGuard message classifier, on real recorded packets (see record_fixtures.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeheal.tools.diagnose import (
    Direction,
    MessageType,
    Tally,
    UdpCounters,
    classify,
    direction,
    parse_snmp,
)

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = json.loads((FIXTURES / "wireguard_messages.json").read_text())["messages"]


def recorded(kind: str) -> bytes:
    return bytes.fromhex(RECORDED[kind]["hex"])


@pytest.mark.parametrize("kind", [m.value for m in MessageType if m is not MessageType.OTHER])
def test_every_recorded_wireguard_message_is_classified_as_its_type(kind: str) -> None:
    assert classify(recorded(kind)) is MessageType(kind)


def test_the_recording_holds_one_message_of_every_type_with_the_protocol_sizes() -> None:
    sizes = {k: v["length"] for k, v in RECORDED.items()}
    assert sizes["initiation"] == 148
    assert sizes["response"] == 92
    assert sizes["cookie_reply"] == 64
    assert sizes["keepalive"] == 32
    assert sizes["transport"] > 32


@pytest.mark.parametrize(("payload", "why"), [
    (b"", "empty"),
    (b"\x01", "shorter than a header"),
    (recorded("initiation")[:-1], "initiation one byte short"),
    (recorded("initiation") + b"\0", "initiation one byte long"),
    (recorded("response")[:64], "a response cut to a cookie reply's size"),
    (b"\x01\x01" + recorded("initiation")[2:], "reserved byte set"),
    (b"\x05" + recorded("cookie_reply")[1:], "unknown type 5"),
    (b"\x00" + recorded("keepalive")[1:], "type 0"),
    (recorded("keepalive") + b"\0" * 8, "transport not padded to 16 bytes"),
    (recorded("keepalive")[:31], "transport shorter than header + tag"),
    (b"GET / HTTP/1.1\r\n\r\n", "some other protocol on the port"),
])
def test_anything_else_on_the_port_is_other(payload: bytes, why: str) -> None:
    assert classify(payload) is MessageType.OTHER, why


def test_transport_with_data_is_not_a_keepalive() -> None:
    assert classify(recorded("keepalive") + bytes(16)) is MessageType.TRANSPORT


LOCAL = frozenset({"10.60.0.2", "fd00::2"})
PORTS = frozenset({51820})


@pytest.mark.parametrize(("src", "sport", "dst", "dport", "expected"), [
    ("10.60.0.2", 51820, "10.60.0.1", 51820, Direction.SENT),       # Flannel: same ports
    ("10.60.0.1", 51820, "10.60.0.2", 51820, Direction.RECEIVED),
    ("fd00::2", 51820, "fd00::1", 51820, Direction.SENT),
    ("10.0.0.9", 51820, "192.0.2.7", 4500, Direction.SENT),         # address unknown: ports
    ("192.0.2.7", 4500, "10.0.0.9", 51820, Direction.RECEIVED),
])
def test_direction_comes_from_our_addresses_then_our_ports(
        src: str, sport: int, dst: str, dport: int, expected: Direction) -> None:
    assert direction(src, sport, dst, dport, local=LOCAL, ports=PORTS) is expected


def test_the_tally_counts_per_peer_endpoint_and_direction() -> None:
    tally = Tally()
    for _ in range(3):
        tally.add("10.60.0.2", 51820, "10.60.0.1", 51820, recorded("initiation"),
                  local=LOCAL, ports=PORTS)
    tally.add("10.60.0.1", 51820, "10.60.0.2", 51820, recorded("initiation"),
              local=LOCAL, ports=PORTS)
    tally.add("fd00::1", 51821, "fd00::2", 51820, recorded("keepalive"), local=LOCAL,
              ports=PORTS)
    assert tally.packets == 5
    assert tally.endpoints() == ["10.60.0.1:51820", "[fd00::1]:51821"]
    assert tally.of("10.60.0.1:51820", Direction.SENT) == {"initiation": 3}
    assert tally.of("10.60.0.1:51820", Direction.RECEIVED) == {"initiation": 1}
    assert tally.of("[fd00::1]:51821", Direction.RECEIVED) == {"keepalive": 1}
    assert tally.of("[fd00::1]:51821", Direction.SENT) == {}


_UDP_FIELDS = ("InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors "
               "InCsumErrors IgnoredMulti MemErrors")
SNMP = (
    "Ip: Forwarding DefaultTTL InReceives InHdrErrors\n"
    "Ip: 1 64 100 0\n"
    f"Udp: {_UDP_FIELDS}\n"
    "Udp: 2219 4 7 2301 0 0 5 0 0\n"
    f"UdpLite: {_UDP_FIELDS}\n"
    "UdpLite: 0 0 0 0 0 0 9 0 0\n")


def test_udp_counters_come_from_the_udp_lines_not_udplite() -> None:
    assert parse_snmp(SNMP) == UdpCounters(in_csum_errors=5, in_errors=7)


def test_the_real_proc_net_snmp_parses() -> None:
    counters = parse_snmp(Path("/proc/net/snmp").read_text())
    assert counters.in_csum_errors >= 0
    assert counters.in_errors >= 0


@pytest.mark.parametrize("text", ["", "Ip: 1 2\nIp: 3 4\n",
                                  "Udp: InDatagrams\nUdp: 1\n", "Udp: InErrors InCsumErrors\n"])
def test_a_snmp_file_without_the_udp_counters_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="Udp"):
        parse_snmp(text)
