"""The pure WireGuard health model: one peer's history, its thresholds, its reason.

Both the ``wireguard`` check (:mod:`edgeheal.checks.wireguard`, every few seconds, for
alerts and remediation) and ``edgeheal diagnose`` (once, around a capture) judge a device's
peers. They judge them here, so they cannot disagree on what "a handshake happened" or
"the session is dead" means. Nothing in this module reads a clock, a socket or a file:
``now`` (monotonic) and ``wall`` are passed in, and every scenario is a table-driven test
(``tests/wireguard/test_classifier.py``).

A peer is judged with the protocol's own timers (REKEY_AFTER_TIME 120 s, REKEY_TIMEOUT 5 s,
REJECT_AFTER_TIME 180 s, :mod:`edgeheal.boundaries.wg.readings`) and its persistent-keepalive
interval
*K*; the reasons and their states are the closed table :data:`REASONS` (the check's module
docstring explains each one to operators).

Why the monotonic bookkeeping: the device reports the last handshake as *wall-clock* time.
An edge box's clock steps at NTP sync (often minutes, after a cold boot years), so
``time.time() - last_handshake`` can fake a dead tunnel or hide one. :func:`observe`
therefore notes, on the monotonic clock, *when the reported timestamp changed* and measures
ages from that; the wall clock is used once, to place a handshake within the interval in
which it was first seen (clamped into that interval, so a step moves nothing by more than
one interval). rx/tx growth windows are kept the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeheal.boundaries.wg.readings import (
    KEEPALIVE_TIMEOUT,
    REJECT_AFTER_TIME,
    REKEY_AFTER_TIME,
    REKEY_TIMEOUT,
    PeerStats,
)
from edgeheal.boundaries.wg.thresholds import (  # re-exported: the model's numbers
    ANSWER_DUE,
    IDLE_SLACK,
    INITIATION_BYTES,
    KEEPALIVE_BYTES,
    QUIET_AFTER_DATA,
    REKEY_RETRIES_BEFORE_WARN,
    REKEY_SLACK,
    SEND_SLACK,
    STALL_FACTOR,
    STALL_SLACK,
    UNANSWERED_ATTEMPTS,
    Thresholds,
    thresholds,
)
from edgeheal.model import State

if TYPE_CHECKING:
    pass

REASONS: Mapping[str, State] = {
    # one peer (classify)
    "ok": State.OK,
    "rekey_failing": State.DEGRADED,
    "stalled": State.FAILED,
    "send_failing": State.FAILED,
    "dead": State.FAILED,
    "never_connected": State.FAILED,
    "connecting": State.UNKNOWN,
    # the devices as a whole (the check)
    "interface_missing": State.FAILED,
    "no_peers": State.FAILED,
    "target_unresolved": State.UNKNOWN,
    "permission_denied": State.UNKNOWN,
    "read_error": State.UNKNOWN,
}
"""Every reason the check reports, and the one state it maps to."""


# --- per-peer history -------------------------------------------------------------------

def new_handshake(before: float | None, after: float | None) -> bool:
    """Did the device report a handshake between two readings of a peer?

    Only a *change* of the reported (wall-clock) time counts, never its direction: a clock
    stepped back between two handshakes reports the newer one with an older timestamp.
    """
    return after is not None and after != before


@dataclass(frozen=True, slots=True)
class PeerHistory:
    """What we remember of one peer between runs. All times are monotonic seconds."""

    first_seen: float
    last_seen: float
    reported_handshake: float | None
    """The device's last value (wall clock), compared only for *change*."""
    handshake_at: float | None
    """Monotonic estimate of the latest handshake; None = never."""
    rx: int
    tx: int
    rx_grew_at: float
    tx_at_rx_growth: int
    tx_at_handshake: int
    keepalive: int
    tx_grew_at: float = 0.0
    """When tx was last seen to change (monotonic)."""
    data_sent_at: float | None = None
    """The first reading at which tx had grown, since rx last grew, by more than keepalives
    and handshake initiations can explain: our *data* left and its answer is due within
    :data:`ANSWER_DUE`. None once rx grows again."""
    data_received_at: float | None = None
    """The mirror of ``data_sent_at``: the first reading at which rx had grown, since tx last
    grew, by more than the peer's keepalives and handshakes explain: our passive keepalive is
    due within KEEPALIVE_TIMEOUT. None once tx grows again."""
    rx_at_tx_growth: int = 0
    data_moved_at: float | None = None
    """The last reading in which either counter grew by more than keepalives and handshakes
    explain (a busy tunnel: every reading)."""
    rekey_sent_at: float | None = None
    """The first reading at which the session's rekey initiation has certainly been sent:
    traffic moved in a window that began when the handshake was already REKEY_AFTER_TIME
    old (the initiator rekeys on its first send after that; with keepalive both ends send
    every K). None: not yet, or a handshake completed since."""

    def handshake_age(self, now: float) -> float | None:
        return None if self.handshake_at is None else max(0.0, now - self.handshake_at)


