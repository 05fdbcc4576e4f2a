"""The pmtu check's pure parts: the search over sizes, the verdict, the suspicion, the
settings rules and the MQTT CONNECT that fills a segment."""

from __future__ import annotations

import pytest

from edgeheal.boundaries.kernel.nftables import Clamp, commands
from edgeheal.boundaries.kernel.segment_probe import connect_packet
from edgeheal.checks.pmtu import _alert, suspected, target
from edgeheal.checks.pmtu.search import MAX_PROBES, STEP, judge, next_size
from edgeheal.config import ConfigError, loads_generic
from edgeheal.model import CheckStatus, Snapshot, State
from tests.support import WALL0


def search(limit: int, full: int = 1420, floor: int = 1200,
           hint: int | None = None) -> list[tuple[int, bool]]:
    """Run the search against a path that passes sizes up to ``limit``."""
    results: list[tuple[int, bool]] = []
    while (size := next_size(full, floor, results, hint)) is not None:
        results.append((size, size <= limit))
    return results


@pytest.mark.parametrize(("limit", "hint", "probes", "passed"), [
    (1420, None, 1, 1420),     # health: one probe at the full size
    (1300, None, 7, 1296),     # a black hole: full, floor, then bisection to 8 bytes
    (1300, 1296, 3, 1296),     # the doubt's second run: full, the hint, the hint + 8
    (1340, 1296, 7, 1336),     # the limit rose since: the search goes on from the hint
    (1250, 1296, 6, 1248),     # the limit fell under the hint: floor, then bisection
    (1000, None, 2, None),     # below the floor: nothing passes, the search ends
    (1419, None, 8, 1416),     # one byte short of the full size
])
def test_the_search_finds_the_largest_size_within_its_bound(
        limit: int, hint: int | None, probes: int, passed: int | None) -> None:
    results = search(limit, hint=hint)
    assert len(results) == probes <= MAX_PROBES
    got = max((s for s, ok in results if ok), default=None)
    assert got == passed
    if passed is not None and passed < 1420:
        assert limit - got < STEP


def test_every_limit_between_floor_and_full_is_found_within_max_probes() -> None:
    for limit in range(1200, 1421):
        for hint in (None, 1264, limit):
            results = search(limit, hint=hint)
            assert len(results) <= MAX_PROBES, (limit, hint)
            got = max(s for s, ok in results if ok)
            assert 0 <= limit - got < STEP or got == 1420, (limit, hint, results)


@pytest.mark.parametrize(("results", "error", "clamp", "reason", "state"), [
    ([(1420, True)], "", None, "ok", State.OK),
    ([(1420, False), (1200, True), (1304, False)], "", None, "pmtu_blackhole", State.FAILED),
    ([(1420, False), (1200, True)], "", 1200, "clamped", State.DEGRADED),
    ([(1420, False), (1200, False)], "", None, "no_size_passed", State.UNKNOWN),
    ([], "Connection refused", None, "unreachable", State.UNKNOWN),
    ([(1420, False)], "No route to host", None, "unreachable", State.UNKNOWN),
])
def test_the_verdict_table(results: list[tuple[int, bool]], error: str, clamp: int | None,
                           reason: str, state: State) -> None:
    verdict = judge(1420, results, connect_error=error, clamp=clamp)
    assert (verdict.reason, verdict.state) == (reason, state)
    if reason == "pmtu_blackhole":
        assert verdict.detail["largest_passed"] == 1200
        assert verdict.detail["smallest_lost"] == 1304
        assert "1200 bytes pass" in verdict.message


def test_a_refused_clamp_is_still_a_failed_black_hole_and_says_why() -> None:
    verdict = judge(1420, [(1420, False), (1200, True)], clamp=None,
                    clamp_error="Operation not permitted")
    assert verdict.reason == "pmtu_blackhole"
    assert verdict.detail["clamp_error"] == "Operation not permitted"
    assert "Operation not permitted" in verdict.message


def test_alert_kinds_follow_the_reason() -> None:
    def status(reason: str, state: State) -> CheckStatus:
        return make_status("pmtu", state, reason)
    assert _alert(status("pmtu_blackhole", State.FAILED)) == ("pmtu.blackhole",
                                                              "pmtu.recovered")
    assert _alert(status("clamped", State.DEGRADED)) == ("pmtu.clamped", "pmtu.recovered")
    assert _alert(status("unreachable", State.UNKNOWN))[0] == "check.failed"


def make_status(name: str, state: State, reason: str,
                detail: dict[str, object] | None = None) -> CheckStatus:
    return CheckStatus(name=name, state=state, reason=reason, message="", since=WALL0,
                       since_mono=0.0, detail=detail or {}, required=False, runs=1)


BASE = """
[wireguard]
interfaces = ["flannel-wg"]
[[mqtt.targets]]
name = "broker-tunnel"
host = "10.43.0.20"
path = "tunnel"
[[mqtt.targets]]
name = "broker-direct"
host = "192.0.2.10"
"""


def test_the_target_defaults_to_the_first_tunnel_path_broker() -> None:
    assert target(loads_generic(BASE + "[pmtu]\n")) == ("10.43.0.20", 1883)
    assert target(loads_generic(BASE + '[pmtu]\ntarget = "10.43.0.21:8883"\n')) == (
        "10.43.0.21", 8883)


