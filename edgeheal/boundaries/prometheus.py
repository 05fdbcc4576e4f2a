"""The agent's own Prometheus metrics (each subsystem registers its own on the same registry).

Names follow Prometheus conventions: base units (seconds, bytes), ``_total`` counters,
one ``edgeheal_`` prefix; ``promtool check metrics`` runs on the real output in CI, and a
golden file (``tests/agent/golden/metrics.txt``, listed in ``docs/metrics.md``) fails the
tests on any rename. Written for alerting: no ``*_created`` series; every labelled counter
exists at 0 for its known label values (``increase()`` cannot see a first occurrence that
creates the series); labels stay bounded (a check's reason comes from its registration's
closed table, anything else is ``other``); the check duration is a histogram, because a
last-value gauge hides every run between two scrapes.

The agent's own resources (:class:`SelfCollector`) are read at scrape time from
``/proc/self`` and its cgroup: resident memory, open descriptors and their limit, and the
unit's ``MemoryHigh=``/``MemoryMax=``, so a leak or a descriptor flood shows on a graph long
before the box suffers. prometheus-client's ``process_*`` family stays too, but it needs
``/proc/stat``, which the unit's ``ProcSubset=pid`` hides: under systemd it is empty.

**Collectors run on the render thread** (:class:`Scrape`, :mod:`edgeheal.base.render`),
while the event loop keeps changing what they read. A collector therefore reads state that
is replaced whole (an immutable tuple or snapshot, taken once into a local) or copies a
mutable container in one step (``dict(values)``, ``sorted(d.items())``: one C call, which
the loop cannot interleave), never iterates a live dict or list in a Python loop.
"""

from __future__ import annotations

import asyncio
import os
import platform
import resource
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from edgeheal import __version__
from edgeheal.base.render import Renderer
from edgeheal.model import CheckStatus, State

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _cgroup_files(proc: Path = Path("/proc/self/cgroup"),
                  root: Path = Path("/sys/fs/cgroup")) -> dict[str, Path]:
    """limit name -> the file holding it for our cgroup (v2: memory.high and memory.max;
    v1: memory.limit_in_bytes as max). Empty when there is no cgroup to read."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            base = root / path.lstrip("/")
            if (base / "memory.max").exists():
                return {"high": base / "memory.high", "max": base / "memory.max"}
        elif "memory" in controllers.split(","):
            limit = root / "memory" / path.lstrip("/") / "memory.limit_in_bytes"
            if limit.exists():
                return {"max": limit}
    return {}


class SelfCollector(Collector):
    """The agent's own resident memory, descriptors and memory limits, read per scrape
    (a few small reads of ``/proc/self`` and the cgroup; no subprocess)."""

    def __init__(self, proc: Path = Path("/proc/self"),
                 cgroup: dict[str, Path] | None = None) -> None:
        self.proc = proc
        self.cgroup = _cgroup_files() if cgroup is None else cgroup

    def collect(self) -> Iterator[Metric]:
        try:
            pages = int((self.proc / "statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            pass
        else:
            yield GaugeMetricFamily(
                "edgeheal_resident_memory_bytes",
                "Resident set size of the agent process (/proc/self/statm).",
                value=pages * _PAGE)
        try:
            fds = len(os.listdir(self.proc / "fd"))
        except OSError:
            pass
        else:
            yield GaugeMetricFamily("edgeheal_open_fds",
                                    "File descriptors the agent has open.", value=fds)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft != resource.RLIM_INFINITY:
            yield GaugeMetricFamily("edgeheal_max_fds",
                                    "The agent's soft RLIMIT_NOFILE (LimitNOFILE=).",
                                    value=soft)
        limits = GaugeMetricFamily(
            "edgeheal_memory_limit_bytes",
            "Memory limits of the agent's cgroup (MemoryHigh=, MemoryMax=); absent when "
            "unlimited.", labels=["limit"])
        for name, path in self.cgroup.items():
            try:
                text = path.read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < 2**62:  # v1 says "unlimited" with a huge number
                limits.add_metric([name], int(text))
        yield limits


class _Inc:
    __slots__ = ("key", "values")

    def __init__(self, values: dict[tuple[str, ...], float], key: tuple[str, ...]) -> None:
        self.values, self.key = values, key

    def inc(self, amount: float = 1.0) -> None:
        self.values[self.key] += amount


class CounterFamily(Collector):
    """A labelled counter kept as plain numbers and rendered at scrape time.

    Why not prometheus-client's ``Counter``: each of its label sets is an object with its
    own lock (about 600 bytes), and every known label set is created at 0 up front (alert
    kinds, remediation outcomes, run results), which is many; here a series is a dict
    entry. The same ``labels(...).inc(n)`` calls, on the event loop; :meth:`collect` (on the
    render thread) copies the values first."""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str],
                 registry: CollectorRegistry | None = None) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str, **named: str) -> _Inc:
        """The series for these label values, created at 0 if new."""
        key = values if values else tuple(named[n] for n in self.labelnames)
        self.values.setdefault(key, 0.0)
        return _Inc(self.values, key)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, value in dict(self.values).items():  # one step: the loop adds series
            family.add_metric(key, value)
        yield family


SUPERVISOR_REASONS = ("pending", "check_error", "check_timeout")
"""Reasons the supervisor gives any check, beyond the check's own table: no result yet
(:func:`edgeheal.core.debounce.initial`), the run raised, the run timed out
(:mod:`edgeheal.agent.supervisor`)."""
OTHER = "other"
"""The ``reason`` label of a reason no table declares (a bug: the tables are closed), so
the label stays bounded whatever a check returns."""
RUN_RESULTS = ("completed", "timeout", "error")
DURATION_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Check durations: counter reads take milliseconds, an MQTT probe over 4G up to seconds,
a timeout is at most 600 s (the ``+Inf`` bucket)."""


