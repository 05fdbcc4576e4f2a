"""The pure peer classifier: thresholds, history bookkeeping, reasons — injected clock only.

Each scenario is a list of steps; a step advances the clock and/or the device's counters
and states the reason expected after it. Times are seconds since the peer first appeared.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from edgeheal.boundaries.wg import PeerStats
from edgeheal.boundaries.wg.health import (
    REASONS,
    Thresholds,
    classify,
    new_handshake,
    non_data_allowance,
    observe,
    quiet_after_data,
    suspicion,
    thresholds,
)
from edgeheal.config import WireguardSettings
from edgeheal.model import State
from tests.support import Clock

KEY = "NHaGGWcW3a1sapt+JD/2harVDhDxKOnxBE9CNO0J/D8="
AUTO = WireguardSettings()


def wall(clock: Clock) -> float:
    """What a device reports a handshake in: epoch seconds of the clock's wall time."""
    return clock.wall().timestamp()


def test_auto_thresholds_come_from_the_protocol_and_the_keepalive() -> None:
    t25 = thresholds(AUTO, 25)
    assert t25 == Thresholds(rekey_failing_after=160.0, dead_after=205.0,
                             rx_stall_after=67.5, connect_grace=30.0, send_fail_after=30.0,
                             suspect_after=40.0, send_fail_idle_after=40.0)
    t20 = thresholds(AUTO, 20)  # the incident's fix
    assert (t20.rekey_failing_after, t20.dead_after, t20.rx_stall_after) == (155, 200, 55)
    # a healthy keepalive-only tunnel peaks near 120 s + K: never flagged
    assert t25.rekey_failing_after > 120 + 25
    # rekey failures are flagged before the session dies at 180 s
    assert t25.rekey_failing_after < 180 < t25.dead_after
    # without keepalive a silent peer proves nothing: no stall rule
    assert thresholds(AUTO, 0).rx_stall_after is None
    # a keepalive is due every K: K + 5 s without a send is a send failure, well before the
    # 135 s / 180 s handshake-age rules; without keepalive a flat tx proves nothing
    assert t25.send_fail_after is not None
    assert t25.send_fail_after < t25.rx_stall_after
    assert thresholds(AUTO, 0).send_fail_after is None
    assert thresholds(AUTO, 0).suspect_after is None


def test_explicit_thresholds_override_auto() -> None:
    s = replace(AUTO, rekey_failing_after=100.0, dead_after=150.0, rx_stall_after=30.0,
                connect_grace=5.0, send_fail_after=40.0)
    assert thresholds(s, 25) == Thresholds(100.0, 150.0, 30.0, 5.0, 40.0, 40.0, 40.0)


