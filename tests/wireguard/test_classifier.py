"""The pure peer classifier: thresholds, history bookkeeping, reasons — injected clock only.

Each scenario is a list of steps; a step advances the clock and/or the device's counters
and states the reason expected after it. Times are seconds since the peer first appeared.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from edgeheal.config import WireguardSettings
from edgeheal.model import State
from edgeheal.wg import PeerStats
from edgeheal.wg.health import (
    REASONS,
    Thresholds,
    classify,
    new_handshake,
    observe,
    thresholds,
)
from tests.support import Clock

KEY = "NHaGGWcW3a1sapt+JD/2harVDhDxKOnxBE9CNO0J/D8="
AUTO = WireguardSettings()


def wall(clock: Clock) -> float:
    """What a device reports a handshake in: epoch seconds of the clock's wall time."""
    return clock.wall().timestamp()


def test_auto_thresholds_come_from_the_protocol_and_the_keepalive() -> None:
    t25 = thresholds(AUTO, 25)
    assert t25 == Thresholds(rekey_failing_after=160.0, dead_after=205.0,
                             rx_stall_after=67.5, connect_grace=30.0)
    t20 = thresholds(AUTO, 20)  # the incident's fix
    assert (t20.rekey_failing_after, t20.dead_after, t20.rx_stall_after) == (155, 200, 55)
    # a healthy keepalive-only tunnel peaks near 120 s + K: never flagged
    assert t25.rekey_failing_after > 120 + 25
    # rekey failures are flagged before the session dies at 180 s
    assert t25.rekey_failing_after < 180 < t25.dead_after
    # without keepalive a silent peer proves nothing: no stall rule
    assert thresholds(AUTO, 0).rx_stall_after is None


def test_explicit_thresholds_override_auto() -> None:
    s = replace(AUTO, rekey_failing_after=100.0, dead_after=150.0, rx_stall_after=30.0,
                connect_grace=5.0)
    assert thresholds(s, 25) == Thresholds(100.0, 150.0, 30.0, 5.0)


def test_every_reason_maps_to_exactly_one_state() -> None:
    assert REASONS["ok"] is State.OK
    assert REASONS["rekey_failing"] is State.DEGRADED
    assert {REASONS[r] for r in ("stalled", "dead", "never_connected", "interface_missing",
                                 "no_peers")} == {State.FAILED}
    assert {REASONS[r] for r in ("connecting", "permission_denied", "read_error")} == {
        State.UNKNOWN}


@dataclass
class Step:
    after: float
    """Seconds to advance both clocks before this reading."""
    expect: str
    handshake: str = "keep"
    """"keep", "new" (a handshake just now), "never"."""
    rx: int = 0
    """Bytes received since the previous step."""
    tx: int = 0
    wall_step: float = 0.0
    """An NTP step applied to the wall clock before the reading."""


def run_steps(steps: list[Step], *, keepalive: int = 25, settings: WireguardSettings = AUTO,
              first_handshake_age: float | None = 0.0) -> list[str]:
    clock = Clock()
    hs = None if first_handshake_age is None else wall(clock) - first_handshake_age
    rx = tx = 1000
    hist = None
    seen = []
    for step in steps:
        clock.advance(step.after)
        clock.step_wall(step.wall_step)
        if step.handshake == "new":
            hs = wall(clock)
        elif step.handshake == "never":
            hs = None
        rx += step.rx
        tx += step.tx
        peer = PeerStats(public_key=KEY, endpoint="10.0.0.2:51820", allowed_ips=(),
                         last_handshake=hs, rx_bytes=rx, tx_bytes=tx,
                         persistent_keepalive=keepalive)
        hist = observe(hist, peer, now=clock.now, wall=wall(clock))
        seen.append(classify(hist, clock.now, thresholds(settings, keepalive))[0])
    return seen


def healthy(n: int, every: float = 5.0) -> list[Step]:
    """Keepalives both ways every 25 s, seen by a check running every 5 s."""
    return [Step(every, "ok", rx=32 if i % 5 == 4 else 0, tx=32 if i % 5 == 4 else 0)
            for i in range(n)]


