"""The enforcer's metrics: which features are on, and how often one was switched back off.

Why apart: the series follow interfaces that come, go and are renamed under the enforcer, so
their bookkeeping (create at 0, move on a rename, drop on removal) is a job of its own; the
enforcer (:mod:`.enforcer`) only says what happened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from edgeheal.checks.offload.plan import InterfaceReport

Cause = Literal["boot", "link_event", "recheck"]
"""Why a pass ran: the ``cause`` label of the corrections."""
CAUSES: tuple[Cause, ...] = ("boot", "link_event", "recheck")


class Metrics:
    """``edgeheal_offload_feature_enabled`` and ``edgeheal_offload_corrections_total``.

    The corrections of an interface exist at 0 for every cause from the pass that first
    finds it (the interface is not known before: the configuration holds globs), so
    ``increase()`` sees its first correction; a rename moves them with the counts."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge

        self.enabled = Gauge(
            "edgeheal_offload_feature_enabled",
            "1 while a configured offload feature is on for a matching interface, else 0.",
            ["interface", "feature"], registry=registry)
        self.corrections = Counter(
            "edgeheal_offload_corrections_total",
            "Offload features switched back off, by interface and cause "
            "(boot, link_event, recheck).", ["interface", "cause"], registry=registry)
        self._series: dict[tuple[str, str], int] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._known: set[str] = set()
        """Interfaces whose corrections exist (at 0 at least)."""

    def _know(self, interface: str) -> None:
        if interface not in self._known:
            self._known.add(interface)
            for cause in CAUSES:
                self.corrections.labels(interface, cause)

    def publish(self, report: InterfaceReport) -> None:
        self._know(report.interface)
        for r in report.results:
            state = r.after if r.after is not None else r.before
            if state is None:
                self._drop((report.interface, r.feature))
                continue
            self._set((report.interface, r.feature), 1 if state.on else 0)

    def corrected(self, interface: str, cause: Cause) -> None:
        self._know(interface)
        self.corrections.labels(interface, cause).inc()
        self._counts[(interface, cause)] = self._counts.get((interface, cause), 0) + 1

    def rename(self, old: str, new: str) -> None:
        """Move every series of interface ``old`` to ``new`` (a udev rename)."""
        for key in [k for k in self._series if k[0] == old]:
            value = self._series[key]
            self._drop(key)
            self._set((new, key[1]), value)
        for key in [k for k in self._counts if k[0] == old]:
            count = self._counts.pop(key)
            self.corrections.remove(*key)
            self.corrections.labels(new, key[1]).inc(count)
            self._counts[(new, key[1])] = self._counts.get((new, key[1]), 0) + count
        if old in self._known:
            self._known.discard(old)
            for cause in CAUSES:
                self.corrections.remove(old, cause)
            self._know(new)

    def forget(self, interface: str) -> None:
        for key in [k for k in self._series if k[0] == interface]:
            self._drop(key)

    def _set(self, key: tuple[str, str], value: int) -> None:
        self.enabled.labels(*key).set(value)
        self._series[key] = value

    def _drop(self, key: tuple[str, str]) -> None:
        if self._series.pop(key, None) is not None:
            self.enabled.remove(*key)