def test_every_reason_maps_to_exactly_one_state() -> None:
    assert REASONS["ok"] is State.OK
    assert REASONS["rekey_failing"] is State.DEGRADED
    assert {REASONS[r] for r in ("stalled", "send_failing", "dead", "never_connected",
                                 "interface_missing", "no_peers")} == {State.FAILED}
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
    # 1. a healthy tunnel: the session's initiator rekeys on its first send after 120 s
    #    (the keepalive that comes at most K later), answered at once: never flagged
    "healthy keepalive-only tunnel through two rekeys": (
        [*healthy(24), Step(5, "ok", handshake="new", rx=92 + 32, tx=148 + 32),
         *healthy(24), Step(5, "ok", handshake="new", rx=124, tx=180)], {}),
    # 1b. under loss a rekey may need a second and a third attempt (5 s apart): the
    #     warning waits for the third to go unanswered (12 s after the rekey began)
    "a rekey answered at the third attempt is not flagged": (
        [*healthy(24), Step(5, "ok", rx=32, tx=180),         # 125: rekey began, lost
         Step(5, "ok", tx=148), Step(4, "ok", tx=148),        # 134: second lost too
         Step(2, "ok", handshake="new", rx=92 + 32, tx=32),  # 136: third answered
         *healthy(20)], {}),
    # 1c. a quiet stretch after the rekey was due but before the first send: not the rekey
    "growth seen only after the rekey was due starts the rekey clock": (
        [Step(118, "ok", rx=32, tx=32), Step(4, "ok", rx=32, tx=32),  # 122: grew <= 120
         Step(10, "ok"), Step(10, "ok"),                             # 142: nothing yet
         Step(3, "ok", handshake="new", rx=124, tx=180)], {}),     # 145: the keepalive
    # 2. the incident: from 125 s the rekey initiations (148 B) go unanswered; keepalives
    #    still arrive until the session dies at 180 s. Warned 12 s after the rekey began.
    "rekey attempts unanswered, then the session dies": (
        [Step(120, "ok", rx=32 * 4, tx=32 * 4),
         Step(5, "ok", rx=32, tx=32 + 148),               # 125: the first initiation
         Step(5, "ok", tx=148), Step(5, "ok", tx=148),    # 135: 10 s, 3rd attempt due
         Step(5, "rekey_failing", rx=32, tx=148),         # 140: 15 s > 12 s
         Step(35, "rekey_failing", rx=32, tx=148 * 7),    # 175: the session still works
         Step(35, "dead", rx=0, tx=148 * 7)], {}),        # age 210 > 205
    # 2b. the incident seen from the session's responder: the initiator's rekey retries
    #     (every 5 s) re-arm its keepalive timer, so from 123 s nothing valid arrives; the
    #     session still works, so this is rekey_failing until it expires at 180 s
    "incident from the responder's side": (
        [Step(120, "ok", rx=32 * 4, tx=32 * 4), Step(3, "ok", rx=32, tx=32),
         Step(10, "ok", tx=32), Step(26, "rekey_failing", tx=32),
         Step(2, "rekey_failing", tx=32),
         Step(18, "rekey_failing", tx=32),                # age 179, silent 56 s
         Step(12, "stalled", tx=32)], {}),                # age 191, silent 68 s > 67.5
    # 2c. the same with a short keepalive: silent far longer than 2.5 x K before 180 s
    "incident from the responder's side, K = 5": (
        [Step(120, "ok", rx=32, tx=32), Step(3, "ok", rx=32, tx=32),
         Step(5, "ok", tx=32), Step(9, "rekey_failing", tx=32),    # 14 s after 123
         Step(5, "rekey_failing", tx=32),
         Step(37, "rekey_failing", tx=32),                         # age 179
         Step(2, "stalled", tx=32)], {"keepalive": 5}),            # age 181: expired
    # 3. a blackhole: tx keeps growing (keepalives), nothing comes back
    "blackhole: rx flat while tx grows": (
        [Step(5, "ok", rx=32, tx=32), Step(25, "ok", tx=32), Step(25, "ok", tx=32),
         Step(20, "stalled", tx=32)], {}),                # 70 s silent > 67.5 s
    # 4. rx flat and tx flat too: a keepalive was due and did not leave (address, route or
    #    link gone): send_failing at K + 5 s, and it stays the reason past the age rules
    "rx and tx both flat is a send failure, not a stall": (
        [Step(5, "ok", rx=32, tx=32), Step(29, "ok"), Step(2, "send_failing"),
         Step(200, "send_failing")], {}),
    # 4b. the peer's keepalives still arrive but nothing leaves (a local output drop): on
    #     an idle tunnel one end may stay quiet for a round (the peer's keepalive re-arms
    #     its timer first), so only K + 15 s of it is a send failure
    "tx flat while rx grows is a send failure": (
        [Step(5, "ok", rx=32, tx=32), Step(25, "ok", rx=32), Step(6, "ok", rx=32),
         Step(8, "ok", rx=32), Step(2, "send_failing", rx=32),
         Step(25, "send_failing", rx=32)], {}),
    # 4b'. a healthy idle tunnel whose peer won the keepalive race for a round: tx flat
    #      for 35 s (seen at K = 25 on a loaded box) while the peer's keepalives arrive
    "one quiet round is not a send failure": (
        [Step(5, "ok", rx=32, tx=32), Step(25, "ok", rx=32), Step(5, "ok"),
         Step(5, "ok", tx=32)], {}),
    # 4b''. the peer's data arrived and our passive keepalive (due within 10 s) never left
    "the peer's data unanswered by us is a send failure": (
        [Step(5, "ok", rx=32, tx=32), Step(20, "ok", rx=32), Step(2, "ok", rx=1500),
         Step(3, "ok"), Step(2, "ok"), Step(7, "send_failing")], {}),
    # 4c. a send failure is over as soon as tx grows again
    "a send failure clears when tx grows": (
        [Step(5, "ok", rx=32, tx=32), Step(31, "send_failing"),
         Step(5, "ok", rx=32, tx=32)], {}),
    # 4d. explicit send_fail_after
    "explicit send_fail_after": (
        [Step(5, "ok", rx=32, tx=32), Step(9, "ok", rx=32), Step(2, "send_failing", rx=32)],
        {"settings": replace(AUTO, send_fail_after=10.0)}),
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


