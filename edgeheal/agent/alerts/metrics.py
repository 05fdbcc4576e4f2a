"""The alert engine's metric families, declared in one place.

Why apart from the engine: the families are part of the operator's contract (the golden
/metrics file pins them, in this order of registration), while the engine's job is moving
alerts; here they are declared, every label pre-created at zero (a dashboard sees "no
drops" rather than no series), and refreshed from figures the engine reads off the outbox
(this module never touches the outbox itself).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

from edgeheal.agent.alerts import kinds
from edgeheal.agent.alerts.outbox import FAULTS
from edgeheal.boundaries.prometheus import CounterFamily

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

DROP_REASONS = ("outbox_max_count", "outbox_max_age", "memory_queue", "outbox_corrupt",
                "shutdown")
"""Why undelivered alerts are lost (``edgeheal_alerts_dropped_total{reason}``): the
``detail.bound`` of the ``alerts.dropped`` alert, and ``shutdown`` (alerts held in memory
when the agent stopped: nothing is left to report them but the log and this counter)."""


class AlertMetrics:
    def __init__(self, registry: CollectorRegistry, *, wall: Callable[[], datetime]) -> None:
        self._wall = wall
        self.raised = CounterFamily("edgeheal_alerts_raised", "Alerts raised, by kind.",
                                    ["kind"], registry=registry)
        for kind in kinds.KINDS:
            self.raised.labels(kind=kind)
        self.published = Counter("edgeheal_alerts_published",
                                 "Alerts acknowledged by the broker (PUBACK).",
                                 registry=registry)
        self.depth = Gauge("edgeheal_alerts_outbox_depth",
                           "Alerts in the durable outbox, not yet acknowledged.",
                           registry=registry)
        self._oldest: float | None = None
        """Wall-clock time the oldest queued alert was raised (None: the outbox is empty),
        set by :meth:`refresh`; its age is computed at scrape time."""
        self.oldest = Gauge("edgeheal_alerts_outbox_oldest_age_seconds",
                            "Age of the oldest alert not yet acknowledged by the broker "
                            "(wall clock, like the outbox's age bound); 0 when the "
                            "outbox is empty.", registry=registry)
        self.oldest.set_function(self._oldest_age)
        self.dropped = CounterFamily(
            "edgeheal_alerts_dropped", "Undelivered alerts lost, by reason: outbox_max_count "
            "and outbox_max_age (the outbox's bounds), memory_queue (the outbox could not be "
            "written and the memory queue was full), outbox_corrupt (the file was moved "
            "aside), shutdown (held in memory when the agent stopped).", ["reason"],
            registry=registry)
        for reason in DROP_REASONS:
            self.dropped.labels(reason=reason)
        self.fault = Gauge("edgeheal_alerts_outbox_fault",
                           "1 for the fault that keeps the outbox database from being "
                           "written (alerts are held in memory meanwhile), else 0.",
                           ["fault"], registry=registry)
        self.memory = Gauge("edgeheal_alerts_memory_queue",
                            "Alerts held in memory because the outbox database cannot "
                            "be written.", registry=registry)
        self.taken_over = Counter(
            "edgeheal_alerts_session_taken_over", "Connections to the alert broker it ended "
            "because another client connected with our client id (MQTT 5 DISCONNECT 0x8E, "
            "or a clean close by the broker after CONNACK).",
            registry=registry)
        self.duplicate = Gauge(
            "edgeheal_alerts_duplicate_client_id", "1 while another client uses this "
            "agent's client id on the alert broker (session takeovers, repeatedly: two "
            "agents with one node_name), else 0.", registry=registry)

    def refresh(self, *, depth: int, oldest_raised: float | None, memory_depth: int,
                fault: str | None) -> None:
        """The outbox gauges, from the outbox's figures."""
        self.depth.set(depth)
        self._oldest = oldest_raised
        self.memory.set(memory_depth)
        for name in FAULTS:
            self.fault.labels(fault=name).set(1 if fault == name else 0)

    def _oldest_age(self) -> float:
        if self._oldest is None:
            return 0.0
        return max(0.0, self._wall().timestamp() - self._oldest)