@pytest.mark.parametrize(("toml", "key"), [
    ('[pmtu]\n', "pmtu.target"),                           # no tunnel-path broker
    ('[pmtu]\ntarget = "nohost"\n', "pmtu.target"),
    ('[pmtu]\ntarget = "10.0.0.1:1"\ninterface = ""\n', "pmtu.interface"),
    ('[pmtu]\ntarget = "10.0.0.1:1"\nwait = "5s"\ntimeout = "20s"\n', "pmtu.timeout"),
    ('[pmtu]\ntarget = "10.0.0.1:1"\nfloor = 100\n', "pmtu.floor"),
])
def test_bad_settings_name_their_key(toml: str, key: str) -> None:
    from edgeheal import settings

    with pytest.raises(ConfigError) as err:
        settings.loads(toml)
    assert key in str(err.value)


def snap(wg_suspect: bool, tunnel: State) -> Snapshot:
    checks = {"wireguard": make_status("wireguard", State.OK, "ok", {"suspect": wg_suspect}),
              "broker-tunnel": make_status("broker-tunnel", tunnel, "x"),
              "broker-direct": make_status("broker-direct", State.OK, "ok")}
    return Snapshot(node="n", checks=checks, started_mono=0.0, taken_mono=0.0)


@pytest.mark.parametrize(("suspect", "tunnel", "expected"), [
    (True, State.OK, True),        # data unanswered while the small probe passes
    (True, State.FAILED, False),   # the tunnel is broken outright: not an MTU matter
    (False, State.OK, False),      # healthy
])
def test_the_suspicion_is_unanswered_data_while_the_small_probes_pass(
        suspect: bool, tunnel: State, expected: bool) -> None:
    assert suspected(snap(suspect, tunnel), loads_generic(BASE + "[pmtu]\n")) is expected


@pytest.mark.parametrize("length", [131, 500, 1380, 8000])
def test_the_probe_segment_is_one_mqtt_connect_of_exactly_its_length(length: int) -> None:
    packet = connect_packet(length, "edgeheal-n-pmtu")
    assert len(packet) == length
    assert packet[0] == 0x10
    remaining = (packet[1] & 0x7F) | (packet[2] << 7)
    assert remaining == length - 3
    assert packet[3:9] == b"\x00\x04MQTT"


def test_the_clamp_batch_replaces_its_own_table_and_exempts_the_probe() -> None:
    batch = commands(Clamp("flannel-wg", 1296, 0xE40000))["nftables"]
    tables = [c for c in batch if "table" in next(iter(c.values()), {})]
    assert [next(iter(c)) for c in tables] == ["add", "delete", "add"]
    text = repr(batch)
    assert "'value': 1256" in text
    assert "'value': 1236" in text
    assert text.count("edgeheal_mss") >= 3
    rules = [c["add"]["rule"]["expr"] for c in batch if "rule" in c.get("add", {})]
    assert [e for e in rules[0] if "return" in e] == [{"return": None}]  # the probe's exit
    assert 0xE40000 in [e.get("match", {}).get("right") for e in rules[0]]


def upload(seconds: int, tx_per_s: int, rx_per_s: int) -> list[tuple[float, int, int]]:
    return [(100.0 + t, 10_000 + t * tx_per_s, 5_000 + t * rx_per_s)
            for t in range(0, seconds + 1, 2)]


@pytest.mark.parametrize(("samples", "expected"), [
    (upload(20, 1800, 21), True),      # the lab's black hole: 36 kB out, 416 B back in 20 s
    (upload(20, 4400, 150), False),    # a healthy 4 kB/s upload: its ACKs are 3.3 %
    (upload(20, 300, 2), False),       # too little sent to judge (keepalives, a probe)
    (upload(6, 1800, 21), False),      # under half a window of readings
    ([], False),
    ([(100.0, 90_000, 9_000), (120.0, 1_000, 10)], False),  # re-created device
])
def test_lopsided_counters_are_bulk_data_out_and_almost_nothing_back(
        samples: list[tuple[float, int, int]], expected: bool) -> None:
    from edgeheal.checks.pmtu.search import lopsided

    now = samples[-1][0] if samples else 0.0
    assert lopsided(samples, now) is expected


def test_lopsided_counters_raise_the_suspicion_only_while_the_small_probes_pass() -> None:
    config = loads_generic(BASE + "[pmtu]\n")
    assert suspected(snap(False, State.OK), config, True) is True
    assert suspected(snap(False, State.FAILED), config, True) is False


def test_the_counters_are_the_watched_peers_together() -> None:
    from edgeheal.checks.pmtu import counters

    peers = [{"watched": True, "tx_bytes": 10, "rx_bytes": 1},
             {"watched": True, "tx_bytes": 5, "rx_bytes": 2},
             {"watched": False, "tx_bytes": 1000, "rx_bytes": 1000}]
    snapshot = Snapshot(node="n", checks={"wireguard": make_status(
        "wireguard", State.OK, "ok", {"peers": peers})}, started_mono=0.0, taken_mono=0.0)
    assert counters(snapshot, loads_generic(BASE + "[pmtu]\n")) == (15, 3)