# --- suspicion: the free local signals that ask for a confirmation ---------------------

def suspicions(steps: list[Step], *, keepalive: int = 25,
               first_handshake_age: float | None = 0.0) -> list[str | None]:
    """Like run_steps, but the suspicion code after each step (None: not suspect)."""
    clock = Clock()
    hs = None if first_handshake_age is None else wall(clock) - first_handshake_age
    rx = tx = 1000
    hist = None
    seen: list[str | None] = []
    for step in steps:
        clock.advance(step.after)
        if step.handshake == "new":
            hs = wall(clock)
        rx, tx = rx + step.rx, tx + step.tx
        peer = PeerStats(public_key=KEY, endpoint="10.0.0.2:51820", allowed_ips=(),
                         last_handshake=hs, rx_bytes=rx, tx_bytes=tx,
                         persistent_keepalive=keepalive)
        hist = observe(hist, peer, now=clock.now, wall=wall(clock))
        found = suspicion(hist, clock.now, thresholds(AUTO, keepalive))
        seen.append(None if found is None else found[0])
    return seen


def busy(n: int) -> list[Step]:
    """A collector's traffic both ways, read every 2 s."""
    return [Step(2, "ok", rx=200, tx=300) for _ in range(n)]


SUSPICIONS: dict[str, tuple[list[Step], list[str | None], dict[str, object]]] = {
    # a healthy keepalive tunnel through a rekey: never suspect (nothing extra happens)
    "healthy": ([*healthy(24), Step(5, "ok", handshake="new", rx=124, tx=180),
                 *healthy(10)], [None] * 35, {}),
    # an idle blackhole: rx silent for K + 15 s, long before the 67.5 s stall verdict
    "rx silent": ([Step(5, "ok", rx=32, tx=32), Step(27, "ok", tx=32), Step(12, "ok", tx=32),
                   Step(1, "ok", tx=32), Step(30, "ok", tx=32)],
                  [None, None, None, "rx_silent", "rx_silent"], {}),
    # our sends fail while the peer's keepalives arrive: tx flat for K + 15 s
    "tx flat": ([Step(5, "ok", rx=32, tx=32), Step(27, "ok", rx=32), Step(12, "ok", rx=32),
                 Step(1, "ok", rx=32)], [None, None, None, "tx_flat"], {}),
    # a busy tunnel blackholed: our data (a collector's publishes, read every 2 s) gets no
    # answer; a peer answers data within KEEPALIVE_TIMEOUT (10 s), so 12 s after the reading
    # that first saw it leave, long before K + 5 s of silence
    "data unanswered": ([*busy(5), Step(2, "ok", tx=400),             # 12: data seen leaving
                         *[Step(2, "ok", tx=300) for _ in range(5)],  # 22: 10 s
                         Step(2, "ok", tx=300), Step(2, "ok", tx=300)],  # 24: 12 s
                        [*[None] * 11, "data_unanswered", "data_unanswered"], {}),
    # the peer had nothing to send back: its passive keepalive answers within 10 s
    "data answered by the passive keepalive": (
        [Step(5, "ok", rx=32, tx=32), Step(2, "ok", tx=400),
         *[Step(2, "ok") for _ in range(4)], Step(2, "ok", rx=32), Step(2, "ok", tx=400),
         *[Step(2, "ok") for _ in range(5)], Step(1, "ok", rx=32)], [None] * 14, {}),
    # keepalives and handshake initiations are not data, however long nothing comes back
    # (until K + 5 s of silence, the idle rule's business)
    "initiations and keepalives are not data": (
        [Step(5, "ok", rx=32, tx=32), *[Step(5, "ok", tx=148 + 32) for _ in range(5)]],
        [None] * 6, {}),
    # a busy healthy tunnel: data both ways every reading, never suspect
    "busy and healthy": ([*busy(60)], [None] * 60, {}),
    # the data rule needs no persistent keepalive: the passive keepalive is always on
    "data unanswered without keepalive": (
        [Step(5, "ok", rx=100, tx=100), Step(2, "ok", tx=400), Step(10, "ok"),
         Step(2, "ok")], [None, None, None, "data_unanswered"], {"keepalive": 0}),
    # a rekey began at 125 s and its first initiation got no answer within 7 s
    "rekey unanswered": ([*healthy(24), Step(5, "ok", rx=32, tx=180),
                          Step(5, "ok", tx=148), Step(3, "ok", rx=32, tx=148)],
                         [*[None] * 26, "rekey_unanswered"], {}),
    # without keepalive a silent peer proves nothing
    "no keepalive": ([Step(5, "ok"), Step(100, "ok")], [None, None], {"keepalive": 0}),
    # nor before the first handshake (the connect grace judges that)
    "never handshaked": ([Step(5, "ok"), Step(100, "ok")], [None, None],
                         {"first_handshake_age": None}),
}


