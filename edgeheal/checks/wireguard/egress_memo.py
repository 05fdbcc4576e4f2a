"""The egress memo: what rtnetlink said about each peer's way out, asked as seldom as possible.

A ``send_failing`` peer's cause (``no_address``, ``no_route``, ``link_down``, ...:
:mod:`edgeheal.boundaries.wg.egress`) is told apart by the source address the kernel chose
for the peer's endpoint while the path still worked: the memo learns it once per endpoint
(one route lookup, none in the steady state; again every :data:`LEARN_RETRY` seconds while
it is unknown). And a busy tunnel that falls silent at once is asked about once per
silence: is the uplink's address, route or link gone (``uplink_gone``, a suspicion)? The
answer is kept until a counter moves.

The memo is forgotten whole after an uplink switch
(:class:`edgeheal.checks.wireguard.switch_follower.SwitchFollower`), so the next lookups
learn the new uplink's source, and per peer when the peer goes away.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeheal.boundaries.wg.egress import Egress
from edgeheal.boundaries.wg.health import PeerHistory
from edgeheal.boundaries.wg.readings import endpoint_address

LEARN_RETRY = 10.0
"""Seconds before the route lookup for an endpoint whose source address is still unknown
is tried again (the first found no route, as when the agent starts before the modem's
data session, or failed): without the source a later address loss reads as ``no_route``."""
UPLINK_GONE = frozenset({"no_address", "no_route", "link_down"})
"""Egress causes that make a busy tunnel's sudden silence a suspicion (``uplink_gone``)."""

Key = tuple[str, str]
"""(interface, peer's public key)."""


class EgressMemo:
    """The learned source addresses and the uplink answers of one check's peers."""

    def __init__(self, egress: Egress, clock: Callable[[], float]) -> None:
        self._egress = egress
        self._clock = clock
        self._sources: dict[Key, tuple[str | None, str | None, float]] = {}
        """(interface, peer) -> (endpoint, the source address the kernel chose for it, when
        asked), learned once per endpoint (retried while unknown): the evidence for
        ``no_address`` later."""
        self._uplink: dict[Key, tuple[float, dict[str, Any] | None]] = {}
        """(interface, peer) -> (when a counter last moved, the uplink-gone diagnosis then
        or None): the one question per silence."""

    @property
    def learned(self) -> bool:
        """Whether any source address was learned (asked) yet."""
        return bool(self._sources)

    def clear(self) -> None:
        """Forget everything (the active uplink switched)."""
        self._sources.clear()
        self._uplink.clear()

    def drop(self, key: Key) -> None:
        """Forget one peer (it is no longer on its device)."""
        self._sources.pop(key, None)
        self._uplink.pop(key, None)

    async def learn(self, key: Key, endpoint: str | None) -> None:
        """Remember the source address for a new endpoint (one route lookup per endpoint,
        none in the steady state; every :data:`LEARN_RETRY` seconds while unknown)."""
        known = self._sources.get(key)
        now = self._clock()
        if known is not None and known[0] == endpoint and (
                known[1] is not None or now - known[2] < LEARN_RETRY):
            return
        address = endpoint_address(endpoint)
        source = await self._egress.learn(address) if address is not None else None
        self._sources[key] = (endpoint, source, now)

    async def uplink_gone(self, key: Key, endpoint: str | None,
                          hist: PeerHistory) -> tuple[str, str] | None:
        """A busy tunnel fell silent at once: is the uplink's address, route or link gone?
        One rtnetlink question per silence (the answer is kept until a counter moves)."""
        moved = max(hist.rx_grew_at, hist.tx_grew_at)
        asked = self._uplink.get(key)
        if asked is None or asked[0] != moved:
            found = await self.why_not_sending(key, endpoint)
            asked = (moved, found if found["cause"] in UPLINK_GONE else None)
            self._uplink[key] = asked
        if asked[1] is None:
            return None
        return "uplink_gone", (f"a busy tunnel fell silent and the uplink is gone: "
                               f"{asked[1]['cause']} ({asked[1]['message']})")

    async def why_not_sending(self, key: Key, endpoint: str | None) -> dict[str, Any]:
        """The egress diagnosis of a ``send_failing`` peer (only then: rtnetlink asks)."""
        known = self._sources.get(key)
        found = await self._egress.diagnose(
            endpoint_address(endpoint),
            source=known[1] if known is not None and known[0] == endpoint else None)
        return {"cause": found.cause, "message": found.message, **found.detail}


__all__ = ["LEARN_RETRY", "UPLINK_GONE", "EgressMemo", "Key"]