SCENARIOS: dict[str, tuple[list[Step], dict[str, object]]] = {
    # 1. a healthy tunnel: the handshake age peaks at 120 s + 25 s, then a rekey: never flagged
    "healthy keepalive-only tunnel through two rekeys": (
        [*healthy(29), Step(5, "ok", handshake="new", rx=92 + 32, tx=148 + 32),
         *healthy(29), Step(5, "ok", handshake="new", rx=124, tx=180)], {}),
    # 2. the incident: from 120 s the rekey initiations (148 B) go unanswered; keepalives
    #    still arrive until the session dies at 180 s
    "rekey attempts unanswered, then the session dies": (
        [Step(120, "ok", rx=32 * 4, tx=32 * 4),
         Step(20, "ok", rx=32, tx=148 * 4),
         Step(15, "ok", rx=32, tx=148 * 3),
         Step(10, "rekey_failing", rx=32, tx=148 * 2),    # age 165 > 160
         Step(10, "rekey_failing", rx=32, tx=148 * 2),    # age 175: the session still works
         Step(35, "dead", rx=0, tx=148 * 7)], {}),        # age 210 > 205
    # 2b. the incident seen from the session's responder: the initiator's rekey retries
    #     (every 5 s) re-arm its keepalive timer, so from 123 s nothing valid arrives; the
    #     session still works, so this is rekey_failing until it expires at 180 s
    "incident from the responder's side": (
        [Step(120, "ok", rx=32 * 4, tx=32 * 4), Step(3, "ok", rx=32, tx=32),
         Step(36, "ok", tx=32), Step(2, "rekey_failing", tx=32),
         Step(18, "rekey_failing", tx=32),                # age 179, silent 56 s
         Step(12, "stalled", tx=32)], {}),                # age 191, silent 68 s > 67.5
    # 2c. the same with a short keepalive: silent far longer than 2.5 x K before 180 s
    "incident from the responder's side, K = 5": (
        [Step(120, "ok", rx=32, tx=32), Step(3, "ok", rx=32, tx=32),
         Step(14, "ok", tx=32), Step(5, "rekey_failing", tx=32),   # age 142 > 140
         Step(37, "rekey_failing", tx=32),                         # age 179
         Step(2, "stalled", tx=32)], {"keepalive": 5}),            # age 181: expired
    # 3. a blackhole: tx keeps growing (keepalives), nothing comes back
    "blackhole: rx flat while tx grows": (
        [Step(5, "ok", rx=32, tx=32), Step(25, "ok", tx=32), Step(25, "ok", tx=32),
         Step(20, "stalled", tx=32)], {}),                # 70 s silent > 67.5 s
    # 4. rx flat and tx flat too (our own sends fail): no stall evidence, the age decides
    "rx and tx both flat is not a stall": (
        [Step(5, "ok", rx=32, tx=32), Step(100, "ok"), Step(60, "rekey_failing"),
         Step(45, "dead")], {}),
    # 5. a never-handshaked peer: unknown within the grace, failed after it
    "never connected": (
        [Step(0, "connecting"), Step(29, "connecting", tx=148 * 5),
         Step(2, "never_connected", tx=148)], {"first_handshake_age": None}),
    # 6. a peer that connects within the grace is fine
    "connects within the grace": (
        [Step(0, "connecting"), Step(10, "ok", handshake="new", rx=92, tx=148)],
        {"first_handshake_age": None}),
    # 7. NTP steps the wall clock forward an hour: the stored handshake did not change, so
    #    its age is still measured on the monotonic clock
    "wall clock jumps forward": (
        [Step(5, "ok", rx=32, tx=32), Step(5, "ok", wall_step=3600, rx=32, tx=32),
         Step(5, "ok", rx=32, tx=32)], {}),
    # 8. the wall clock steps back an hour, then a rekey reports an *earlier* timestamp:
    #    still a new handshake, placed within the last interval
    "wall clock steps back, then a rekey": (
        [Step(100, "ok", rx=32, tx=32), Step(5, "ok", wall_step=-3600, rx=32, tx=32),
         Step(20, "ok", handshake="new", rx=124, tx=180),
         Step(100, "ok", rx=32, tx=32)], {}),
    # 9. a wall step cannot hide a dead tunnel either: the age keeps growing in monotonic
    #    time even though "now - last_handshake" in wall time shrank to ~0
    "wall clock step back cannot hide a dead tunnel": (
        [Step(5, "ok", rx=32, tx=32), Step(100, "stalled", tx=32),
         Step(105, "dead", wall_step=-200, tx=32)], {}),
    # 10. without keepalive an idle peer's old handshake is fine...
    "idle peer without keepalive": (
        [Step(5, "ok"), Step(500, "ok")], {"keepalive": 0}),
    # 11. ...but not once we are sending to it and it stays silent
    "peer without keepalive, sending into the void": (
        [Step(5, "ok"), Step(500, "dead", tx=148 * 10)], {"keepalive": 0}),
    # 12. the device was re-created (Flannel rebuild): handshake back to never, counters 0
    "device re-created: a fresh grace": (
        [Step(5, "ok", rx=32, tx=32), Step(300, "connecting", handshake="never",
                                           rx=-1000, tx=-1000),
         Step(10, "ok", handshake="new", rx=92, tx=148)], {}),
    # 13. the peer was already dead when the agent started: the first reading is placed
    #     by the wall clock once
    "already dead at start": ([Step(0, "dead")], {"first_handshake_age": 600.0}),
    # 14. explicit thresholds
    "explicit rx_stall_after": (
        [Step(5, "ok", rx=32, tx=32), Step(9, "ok", tx=32), Step(2, "stalled", tx=32)],
        {"settings": replace(AUTO, rx_stall_after=10.0)}),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name: str) -> None:
    steps, kw = SCENARIOS[name]
    assert run_steps(steps, **kw) == [s.expect for s in steps]  # type: ignore[arg-type]


def test_a_handshake_seen_late_is_placed_no_earlier_than_the_previous_reading() -> None:
    clock = Clock()
    peer = PeerStats(KEY, None, (), wall(clock), 0, 0, 25)
    hist = observe(None, peer, now=clock.now, wall=wall(clock))
    clock.advance(5)
    # the device claims a handshake 1000 s in the (wall) past: a clock step; clamp it
    hist = observe(hist, replace(peer, last_handshake=wall(clock) - 1000), now=clock.now,
                   wall=wall(clock))
    assert hist.handshake_age(clock.now) == pytest.approx(5.0)
    clock.advance(5)
    # and one in the future is "now"
    hist = observe(hist, replace(peer, last_handshake=wall(clock) + 500), now=clock.now,
                   wall=wall(clock))
    assert hist.handshake_age(clock.now) == 0.0


@pytest.mark.parametrize(("before", "after", "new"), [
    (None, None, False),            # never, still never
    (None, 100.0, True),            # the first handshake
    (100.0, 100.0, False),          # the same one, read again
    (100.0, 220.0, True),           # a rekey
    (100.0, 40.0, True),            # a rekey after the wall clock was stepped back
    (100.0, None, False),           # the device was re-created: no handshake is not one
])
def test_a_new_handshake_is_a_change_of_the_reported_time_in_either_direction(
        before: float | None, after: float | None, new: bool) -> None:
    assert new_handshake(before, after) is new