@pytest.mark.parametrize("name", list(SUSPICIONS))
def test_suspicion(name: str) -> None:
    steps, expected, kw = SUSPICIONS[name]
    assert suspicions(steps, **kw) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("every", [1.0, 2.0, 5.0, 7.0])
@pytest.mark.parametrize("offset", [0.0, 0.3, 1.7, 4.9])
def test_sampling_cannot_make_a_healthy_idle_tunnel_look_silent(every: float,
                                                                offset: float) -> None:
    """Keepalives each way every K + 4 s (timers running late on a loaded box), read every
    1-7 s at any phase: the silence is measured from the reading that first saw the counter
    move, never earlier than the packet, so it never reaches K + 5 s. (The session is
    rekeyed with the first keepalive after 120 s, as the initiator does.)"""
    clock = Clock()
    hs, hs_at = wall(clock), 0.0
    rx = tx = 1000
    hist = None
    arrivals = [offset + 29.0 * i for i in range(12)]
    t = 0.0
    codes = set()
    while t < 320:
        clock.advance(every)
        t += every
        moved = 1000 + 32 * sum(1 for a in arrivals if a <= t) != rx
        rx = tx = 1000 + 32 * sum(1 for a in arrivals if a <= t)
        if moved and t - hs_at >= 120:
            hs, hs_at = wall(clock), t
        peer = PeerStats(public_key=KEY, endpoint="10.0.0.2:51820", allowed_ips=(),
                         last_handshake=hs, rx_bytes=rx, tx_bytes=tx,
                         persistent_keepalive=25)
        hist = observe(hist, peer, now=clock.now, wall=wall(clock))
        found = suspicion(hist, clock.now, thresholds(AUTO, 25))
        codes.add(None if found is None else found[0])
    assert codes == {None}


