"""The pure WireGuard health model: one peer's history, its thresholds, its reason.

Both the ``wireguard`` check (:mod:`edgeheal.checks.wireguard`, every few seconds, for
alerts and remediation) and ``edgeheal diagnose`` (once, around a capture) judge a device's
peers. They judge them here, so they cannot disagree on what "a handshake happened" or
"the session is dead" means. Nothing in this module reads a clock, a socket or a file:
``now`` (monotonic) and ``wall`` are passed in, and every scenario is a table-driven test
(``tests/wireguard/test_classifier.py``).

A peer is judged with the protocol's own timers (REKEY_AFTER_TIME 120 s, REKEY_TIMEOUT 5 s,
REJECT_AFTER_TIME 180 s, :mod:`edgeheal.wg.model`) and its persistent-keepalive interval
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

from edgeheal.model import State
from edgeheal.wg.model import (
    KEEPALIVE_TIMEOUT,
    REJECT_AFTER_TIME,
    REKEY_AFTER_TIME,
    REKEY_TIMEOUT,
    PeerStats,
)

if TYPE_CHECKING:
    from edgeheal.config import WireguardSettings

STALL_FACTOR = 2.5
STALL_SLACK = 5.0
"""Seconds added to ``STALL_FACTOR x K`` (REKEY_TIMEOUT): late timers are not a stall."""
UNANSWERED_ATTEMPTS = 3
"""Rekey attempts (5 s apart) that must go unanswered before ``rekey_failing``."""

REASONS: Mapping[str, State] = {
    # one peer (classify)
    "ok": State.OK,
    "rekey_failing": State.DEGRADED,
    "stalled": State.FAILED,
    "dead": State.FAILED,
    "never_connected": State.FAILED,
    "connecting": State.UNKNOWN,
    # the devices as a whole (the check)
    "interface_missing": State.FAILED,
    "no_peers": State.FAILED,
    "permission_denied": State.UNKNOWN,
    "read_error": State.UNKNOWN,
}
"""Every reason the check reports, and the one state it maps to."""


# --- thresholds -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Thresholds:
    """The numbers one peer is judged by (seconds)."""

    rekey_failing_after: float
    dead_after: float
    rx_stall_after: float | None
    """None: the peer has no persistent keepalive, so a silent peer proves nothing."""
    connect_grace: float


def thresholds(settings: WireguardSettings, keepalive: int) -> Thresholds:
    """Resolve ``"auto"`` from the protocol constants and the peer's keepalive interval.

    A healthy keepalive-only tunnel rekeys on the initiator's first send after 120 s, so its
    handshake age peaks near 120 s + K; three unanswered 5 s retries past that is
    ``rekey_failing``. Past 180 s the session is refused, + K for the last keepalive that
    would have proved otherwise. Both ends send at least every K, so rx flat for 2.5 x K is
    two missed keepalives plus jitter; + REKEY_TIMEOUT of slack, because on a loaded box
    (the test machines under a parallel suite) keepalive timers run seconds late.
    """
    k = float(keepalive) if keepalive > 0 else KEEPALIVE_TIMEOUT
    rekey = settings.rekey_failing_after
    dead = settings.dead_after
    stall = settings.rx_stall_after
    return Thresholds(
        rekey_failing_after=(REKEY_AFTER_TIME + k + UNANSWERED_ATTEMPTS * REKEY_TIMEOUT
                             if rekey == "auto" else float(rekey)),
        dead_after=REJECT_AFTER_TIME + k if dead == "auto" else float(dead),
        rx_stall_after=(None if keepalive <= 0
                        else STALL_FACTOR * keepalive + STALL_SLACK if stall == "auto"
                        else float(stall)),
        connect_grace=settings.connect_grace,
    )


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
            keepalive=peer.persistent_keepalive)
    handshake_at, tx_at_handshake = prev.handshake_at, prev.tx_at_handshake
    if reported is not None and new_handshake(prev.reported_handshake, reported):
        # A new handshake happened since the last run: place it by the wall clock but
        # never outside (last run, now], so a clock step cannot move it further.
        estimate = now - max(0.0, wall - reported)
        handshake_at = min(now, max(prev.last_seen, estimate))
        tx_at_handshake = peer.tx_bytes
    rx_grew_at, tx_at_rx_growth = prev.rx_grew_at, prev.tx_at_rx_growth
    if peer.rx_bytes != prev.rx or peer.tx_bytes < prev.tx:
        # rx grew (or the counters were reset with the device): the window restarts.
        rx_grew_at, tx_at_rx_growth = now, peer.tx_bytes
    tx_at_handshake = min(tx_at_handshake, peer.tx_bytes)
    return PeerHistory(
        first_seen=prev.first_seen, last_seen=now, reported_handshake=reported,
        handshake_at=handshake_at, rx=peer.rx_bytes, tx=peer.tx_bytes,
        rx_grew_at=rx_grew_at, tx_at_rx_growth=tx_at_rx_growth,
        tx_at_handshake=tx_at_handshake, keepalive=peer.persistent_keepalive)


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
    if trying and age >= limits.rekey_failing_after:
        return "rekey_failing", (
            f"last handshake {age:.0f}s ago (> {limits.rekey_failing_after:g}s): rekey "
            f"attempts unanswered; the session expires at {REJECT_AFTER_TIME:g}s")
    if not trying:
        return "ok", f"idle; last handshake {age:.0f}s ago"
    return "ok", f"last handshake {age:.0f}s ago"


__all__ = ["REASONS", "STALL_FACTOR", "STALL_SLACK", "UNANSWERED_ATTEMPTS", "PeerHistory",
           "Thresholds", "classify", "new_handshake", "observe", "thresholds"]