def observe(prev: PeerHistory | None, peer: PeerStats, *, now: float,
            wall: float) -> PeerHistory:
    """Fold one reading of a peer into its history (pure: ``now``/``wall`` are passed in)."""
    reported = peer.last_handshake
    if prev is None or (prev.reported_handshake is not None and reported is None):
        # New peer, or the device was re-created (handshake back to "never"): start over.
        return PeerHistory(
            first_seen=now, last_seen=now, reported_handshake=reported,
            handshake_at=None if reported is None else now - max(0.0, wall - reported),
            rx=peer.rx_bytes, tx=peer.tx_bytes, rx_grew_at=now,
            tx_at_rx_growth=peer.tx_bytes, tx_at_handshake=peer.tx_bytes,
            keepalive=peer.persistent_keepalive, tx_grew_at=now,
            rx_at_tx_growth=peer.rx_bytes)
    handshake_at, tx_at_handshake = prev.handshake_at, prev.tx_at_handshake
    rekey_sent_at = prev.rekey_sent_at
    moved = peer.rx_bytes != prev.rx or peer.tx_bytes != prev.tx
    if (rekey_sent_at is None and moved and handshake_at is not None
            and prev.last_seen - handshake_at >= REKEY_AFTER_TIME):
        rekey_sent_at = now
    if reported is not None and new_handshake(prev.reported_handshake, reported):
        # A new handshake happened since the last run: place it by the wall clock but
        # never outside (last run, now], so a clock step cannot move it further.
        estimate = now - max(0.0, wall - reported)
        handshake_at = min(now, max(prev.last_seen, estimate))
        tx_at_handshake = peer.tx_bytes
        rekey_sent_at = None
    rx_grew_at, tx_at_rx_growth = prev.rx_grew_at, prev.tx_at_rx_growth
    if peer.rx_bytes != prev.rx or peer.tx_bytes < prev.tx:
        # rx grew (or the counters were reset with the device): the window restarts.
        rx_grew_at, tx_at_rx_growth = now, peer.tx_bytes
    tx_grew_at = now if peer.tx_bytes != prev.tx else prev.tx_grew_at
    tx_at_handshake = min(tx_at_handshake, peer.tx_bytes)
    data_sent_at, data_received_at = prev.data_sent_at, prev.data_received_at
    if rx_grew_at == now:
        data_sent_at = None
    elif data_sent_at is None and peer.tx_bytes - tx_at_rx_growth > non_data_allowance(
            now - rx_grew_at, peer.persistent_keepalive):
        data_sent_at = now
    window = now - prev.last_seen
    data_moved_at = prev.data_moved_at
    if max(peer.rx_bytes - prev.rx, peer.tx_bytes - prev.tx) > non_data_allowance(
            window, peer.persistent_keepalive):
        data_moved_at = now
    rx_at_tx_growth = prev.rx_at_tx_growth
    if tx_grew_at == now or peer.rx_bytes < prev.rx:
        data_received_at, rx_at_tx_growth = None, peer.rx_bytes
    elif data_received_at is None and peer.rx_bytes - rx_at_tx_growth > non_data_allowance(
            now - tx_grew_at, peer.persistent_keepalive):
        data_received_at = now
    return PeerHistory(
        first_seen=prev.first_seen, last_seen=now, reported_handshake=reported,
        handshake_at=handshake_at, rx=peer.rx_bytes, tx=peer.tx_bytes,
        rx_grew_at=rx_grew_at, tx_at_rx_growth=tx_at_rx_growth,
        tx_at_handshake=tx_at_handshake, keepalive=peer.persistent_keepalive,
        tx_grew_at=tx_grew_at, rekey_sent_at=rekey_sent_at, data_sent_at=data_sent_at,
        data_received_at=data_received_at, rx_at_tx_growth=rx_at_tx_growth,
        data_moved_at=data_moved_at)