def test_the_non_data_allowance_counts_keepalives_and_initiations() -> None:
    # two keepalives (one at each end of a short window) and one initiation
    assert non_data_allowance(1.0, 25) == 2 * 32 + 148
    # one more keepalive per K, one more initiation per REKEY_TIMEOUT
    assert non_data_allowance(25.0, 25) == 3 * 32 + 6 * 148
    assert non_data_allowance(10.0, 0) == 2 * 32 + 3 * 148
    # one collector publish (~160 B) plus its ACK is already more than a short window's
    assert non_data_allowance(2.0, 25) < 2 * 160


def quiet_flags(steps: list[Step]) -> list[bool]:
    clock = Clock()
    hs = wall(clock)
    rx = tx = 1000
    hist = None
    seen = []
    for step in steps:
        clock.advance(step.after)
        rx, tx = rx + step.rx, tx + step.tx
        peer = PeerStats(public_key=KEY, endpoint="10.0.0.2:51820", allowed_ips=(),
                         last_handshake=hs, rx_bytes=rx, tx_bytes=tx, persistent_keepalive=25)
        hist = observe(hist, peer, now=clock.now, wall=wall(clock))
        seen.append(quiet_after_data(hist, clock.now))
    return seen


def test_a_busy_tunnel_falling_silent_at_once_is_a_question_for_the_kernel() -> None:
    # busy, then nothing either way (a send failure): asked 4 s after the last movement
    assert quiet_flags([*busy(3), Step(2, "ok"), Step(2, "ok"), Step(2, "ok")]) == [
        False, False, False, False, True, True]
    # the closing keepalive after the data: no longer "right after data"
    assert quiet_flags([*busy(3), Step(2, "ok"), Step(8, "ok", tx=32), Step(4, "ok"),
                        Step(20, "ok")]) == [False] * 7
    # an idle tunnel (keepalives only) never asks
    assert quiet_flags([*healthy(20, every=2.0)]) == [False] * 20


@pytest.mark.parametrize(("before", "after"), [(5_000_000, 220), (2**64 - 40, 300)],
                         ids=["re-created between two readings", "u64 wrap"])
def test_counters_that_go_backwards_restart_the_windows_and_never_alarm(
        before: int, after: int) -> None:
    """A peer's kernel counters start again from 0 when the device or the peer is
    re-created between two readings (seen in the QEMU bed: a re-created kernel device had
    handshaked again before the next run), and a u64 counter wraps after 16 EiB (which no
    test can produce live): both read as a reset, never as a negative delta, a stall or a
    send failure; the windows restart and still judge what follows."""
    clock = Clock()
    hist = None
    seen = []

    def read(rx: int, tx: int, *, new_handshake: bool = False) -> None:
        nonlocal hist, handshake
        if new_handshake:
            handshake = wall(clock)
        peer = PeerStats(public_key=KEY, endpoint="10.0.0.2:51820", allowed_ips=(),
                         last_handshake=handshake, rx_bytes=rx, tx_bytes=tx,
                         persistent_keepalive=25)
        hist = observe(hist, peer, now=clock.now, wall=wall(clock))
        assert hist.rx - hist.rx_at_tx_growth >= 0
        assert hist.tx - hist.tx_at_rx_growth >= 0
        assert hist.tx - hist.tx_at_handshake >= 0
        seen.append(classify(hist, clock.now, thresholds(AUTO, 25))[0])

    handshake = wall(clock)
    read(before, before)
    clock.advance(5)
    read(before + 32, before + 32)
    clock.advance(5)
    read(after, after, new_handshake=True)  # re-created (or wrapped) and handshaked again
    rx = tx = after
    for _ in range(20):  # keepalives both ways: healthy
        clock.advance(5)
        rx, tx = rx + 32, tx + 32
        read(rx, tx)
    assert set(seen) == {"ok"}
    for _ in range(14):  # then only ours leave: a stall, judged on the restarted windows
        clock.advance(5)
        tx += 32
        read(rx, tx)
    assert seen[-1] == "stalled"
    assert "send_failing" not in seen
