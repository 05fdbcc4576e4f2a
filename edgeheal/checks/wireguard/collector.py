"""The check's per-peer rows (``detail.peers``) and its Prometheus collector.

Metrics: per peer, ``edgeheal_wireguard_handshake_age_seconds``, ``..._receive_bytes_total``,
``..._transmit_bytes_total`` and ``..._peer_state{state}``, labelled ``interface``, ``peer``
(the key's first 8 characters) and ``watched``; only the watched peers unless
``[metrics] all_peers = true`` (a full mesh is N-1 peers on every node).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeheal.boundaries.wg.health import REASONS
from edgeheal.model import State

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


@dataclass(frozen=True, slots=True)
class PeerView:
    """One peer's row in ``detail`` and in the metrics."""

    interface: str
    peer: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    handshake_age: float | None
    rx_bytes: int
    tx_bytes: int
    keepalive: int
    watched: bool
    reason: str
    message: str
    suspicion: tuple[str, str] | None = None
    send_failure: dict[str, Any] | None = None

    @property
    def state(self) -> State:
        return REASONS[self.reason]

    def to_json(self) -> dict[str, Any]:
        return {
            "interface": self.interface, "peer": self.peer, "endpoint": self.endpoint,
            "allowed_ips": list(self.allowed_ips),
            "handshake_age_seconds": (None if self.handshake_age is None
                                      else round(self.handshake_age, 1)),
            "rx_bytes": self.rx_bytes, "tx_bytes": self.tx_bytes,
            "persistent_keepalive": self.keepalive, "watched": self.watched,
            "reason": self.reason, "state": self.state.value, "message": self.message,
            "suspect": self.suspicion is not None,
            "suspicion": None if self.suspicion is None else {
                "signal": self.suspicion[0], "message": self.suspicion[1]},
            **({"send_failure": self.send_failure} if self.send_failure is not None else {}),
        }


def collect(views: Iterable[PeerView], *, all_peers: bool) -> Iterator[Metric]:
    """The per-peer metric families (only on scrape: prometheus_client is imported here)."""
    from prometheus_client.core import (  # only on scrape
        CounterMetricFamily,
        GaugeMetricFamily,
    )

    labels = ["interface", "peer", "watched"]
    age = GaugeMetricFamily(
        "edgeheal_wireguard_handshake_age_seconds",
        "Seconds since the peer's latest handshake (monotonic; absent: never).", labels=labels)
    rx = CounterMetricFamily("edgeheal_wireguard_receive_bytes",
                             "Bytes received from the peer, as the device counts them.",
                             labels=labels)
    tx = CounterMetricFamily("edgeheal_wireguard_transmit_bytes",
                             "Bytes sent to the peer, as the device counts them.",
                             labels=labels)
    st = GaugeMetricFamily("edgeheal_wireguard_peer_state",
                           "1 for the peer's current state, 0 for the others.",
                           labels=[*labels, "state"])
    every = all_peers
    for v in views:
        if not (v.watched or every):
            continue  # the rest of Flannel's mesh: in /status, not in the metrics
        key = [v.interface, v.peer, "true" if v.watched else "false"]
        if v.handshake_age is not None:
            age.add_metric(key, v.handshake_age)
        rx.add_metric(key, float(v.rx_bytes))
        tx.add_metric(key, float(v.tx_bytes))
        for state in State:
            st.add_metric([*key, state.value], 1.0 if v.state is state else 0.0)
    yield from (age, rx, tx, st)
