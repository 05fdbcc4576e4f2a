"""What the lab's scenarios judge by: small readings of the runner's observations, shared
by every scenario module (:mod:`.scenarios`, :mod:`.path_faults`, :mod:`.modems`)."""

from __future__ import annotations

from edgeheal.lab.runner import Expectation, Lab
from edgeheal.lab.world import Edge

TUNNEL_UP_BUDGET = 60.0
"""Seconds for a tunnel to come up once nothing blocks it (handshake retries every 5 s)."""


def tunnel_ok(lab: Lab, edge: Edge) -> bool:
    """The edge's ``wireguard`` check is ok, as the runner last read it."""
    return lab.state(edge, "wireguard") == "ok"


def alerts_of(lab: Lab, kind: str, node: str | None = None) -> list[dict[str, object]]:
    return [a for a in lab.world.alerts() if a.get("kind") == kind
            and (node is None or a.get("node") == node)]


def failed_ever(lab: Lab, edge: Edge, check: str, after: float = 0.0) -> bool:
    return lab.first(edge, "agent", lambda e: (e.get("detail") or {}).get("check") == check
                     and (e.get("detail") or {}).get("state") == "failed", after) is not None


def count_reason(lab: Lab, edge: Edge, check: str, reason: str, after: float = 0.0) -> int:
    return sum(1 for e in lab.timeline if e["t"] >= after and e["source"] == "agent"
               and e["edge"] == edge.name and (e.get("detail") or {}).get("check") == check
               and (e.get("detail") or {}).get("reason") == reason)


def watched_age(lab: Lab, edge: Edge) -> float | None:
    samples = lab.views[edge.name].samples
    for peer in (samples[-1]["peers"] if samples else []):
        if peer.get("watched") and peer.get("handshake_age_seconds") is not None:
            return float(peer["handshake_age_seconds"])
    return None


async def settle(lab: Lab) -> list[Expectation]:
    ups = [await lab.until(lambda e=e: tunnel_ok(lab, e), TUNNEL_UP_BUDGET,  # type: ignore[misc]
                           f"{e.name}'s tunnel to come up") for e in lab.world.edges]
    await lab.hold(grace(lab))
    return [Expectation("every tunnel up before the fault", all(ups))]


def grace(lab: Lab) -> float:
    """Seconds to hold before a fault: past the agents' startup grace (10 s in the lab,
    60 s by default) and their uplink settle time (20 s / 30 s from the direct path's
    first ok), so the fault meets an agent in its steady state."""
    return lab.scaled(20, 65)