class _CheckCollector(Collector):
    """``edgeheal_check_state`` and ``edgeheal_check_reason``, rendered at scrape time from
    the last status of each check (no per-series objects kept between scrapes)."""

    def __init__(self) -> None:
        self.reasons: dict[str, tuple[str, ...]] = {}
        self.current: dict[str, tuple[State, str]] = {}

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "edgeheal_check_state",
            "Effective (debounced) state of each check: 1 for the current state, 0 for the "
            "others.", labels=["check", "state"])
        reason = GaugeMetricFamily(
            "edgeheal_check_reason",
            "Effective (debounced) reason of each check: 1 for the current reason, 0 for the "
            "other reasons of the check's closed table (other: a reason no table declares).",
            labels=["check", "reason"])
        for check, (now_state, now_reason) in sorted(self.current.items()):
            for value in State:
                state.add_metric([check, value.value], 1.0 if value is now_state else 0.0)
            known = self.reasons.get(check, SUPERVISOR_REASONS)
            shown = now_reason if now_reason in known else OTHER
            for name in (*known, OTHER):
                reason.add_metric([check, name], 1.0 if name == shown else 0.0)
        yield state
        yield reason


class AgentMetrics:
    """The supervisor's metrics: build info, each check's state, reason, duration and runs.

    Created first on the agent's registry, it also turns prometheus-client's ``*_created``
    series off (process-wide; read at scrape time): Unix timestamps per counter that no
    rule uses, doubling every counter's series."""

    def __init__(self, registry: CollectorRegistry) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]
        ProcessCollector(registry=registry)
        registry.register(SelfCollector())
        build = Info("edgeheal_build", "edgeheal version and Python it runs on.",
                     registry=registry)
        build.info({"version": __version__, "python": platform.python_version()})
        self.checks = _CheckCollector()
        registry.register(self.checks)
        self.duration = Histogram(
            "edgeheal_check_duration_seconds", "Duration of each check run, seconds.",
            ["check"], buckets=DURATION_BUCKETS, registry=registry)
        self.runs = CounterFamily(
            "edgeheal_check_runs",
            "Check runs by outcome of the run itself: completed (a result, whatever its "
            "state), timeout, error (the check raised).",
            ["check", "result"], registry=registry)

    def declare(self, status: CheckStatus, reasons: Iterable[str]) -> None:
        """A check the agent runs, with its closed reason table: its series exist, at 0,
        before its first run (so ``increase()`` sees the first timeout or error)."""
        check = status.name
        self.checks.reasons[check] = tuple(dict.fromkeys((*reasons, *SUPERVISOR_REASONS)))
        self.checks.current[check] = (status.state, status.reason)
        self.duration.labels(check=check)
        for result in RUN_RESULTS:
            self.runs.labels(check=check, result=result)

    def observe_run(self, check: str, status: CheckStatus, duration: float,
                    outcome: str) -> None:
        self.checks.current[check] = (status.state, status.reason)
        self.duration.labels(check=check).observe(duration)
        self.runs.labels(check=check, result=outcome).inc()


SCRAPE_TTL = 1.0
"""Seconds a rendered ``/metrics`` body is served again to the scrapers that follow (at
least as long as the render took, so renders occupy at most half the time whatever the
number of scrapers). Prometheus scrapes every 15 s or more: nobody sees the difference."""


class Scrape:
    """The ``/metrics`` body, rendered off the loop: on :class:`Renderer`'s thread, one
    render at a time, shared by every scraper that asks while it runs or within
    :data:`SCRAPE_TTL` after (then dropped, so a 5,000-peer body is not kept between
    scrapes). Byte for byte what ``generate_latest(registry)`` returns."""

    def __init__(self, registry: CollectorRegistry, renderer: Renderer) -> None:
        self.registry, self.renderer = registry, renderer
        self._body: bytes | None = None
        self._fresh_until = 0.0
        self._drop: asyncio.TimerHandle | None = None

    async def body(self) -> bytes:
        loop = asyncio.get_running_loop()
        began = loop.time()
        if self._body is not None and began < self._fresh_until:
            return self._body
        body = await self.renderer.render("metrics", self._render)
        done = loop.time()
        if done >= self._fresh_until:  # the first of the callers sharing this render
            self._body, self._fresh_until = body, done + max(SCRAPE_TTL, done - began)
            if self._drop is not None:
                self._drop.cancel()
            self._drop = loop.call_at(self._fresh_until, self._forget)
        return body

    def _render(self) -> bytes:
        return generate_latest(self.registry)

    def _forget(self) -> None:
        self._body, self._drop = None, None

    def close(self) -> None:
        if self._drop is not None:
            self._drop.cancel()
        self._forget()
