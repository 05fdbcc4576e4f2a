"""The agent's own Prometheus metrics (each subsystem registers its own on the same registry).

Names follow Prometheus conventions: base units (seconds, bytes), ``_total`` counters,
one ``edgeheal_`` prefix; ``promtool check metrics`` runs on the real output in CI.

The agent's own resources (:class:`SelfCollector`) are read at scrape time from
``/proc/self`` and its cgroup: resident memory, open descriptors and their limit, and the
unit's ``MemoryHigh=``/``MemoryMax=``, so a leak or a descriptor flood shows on a graph long
before the box suffers. prometheus-client's ``process_*`` family stays too, but it needs
``/proc/stat``, which the unit's ``ProcSubset=pid`` hides: under systemd it is empty.
"""

from __future__ import annotations

import os
import platform
import resource
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from edgeheal import __version__
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


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        ProcessCollector(registry=registry)
        registry.register(SelfCollector())
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
