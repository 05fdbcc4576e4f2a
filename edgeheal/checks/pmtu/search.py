"""The pure parts of the ``pmtu`` check: which size to probe next, and the verdict.

Sizes are IP packet sizes (what an MTU bounds). The search starts at the full size (the
tunnel device's MTU): in health that one probe is the whole run. When the full size is
lost it tries the size that passed last time (``hint``) and the next step above it — the
second run of a doubt confirms in two probes instead of a whole search — else the floor,
then bisects between the largest size that passed and the smallest that was lost, in
steps of :data:`STEP` bytes. At most :data:`MAX_PROBES` probes a run. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgeheal.model import State

STEP = 8
"""Resolution of the search, bytes: an MSS 8 bytes under the true limit costs 0.6 %."""
MAX_PROBES = 9
"""Most probes in one run: full, floor, and the bisection of up to 7 steps (a range of
1024 bytes at :data:`STEP`)."""

Result = tuple[int, bool]
"""(IP packet size, whether its segment was acknowledged)."""


def bounds(results: Sequence[Result]) -> tuple[int | None, int | None]:
    """(largest size that passed, smallest size that was lost)."""
    passed = [size for size, ok in results if ok]
    lost = [size for size, ok in results if not ok]
    return (max(passed) if passed else None), (min(lost) if lost else None)


def next_size(full: int, floor: int, results: Sequence[Result],
              hint: int | None = None) -> int | None:
    """The next size to probe, or None when the search is over."""
    if len(results) >= MAX_PROBES:
        return None
    if not results:
        return full
    tried = {size for size, _ in results}
    passed, lost = bounds(results)
    if lost is None:
        return None  # the full size passed
    if passed is None:
        if hint is not None and floor <= hint < lost and hint not in tried:
            return hint
        return floor if floor < lost and floor not in tried else None
    if passed == hint and passed + STEP < lost and passed + STEP not in tried:
        return passed + STEP
    gap = lost - passed
    if gap <= STEP:
        return None
    middle = passed + max(STEP, (gap // 2) // STEP * STEP)
    return middle if middle < lost and middle not in tried else None


LOPSIDED_WINDOW = 20.0
"""Seconds of counter readings the lopsided-traffic suspicion looks at (at least half of it
must be covered)."""
LOPSIDED_TX = 12_000
"""Bytes the tunnel must have sent in the window (about 8 full-size packets: bulk data)."""
LOPSIDED_RATIO = 66
"""tx must exceed rx this many times (rx under 1.5 % of tx). A healthy bulk upload gets a
TCP ACK (96 bytes in WireGuard's counters) for every two full segments (2 x 1456): 3.3 %.
In a black hole the large segments are retransmitted and only keepalives and the small
packets of reconnects come back: 1.1 % in the lab."""

Sample = tuple[float, int, int]
"""(monotonic seconds, tx bytes, rx bytes) of the watched peers together."""


def lopsided(samples: Sequence[Sample], now: float) -> bool:
    """The black hole's signature in WireGuard's counters: bulk data leaving while almost
    nothing comes back. (The WireGuard check's own ``data_unanswered`` cannot see it: the
    small packets that still pass — keepalives, the collector's reconnects — keep
    answering.) A heuristic: a false one costs one full-size probe (2.7 kB), and
    ``suspect_spacing`` bounds how often."""
    if not samples:
        return False
    recent = [s for s in samples if now - s[0] <= LOPSIDED_WINDOW]
    if not recent or now - recent[0][0] < LOPSIDED_WINDOW / 2:
        return False
    _, tx0, rx0 = recent[0]
    _, tx1, rx1 = samples[-1]
    sent, received = tx1 - tx0, rx1 - rx0
    if sent < 0 or received < 0:  # the device was re-created: counters restarted
        return False
    return sent >= LOPSIDED_TX and received * LOPSIDED_RATIO < sent


@dataclass(frozen=True, slots=True)
class Verdict:
    state: State
    reason: str
    message: str
    detail: dict[str, Any]


REASONS: dict[str, State] = {
    "ok": State.OK, "clamped": State.DEGRADED, "pmtu_blackhole": State.FAILED,
    "no_size_passed": State.UNKNOWN, "unreachable": State.UNKNOWN,
    "interface_missing": State.UNKNOWN}
"""The closed reason -> state table (the check's docstring explains it)."""


def judge(full: int, results: Sequence[Result], *, connect_error: str = "",
          clamp: int | None = None, clamp_error: str = "") -> Verdict:
    """The verdict of one run. ``clamp``: the size the MSS clamp holds after this run's
    action (None: no clamp installed)."""
    passed, lost = bounds(results)
    detail: dict[str, Any] = {"mtu": full, "largest_passed": passed, "smallest_lost": lost,
                              "probes": [{"size": s, "passed": ok} for s, ok in results],
                              "clamp": clamp}
    if clamp_error:
        detail["clamp_error"] = clamp_error
    if connect_error and not results:
        return Verdict(State.UNKNOWN, "unreachable", f"the probe's TCP connection failed "
                       f"({connect_error}): not an MTU matter (the tunnel and broker checks "
                       "judge it)", detail)
    if passed is not None and lost is None:
        return Verdict(State.OK, "ok", f"a full {passed}-byte segment passed the tunnel",
                       detail)
    if passed is None:
        if connect_error:
            return Verdict(State.UNKNOWN, "unreachable", f"the probe's TCP connection "
                           f"failed ({connect_error})", detail)
        return Verdict(State.UNKNOWN, "no_size_passed", f"no segment passed, not even "
                       f"{lost} bytes, though the handshake did: the path lost everything "
                       "else (the tunnel and broker checks judge it)", detail)
    lost_text = f"{lost}-byte segments are lost (the tunnel's MTU is {full})"
    if clamp is not None:
        return Verdict(State.DEGRADED, "clamped", f"path-MTU black hole: {lost_text}; "
                       f"TCP MSS clamped to fit {clamp} bytes", detail)
    hint = f" (clamp failed: {clamp_error})" if clamp_error else ""
    return Verdict(State.FAILED, "pmtu_blackhole", f"path-MTU black hole: {lost_text}, "
                   f"{passed} bytes pass; ICMP 'fragmentation needed' never came back{hint}",
                   detail)


__all__ = ["LOPSIDED_RATIO", "LOPSIDED_TX", "LOPSIDED_WINDOW", "MAX_PROBES", "REASONS",
           "STEP", "Result", "Sample", "Verdict", "bounds", "judge", "lopsided", "next_size"]