def non_data_allowance(window: float, keepalive: int) -> int:
    """The most bytes a device sends in ``window`` seconds without sending data (one
    keepalive at the start and one per K, one passive keepalive, and a handshake initiation
    per REKEY_TIMEOUT plus one): tx growth beyond it since rx last grew is data."""
    keepalives = 2 + (int(window // keepalive) if keepalive > 0 else 0)
    initiations = 1 + int(window // REKEY_TIMEOUT)
    return KEEPALIVE_BYTES * keepalives + INITIATION_BYTES * initiations


# --- the reason ---------------------------------------------------------------------------

def classify(hist: PeerHistory, now: float, limits: Thresholds) -> tuple[str, str]:
    """(reason, human explanation) for one peer. Pure; the rules are in the check's doc."""
    age = hist.handshake_age(now)
    if age is None:
        waited = now - hist.first_seen
        if waited < limits.connect_grace:
            return "connecting", (f"no handshake yet ({waited:.0f}s of "
                                  f"{limits.connect_grace:g}s grace)")
        return "never_connected", f"no handshake in {waited:.0f}s since the peer appeared"
    # Without persistent keepalive an idle peer legitimately stops handshaking: its age
    # only means something while we are trying to send to it.
    trying = hist.keepalive > 0 or hist.tx > hist.tx_at_handshake
    failing = send_failure(hist, now, limits)
    if failing is not None:
        return "send_failing", failing
    if trying and age >= limits.dead_after:
        return "dead", (f"last handshake {age:.0f}s ago (> {limits.dead_after:g}s): "
                        "the session has expired")
    silent = now - hist.rx_grew_at
    # While a rekey is due, the initiator's handshake retries (every 5 s) re-arm its
    # persistent-keepalive timer, so it sends no keepalives: on the responder rx goes flat
    # although the session still works. Until the session expires, a stall that began
    # once the rekey was due is the rekey's problem, reported by the age rules below.
    rekeying = (hist.handshake_at is not None and age < REJECT_AFTER_TIME
                and hist.rx_grew_at - hist.handshake_at >= REKEY_AFTER_TIME - REKEY_TIMEOUT)
    if (limits.rx_stall_after is not None and silent >= limits.rx_stall_after
            and hist.tx > hist.tx_at_rx_growth and not rekeying):
        return "stalled", (f"nothing received for {silent:.0f}s while sending "
                           f"(> {limits.rx_stall_after:g}s)")
    unanswered = rekey_unanswered_for(hist, now)
    if hist.keepalive > 0 and unanswered is not None and unanswered >= REKEY_WARN_AFTER:
        return "rekey_failing", (
            f"last handshake {age:.0f}s ago: the rekey began {unanswered:.0f}s ago and "
            f"{REKEY_RETRIES_BEFORE_WARN + 1} attempts went unanswered; the session expires "
            f"at {REJECT_AFTER_TIME:g}s")
    if trying and age >= limits.rekey_failing_after:
        return "rekey_failing", (
            f"last handshake {age:.0f}s ago (> {limits.rekey_failing_after:g}s): rekey "
            f"attempts unanswered; the session expires at {REJECT_AFTER_TIME:g}s")
    if not trying:
        return "ok", f"idle; last handshake {age:.0f}s ago"
    return "ok", f"last handshake {age:.0f}s ago"


def send_failure(hist: PeerHistory, now: float, limits: Thresholds) -> str | None:
    """Why the device's sends fail (the explanation), or None. A keepalive is sent K after
    the last packet sent *or received*, so: nothing moved either way for ``send_fail_after``
    (K + 5 s) means our keepalive did not leave; the peer's data arrived and our tx stayed
    flat past ANSWER_DUE means our passive keepalive did not leave; tx flat for
    ``send_fail_idle_after`` (K + 15 s) while only the peer's keepalives arrive is the
    fallback (one end may legitimately stay quiet for a round: :data:`IDLE_SLACK`)."""
    if limits.send_fail_after is None:
        return None
    quiet, silent = now - hist.tx_grew_at, now - hist.rx_grew_at
    if quiet < limits.send_fail_after:
        return None
    due = f"a keepalive is due every {hist.keepalive}s"
    if silent >= limits.send_fail_after:
        return (f"nothing sent or received for {min(quiet, silent):.0f}s although {due} "
                f"(> {limits.send_fail_after:g}s)")
    if hist.data_received_at is not None and now - hist.data_received_at >= ANSWER_DUE:
        return (f"nothing sent for {quiet:.0f}s although the peer's data arrived "
                f"{now - hist.data_received_at:.0f}s ago (an answer is due within "
                f"{KEEPALIVE_TIMEOUT:g}s)")
    idle = limits.send_fail_idle_after
    if idle is not None and quiet >= idle:
        return f"nothing sent for {quiet:.0f}s although {due} (> {idle:g}s)"
    return None


def quiet_after_data(hist: PeerHistory, now: float) -> bool:
    """Nothing has moved either way for :data:`QUIET_AFTER_DATA` since a reading in which
    data moved: a busy tunnel that fell silent at once. Not a suspicion by itself (an
    application may just pause, and the closing keepalive may share the data's reading):
    the check then asks the kernel whether the uplink's address, route or link is gone,
    and only that evidence makes the peer suspect (``uplink_gone``)."""
    moved = max(hist.rx_grew_at, hist.tx_grew_at)
    return (hist.handshake_at is not None and hist.data_moved_at is not None
            and hist.data_moved_at >= moved and now - moved >= QUIET_AFTER_DATA)


REKEY_WARN_AFTER = REKEY_RETRIES_BEFORE_WARN * REKEY_TIMEOUT + REKEY_SLACK
"""Seconds after ``rekey_sent_at`` without a handshake that make ``rekey_failing`` (12 s)."""


def rekey_unanswered_for(hist: PeerHistory, now: float) -> float | None:
    """Seconds since the current rekey certainly began without a handshake; None: no rekey
    is known to be under way."""
    if hist.rekey_sent_at is None:
        return None
    return now - hist.rekey_sent_at


def suspicion(hist: PeerHistory, now: float, limits: Thresholds) -> tuple[str, str] | None:
    """(code, explanation) when the free local signals make the peer *suspect*: worth an
    active confirmation now (the tunnel-path MQTT probe), not yet a verdict. None when
    nothing is odd. Only peers with a handshake; the idle rules only with keepalive.

    ``data_unanswered``: our data left (tx grew since rx last grew by more than keepalives
    and initiations explain) and nothing came back within :data:`ANSWER_DUE` (12 s): a peer
    that receives data answers within KEEPALIVE_TIMEOUT, so a healthy tunnel never raises it
    and a busy one raises it about 12 s after a blackhole, whatever K. ``rx_silent``:
    nothing received for K + 15 s; ``tx_flat``: nothing sent for K + 15 s although a
    keepalive is due (:data:`IDLE_SLACK`: one end of a healthy idle tunnel may skip a
    round); ``rekey_unanswered``: the first rekey initiation got no answer within
    REKEY_TIMEOUT + slack.

    The silences are measured from the reading that first saw the counter grow, which is
    never earlier than the packet itself: a sparse sampling interval delays a suspicion
    by up to one interval but cannot make a healthy tunnel look silent.
    """
    if hist.handshake_at is None:
        return None
    if hist.data_sent_at is not None and now - hist.data_sent_at >= ANSWER_DUE:
        return "data_unanswered", (
            f"data sent {now - hist.data_sent_at:.0f}s ago and nothing received since "
            f"(a peer answers data within {KEEPALIVE_TIMEOUT:g}s)")
    if limits.suspect_after is None:
        return None
    silent, quiet = now - hist.rx_grew_at, now - hist.tx_grew_at
    if silent >= limits.suspect_after:
        return "rx_silent", f"nothing received for {silent:.0f}s (keepalive {hist.keepalive}s)"
    if quiet >= limits.suspect_after:
        return "tx_flat", (f"nothing sent for {quiet:.0f}s although a keepalive is due every "
                           f"{hist.keepalive}s")
    unanswered = rekey_unanswered_for(hist, now)
    if unanswered is not None and unanswered >= REKEY_TIMEOUT + REKEY_SLACK:
        return "rekey_unanswered", f"a rekey began {unanswered:.0f}s ago without a handshake"
    return None


__all__ = ["ANSWER_DUE", "IDLE_SLACK", "REASONS", "REKEY_WARN_AFTER", "SEND_SLACK",
           "STALL_FACTOR", "STALL_SLACK", "UNANSWERED_ATTEMPTS", "PeerHistory", "Thresholds",
           "classify", "new_handshake", "non_data_allowance", "observe", "quiet_after_data",
           "rekey_unanswered_for", "send_failure", "suspicion", "thresholds"]
