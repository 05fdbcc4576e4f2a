"""Confirmation: ask for the tunnel-path MQTT targets now while the tunnel is in doubt.

A watched peer that is suspect, a failed verdict (:data:`HASTEN_VERDICTS`) or a tunnel
target whose peer cannot be found yet (``target_unresolved``: the probe's connection is
what shows kube-proxy's translation in conntrack) asks the supervisor to run every enabled
tunnel-path MQTT target at once (``Context.hasten``): once when the episode starts, then
every :data:`HASTEN_EVERY` seconds while it lasts, at most :data:`HASTEN_MAX` times. A
failed verdict that follows a suspicion starts a new episode (stronger evidence), and the
first ok result after a failed verdict asks once more (the repair is confirmed, and
readiness and the remediator's verification follow at once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("edgeheal.checks.wireguard")  # the parent's name: operators grep it

HASTEN_EVERY = 5.0
"""Seconds between two requests to run the tunnel-path MQTT targets while a watched peer
stays suspect."""
HASTEN_MAX = 6
"""Requests per suspicion episode (the first included): 30 s of quick confirmations, then
the targets' own intervals (and their own re-probing while they fail) take over."""
HASTEN_VERDICTS = frozenset({"no_peers", "interface_missing", "dead", "stalled",
                             "send_failing", "never_connected"})
"""Failed verdicts that ask for the tunnel-path MQTT targets at once, like a suspicion:
the tunnel cannot carry them, so readiness should not wait for the probes' own interval."""


class Episodes:
    """The bounded confirmation requests of one check (see the module docstring)."""

    def __init__(self, hasten: Callable[[], None]) -> None:
        self._hasten = hasten
        self._since: float | None = None
        self._hastened: tuple[float, int] = (0.0, 0)
        self._verdict = False
        self._was_failed = False

    def confirm(self, doubts: list[str], now: float, *, verdict: bool) -> None:
        """Ask now while ``doubts`` (bounded: :data:`HASTEN_EVERY`, :data:`HASTEN_MAX`)."""
        if not doubts:
            if self._since is not None:
                log.debug("suspicion over", extra={"check": "wireguard"})
            self._since, self._hastened, self._verdict = None, (0.0, 0), False
            return
        last, count = self._hastened
        if self._since is None or (verdict and not self._verdict):
            self._since, self._verdict = now, verdict
            last, count = now, 0
            log.info("%s: confirming over the tunnel path", doubts[0],
                     extra={"check": "wireguard"})
        elif count >= HASTEN_MAX or now - last < HASTEN_EVERY:
            return
        self._hasten()
        self._hastened = (now, count + 1)

    def settle(self, *, failed: bool, ok: bool) -> None:
        """After each result: back from a failed verdict (a repair, a Flannel restart),
        confirm over the tunnel path at once. One request per recovery."""
        if self._was_failed and ok:
            log.info("the tunnel is back: confirming over the tunnel path",
                     extra={"check": "wireguard"})
            self._hasten()
        self._was_failed = failed or (self._was_failed and not ok)
