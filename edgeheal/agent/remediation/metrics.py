"""The remediation metrics: what the ladders did (counters) and where they stand (gauges).

Why gauges read from the history at scrape time: the circuit, a pause, the streak and the
budget are persisted (:mod:`edgeheal.agent.remediation.history`) and survive an agent restart,
while counters start again at 0. An alert on "the circuit is open" written as
``increase(edgeheal_remediations_total{action="open_circuit"}[1h]) > 0`` misses a circuit
that opened before the restart and stays open; ``edgeheal_remediation_circuit_open == 1``
does not. The gauges are computed from the actor's in-memory history when Prometheus
scrapes (no copy to keep in step, nothing on disk read).

Every series carries ``ladder`` (``flannel`` today; each remediation ladder of the agent is
one actor and one label value). The counters are made once per registry and shared by the
ladders; each ladder's known (action, result) pairs exist at 0 from the start, so
``increase()`` sees the first restart, skip or opening of the circuit.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from edgeheal.boundaries.prometheus import CounterFamily
from edgeheal.core import flannel_ladder as policy
from edgeheal.core import safeguards

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

RESTART_RESULTS = ("recovered", "not_recovered", "failed", "config_problem", "dry_run",
                   "interrupted")
"""Results of a restart attempt (the actor's; ``interrupted``: the agent stopped mid-way)."""
SKIP_REASONS = ("paused", "circuit_open", "fleet_hold", "direct_path_down", "uplink_settling",
                "mode_none", "startup_grace", "cooldown", "budget_exhausted", "uplink_down",
                "local_send_failure", policy.SEND_FAILING)
"""The policy's ``skip`` reasons (:func:`edgeheal.core.flannel_ladder.decide`); a test keeps them in
step with the policy's source."""
KNOWN: tuple[tuple[str, str], ...] = (
    *(("restart", r) for r in RESTART_RESULTS),
    *(("skip", r) for r in SKIP_REASONS),
    ("open_circuit", "opened"),
    ("close_circuit", "closed"),
)
"""Every (action, result) pair the actor counts, initialised to 0 per ladder."""
DURATION_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300)


class _Counted:
    """``labels(action=, result=)`` of the shared counter with this ladder's label set."""

    def __init__(self, counter: CounterFamily, ladder: str) -> None:
        self.counter, self.ladder = counter, ladder

    def labels(self, *, action: str, result: str) -> Any:
        return self.counter.labels(ladder=self.ladder, action=action, result=result)


class _Gauges:
    """The per-ladder gauges, computed at scrape time from each actor's history (an actor
    has ``history``, ``settings`` and ``clock``)."""

    def __init__(self) -> None:
        self.ladders: dict[str, Any] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # on scrape

        circuit = GaugeMetricFamily(
            "edgeheal_remediation_circuit_open",
            "1 while the ladder's circuit is open (restarts did not cure; no more until the "
            "tunnel is healthy or `edgeheal remediation reset`); persisted across restarts.",
            labels=["ladder"])
        paused = GaugeMetricFamily(
            "edgeheal_remediation_paused",
            "1 while an operator's pause holds the ladder (`edgeheal remediation pause`).",
            labels=["ladder"])
        budget = GaugeMetricFamily(
            "edgeheal_remediation_budget_remaining",
            "Restarts the ladder may still make in the sliding hour (max_per_hour minus the "
            "attempts in the window).", labels=["ladder"])
        streak = GaugeMetricFamily(
            "edgeheal_remediation_failures_in_row",
            "Restarts in a row that did not cure (give_up_after of them open the circuit).",
            labels=["ladder"])
        for name, actor in sorted(self.ladders.items()):
            history, now = actor.history, actor.clock()
            circuit.add_metric([name], 1.0 if history.circuit_open else 0.0)
            paused.add_metric([name], 1.0 if history.paused(now) else 0.0)
            budget.add_metric([name], float(safeguards.budget_left(
                history, now, safeguards.Limits.of(actor.settings))))
            streak.add_metric([name], float(history.failures_in_row))
        yield from (circuit, paused, budget, streak)


class _Families:
    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Histogram

        self.restarts = CounterFamily(
            "edgeheal_remediations", "Remediation decisions carried out, by ladder, action "
            "(restart, skip, open_circuit, close_circuit) and result (a restart's outcome, "
            "a skip's reason).", ["ladder", "action", "result"], registry=registry)
        self.duration = Histogram(
            "edgeheal_remediation_duration_seconds",
            "Duration of a restart: remedy plus recovery verification.", ["ladder"],
            buckets=DURATION_BUCKETS, registry=registry)
        self.gauges = _Gauges()
        registry.register(self.gauges)


_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = \
    weakref.WeakKeyDictionary()


class LadderMetrics:
    """One ladder's handles: ``restarts.labels(action=, result=)``, ``duration``."""

    def __init__(self, registry: CollectorRegistry, ladder: str, actor: Any,
                 known: tuple[tuple[str, str], ...] = KNOWN) -> None:
        families = _FAMILIES.get(registry)
        if families is None:
            families = _FAMILIES[registry] = _Families(registry)
        families.gauges.ladders[ladder] = actor
        self.restarts = _Counted(families.restarts, ladder)
        self.duration = families.duration.labels(ladder=ladder)
        for action, result in known:
            self.restarts.labels(action=action, result=result)
