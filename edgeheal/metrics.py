"""The agent's own Prometheus metrics (each subsystem registers its own on the same registry).

Names follow Prometheus conventions: base units (seconds, bytes), ``_total`` counters,
one ``edgeheal_`` prefix; ``promtool check metrics`` runs on the real output in CI.
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.process_collector import ProcessCollector

from edgeheal import __version__
from edgeheal.model import CheckStatus, State


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        ProcessCollector(registry=registry)
        build = Info("edgeheal_build", "edgeheal version and Python it runs on.",
                     registry=registry)
        build.info({"version": __version__, "python": platform.python_version()})
        self.state = Gauge(
            "edgeheal_check_state",
            "Effective (debounced) state of each check: 1 for the current state, 0 otherwise.",
            ["check", "state"], registry=registry)
        self.duration = Gauge(
            "edgeheal_check_duration_seconds", "Duration of the check's latest run.",
            ["check"], registry=registry)
        self.runs = Counter(
            "edgeheal_check_runs",
            "Check runs by outcome of the run itself: completed (a result, whatever its "
            "state), timeout, error (the check raised).",
            ["check", "result"], registry=registry)

    def observe_run(self, check: str, status: CheckStatus, duration: float,
                    outcome: str) -> None:
        for state in State:
            self.state.labels(check=check, state=state.value).set(
                1.0 if status.state is state else 0.0)
        self.duration.labels(check=check).set(duration)
        self.runs.labels(check=check, result=outcome).inc()
