"""The numbers a WireGuard peer is judged by: the protocol's timers, their slack, and the
per-peer thresholds resolved from the settings and the peer's keepalive.

Why apart from the model (:mod:`edgeheal.boundaries.wg.health`): the slack and the
``"auto"`` resolution are tuning, each with its own measured reason below, while the model
is the logic that applies them; a change to one is reviewed apart from the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeheal.boundaries.wg.readings import (
    KEEPALIVE_TIMEOUT,
    REJECT_AFTER_TIME,
    REKEY_AFTER_TIME,
    REKEY_TIMEOUT,
)

if TYPE_CHECKING:
    from edgeheal.config import WireguardSettings

STALL_FACTOR = 2.5
STALL_SLACK = 5.0
"""Seconds added to ``STALL_FACTOR x K`` (REKEY_TIMEOUT): late timers are not a stall."""
UNANSWERED_ATTEMPTS = 3
"""Rekey attempts (5 s apart) that must go unanswered before ``rekey_failing`` by the
handshake age alone (the fallback when no traffic shows when the rekey began)."""
SEND_SLACK = REKEY_TIMEOUT
"""Seconds added to K for ``send_fail_after``: a keepalive timer seen running 3 s late on
a loaded box is not a send failure."""
IDLE_SLACK = 15.0
"""Seconds added to K before *one* direction's silence on an otherwise healthy idle tunnel
counts: tx flat while the peer's keepalives arrive (``send_failing`` without other
evidence, the ``tx_flat`` suspicion) or rx silent while ours leave (``rx_silent``). A
received keepalive re-arms the persistent-keepalive timer, so on an idle tunnel the two
ends race each round and one of them may send nothing for a round or more: measured at
K = 25 s on a loaded lab box, a healthy tunnel's tx (or rx) was flat for 30-35 s about once
a minute. Nothing moving *either way* for K + 5 s stays a send failure (our own timer must
have fired), and so does our tx staying flat 12 s after the peer's *data* arrived (our
passive keepalive was due)."""
KEEPALIVE_BYTES = 32
"""A keepalive on the device's byte counters (an empty transport message)."""
INITIATION_BYTES = 148
"""A handshake initiation on the byte counters."""
ANSWER_SLACK = 2.0
"""Seconds added to KEEPALIVE_TIMEOUT for the peer's answer to our data: the RTT and the
peer's timer running late (WireGuard itself retries a handshake after 10 s + 5 s)."""
QUIET_AFTER_DATA = 4.0
"""Seconds of nothing moving either way, after a reading in which data moved, before the
check asks rtnetlink whether the uplink is still there (:func:`quiet_after_data`)."""
ANSWER_DUE = KEEPALIVE_TIMEOUT + ANSWER_SLACK
"""Seconds after our data was seen leaving by which something must have come back (12 s):
a peer that receives a data packet answers within KEEPALIVE_TIMEOUT even with nothing to
send (the passive keepalive: wireguard-go ``timersDataReceived``, Linux
``wg_timers_data_received``)."""
REKEY_RETRIES_BEFORE_WARN = 2
"""Once the first rekey initiation is known to have been sent (``rekey_sent_at``), this
many more 5 s retries must pass unanswered before ``rekey_failing``: three attempts in all
(p^3 under loss p per attempt; docs/wireguard.md has the measurement)."""
REKEY_SLACK = 2.0
"""Seconds after the last counted retry for its answer (an RTT) and the timer jitter."""


# --- thresholds -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Thresholds:
    """The numbers one peer is judged by (seconds)."""

    rekey_failing_after: float
    dead_after: float
    rx_stall_after: float | None
    """None: the peer has no persistent keepalive, so a silent peer proves nothing."""
    connect_grace: float
    send_fail_after: float | None = None
    """None: the peer has no persistent keepalive, so a flat tx proves nothing."""
    suspect_after: float | None = None
    """rx silent or tx flat this long makes a keepalive peer suspect (K + 15 s)."""
    send_fail_idle_after: float | None = None
    """tx flat this long while rx still grows (and no data of the peer's went unanswered)
    is ``send_failing`` (auto: K + 15 s; an explicit ``send_fail_after`` sets both)."""


def thresholds(settings: WireguardSettings, keepalive: int) -> Thresholds:
    """Resolve ``"auto"`` from the protocol constants and the peer's keepalive interval.

    A healthy keepalive-only tunnel rekeys on the initiator's first send after 120 s, so its
    handshake age peaks near 120 s + K; three unanswered 5 s retries past that is
    ``rekey_failing``. Past 180 s the session is refused, + K for the last keepalive that
    would have proved otherwise. Both ends send at least every K, so rx flat for 2.5 x K is
    two missed keepalives plus jitter; + REKEY_TIMEOUT of slack, because on a loaded box
    (the test machines under a parallel suite) keepalive timers run seconds late. A device
    sends a keepalive K after the last packet it sent *or received*, and measured on
    wireguard-go both ends of a healthy keepalive tunnel send every K: tx flat for K + 5 s
    means its sends fail (``send_fail_after``).
    """
    k = float(keepalive) if keepalive > 0 else KEEPALIVE_TIMEOUT
    rekey = settings.rekey_failing_after
    dead = settings.dead_after
    stall = settings.rx_stall_after
    send = settings.send_fail_after
    return Thresholds(
        rekey_failing_after=(REKEY_AFTER_TIME + k + UNANSWERED_ATTEMPTS * REKEY_TIMEOUT
                             if rekey == "auto" else float(rekey)),
        dead_after=REJECT_AFTER_TIME + k if dead == "auto" else float(dead),
        rx_stall_after=(None if keepalive <= 0
                        else STALL_FACTOR * keepalive + STALL_SLACK if stall == "auto"
                        else float(stall)),
        connect_grace=settings.connect_grace,
        send_fail_after=(None if keepalive <= 0
                         else keepalive + SEND_SLACK if send == "auto" else float(send)),
        suspect_after=None if keepalive <= 0 else keepalive + IDLE_SLACK,
        send_fail_idle_after=(None if keepalive <= 0
                              else keepalive + IDLE_SLACK if send == "auto" else float(send)),
    )
