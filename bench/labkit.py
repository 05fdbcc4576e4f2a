"""Shared pieces of the lab benchmarks: a world with bench knobs, probes and samplers.

Why a subclass and not a lab change: the benchmarks need two knobs the lab does not offer
(an agent that does not enforce offload, so the incident's fault can be injected on a
running edge; and an agent on the *default* cadences, for the footprint and the probing
bytes), plus outside observers the lab does not need (a traffic probe through the tunnel,
/proc sampling, nft byte counters). All of it lives here, in bench/, and every world is
closed in a ``finally``. The config text itself is the lab's
(:mod:`edgeheal.lab.agent_config`), so a benchmark runs the agent a scenario runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeheal.base import compat
from edgeheal.lab import nsutil
from edgeheal.lab.agent_config import render as render_agent_config
from edgeheal.lab.netns import run
from edgeheal.lab.world import AGENT_PORT, BROKER_CLUSTER_IP, Edge, World

WG_FRAMING = 75
"""Bytes a tunnelled packet costs on the uplink beyond its inner size, upper bound:
outer IPv4 + UDP (28), WireGuard header + tag (32), padding to 16 bytes (at most 15)."""


class BenchWorld(World):
    """The lab world, with the agent's offload enforcement switchable and an optional
    config on the default cadences (only addresses and paths set)."""

    def __init__(self, workdir: Path, *, enforce: bool = True, defaults: bool = False,
                 uplink_off: frozenset[str] = frozenset(), **kw: Any) -> None:
        super().__init__(workdir, **kw)
        self.enforce = enforce
        self.defaults = defaults
        self.uplink_off = uplink_off
        """Edges whose default config has no uplink sections, in a world built with modems
        (bench/uplink_cost.py: the feature on and off side by side)."""

    def agent_config(self, edge: Edge, *, remediation: str = "pod", extra: str = "") -> str:
        if self.defaults:  # the shipped defaults, with no extra
            text = render_agent_config(
                edge, mqtt_port=self.mqtt_port, shipped=True, remediation=remediation,
                uplink=self.modem and edge.name not in self.uplink_off)
        else:
            text = super().agent_config(edge, remediation=remediation, extra=extra)
        if not self.enforce:
            text = text.replace("[offload]\n", "[offload]\nenforce = false\n", 1)
        return text


# --- observing an agent from outside ------------------------------------------------------

@dataclass
class Sample:
    mono: float
    wall: float
    checks: dict[str, tuple[str, str]]
    age: float | None
    actions: list[dict[str, Any]]
    uptime: float


def status(world: World, edge: Edge) -> dict[str, Any] | None:
    return world.status(edge)


def watched_age(doc: dict[str, Any]) -> float | None:
    wg = doc.get("checks", {}).get("wireguard", {})
    for peer in (wg.get("detail") or {}).get("peers") or []:
        if peer.get("watched") and peer.get("handshake_age_seconds") is not None:
            return float(peer["handshake_age_seconds"])
    return None


@dataclass
class Recorder:
    """Polls one agent's /status every ``period`` seconds in a thread; keeps every sample."""

    world: World
    edge: Edge
    period: float = 0.25
    samples: list[Sample] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> Recorder:
        self._task = asyncio.create_task(self._loop(), name=f"bench.recorder.{self.edge.name}")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            began = time.monotonic()
            doc = await asyncio.to_thread(self.world.status, self.edge)
            if doc is not None:
                self.samples.append(Sample(
                    mono=time.monotonic(), wall=time.time(),
                    checks={n: (c.get("state", ""), c.get("reason", ""))
                            for n, c in doc.get("checks", {}).items()},
                    age=watched_age(doc), actions=list(doc.get("actions") or []),
                    uptime=float(doc.get("uptime_seconds") or 0.0)))
            await asyncio.sleep(max(0.0, self.period - (time.monotonic() - began)))

    @property
    def last(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def wg(self) -> tuple[str, str]:
        last = self.last
        return last.checks.get("wireguard", ("", "")) if last else ("", "")

    async def until(self, predicate: Callable[[Sample], bool], within: float,
                    what: str, after: float = 0.0) -> Sample:
        """The first sample taken after ``after`` (monotonic) that satisfies ``predicate``."""
        deadline = time.monotonic() + within
        seen = 0
        while time.monotonic() < deadline:
            for sample in self.samples[seen:]:
                seen += 1
                if sample.mono >= after and predicate(sample):
                    return sample
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{self.edge.name}: no {what} within {within:g}s")

    def last_handshake(self, before: float) -> float | None:
        """Monotonic time of the watched peer's last handshake, from the last sample
        taken before ``before``."""
        for sample in reversed(self.samples):
            if sample.mono <= before and sample.age is not None:
                return sample.mono - sample.age
        return None


def wg_is(state: str, *reasons: str) -> Callable[[Sample], bool]:
    def predicate(sample: Sample) -> bool:
        got = sample.checks.get("wireguard", ("", ""))
        return got[0] == state and (not reasons or got[1] in reasons)
    return predicate


def wall_after(moment: float) -> Callable[[Sample], bool]:
    return lambda sample: sample.wall > moment


# --- traffic through the tunnel ------------------------------------------------------------

def tunnel_open(ns: str, host: str, port: int, timeout: float = 0.5) -> bool:
    """Does a TCP connection to the broker's cluster address (only the tunnel routes it)
    open from inside the edge? That is "traffic flows" as a workload sees it."""
    with nsutil.inside(ns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((host, port))
    except OSError:
        return False
    else:
        return True
    finally:
        sock.close()


@dataclass
class TunnelProbe:
    """Runs :func:`tunnel_open` every ``period`` seconds; keeps (wall, mono, ok)."""

    ns: str
    port: int
    host: str = BROKER_CLUSTER_IP
    period: float = 0.5
    timeout: float = 0.5
    results: list[tuple[float, float, bool]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> TunnelProbe:
        self._task = asyncio.create_task(self._loop(), name=f"bench.probe.{self.ns}")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            began = time.monotonic()
            ok = await asyncio.to_thread(tunnel_open, self.ns, self.host, self.port,
                                         self.timeout)
            self.results.append((time.time(), began, ok))
            await asyncio.sleep(max(0.0, self.period - (time.monotonic() - began)))

    def first_ok(self, after_wall: float) -> float | None:
        return next((w for w, _, ok in self.results if ok and w >= after_wall), None)

    def outage_seconds(self, start_wall: float, end_wall: float) -> float:
        """Seconds in [start, end] covered by failed probes (each holds until the next)."""
        total = 0.0
        rows = [r for r in self.results if start_wall <= r[0] <= end_wall]
        for (wall, _, ok), nxt in zip(rows, [*rows[1:], (end_wall, 0.0, True)], strict=True):
            if not ok:
                total += nxt[0] - wall
        return total


# --- processes -----------------------------------------------------------------------------

def _kb(text: str, name: str) -> int:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


def proc_sample(pid: int) -> dict[str, float]:
    """RSS and PSS (MB) and CPU seconds (user + system) of one process."""
    proc = Path(f"/proc/{pid}")
    stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {"mono": time.monotonic(),
            "rss_mb": _kb((proc / "status").read_text(), "VmRSS") / 1024,
            "pss_mb": _kb((proc / "smaps_rollup").read_text(), "Pss") / 1024,
            "cpu_seconds": (int(stat[11]) + int(stat[12])) / ticks}


def agent_pid(edge: Edge) -> int:
    """The pid of the edge's ``edgeheal run`` (``ip netns exec`` execs, so it is Popen's)."""
    pid = int(edge.agent.pid)
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if b"edgeheal" not in cmdline or b"run" not in cmdline:
        raise RuntimeError(f"pid {pid} is not an edgeheal agent: {cmdline!r}")
    return pid


def cpu_percent(first: dict[str, float], last: dict[str, float]) -> float:
    return (last["cpu_seconds"] - first["cpu_seconds"]) / (last["mono"] - first["mono"]) * 100


# --- nftables byte counters ----------------------------------------------------------------

def count_uplink(world: World, edge: Edge) -> None:
    """Named counters in the edge: the uplink's non-tunnel traffic (direct MQTT, alerts,
    the Kubernetes API), the tunnel's inner traffic, and the tunnel's own UDP."""
    up, wg, port = edge.uplink, edge.wg_ifname, 51820
    world.sandbox.nft(edge.ns, f"""
table inet ehbench {{
  counter direct_out {{}}
  counter direct_in {{}}
  counter inner_out {{}}
  counter inner_in {{}}
  counter wg_udp {{}}
  chain out {{
    type filter hook output priority 0; policy accept;
    oifname "{up}" udp dport {port} counter name wg_udp accept
    oifname "{up}" counter name direct_out
    oifname "{wg}" counter name inner_out
  }}
  chain inp {{
    type filter hook input priority 0; policy accept;
    iifname "{up}" udp sport {port} counter name wg_udp accept
    iifname "{up}" counter name direct_in
    iifname "{wg}" counter name inner_in
  }}
}}
""")


def read_counters(edge: Edge) -> dict[str, tuple[int, int]]:
    """name -> (packets, bytes)."""
    out = run(["nft", "-j", "list", "counters", "table", "inet", "ehbench"], ns=edge.ns).stdout
    result = {}
    for item in json.loads(out).get("nftables", []):
        counter = item.get("counter")
        if counter:
            result[counter["name"]] = (int(counter["packets"]), int(counter["bytes"]))
    return result


# --- small statistics ----------------------------------------------------------------------

def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


def agent_port() -> int:
    return AGENT_PORT


def dump(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2, default=str))


def run_bench(name: str, measure: Callable[[Path], Coroutine[Any, Any, dict[str, Any]]],
              out: Path) -> int:
    """Run one benchmark in a fresh work directory and write its JSON to ``out``: the
    figures with ``ok`` true, or the error with the logs kept (exit 1)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"edgeheal-bench-{name}-"))
    try:
        doc = asyncio.run(measure(workdir))
        doc["ok"] = True
    except (*compat.TimeoutErrors, RuntimeError, OSError, KeyError) as err:
        doc = {"ok": False, "error": f"{type(err).__name__}: {err}", "workdir": str(workdir)}
        dump(out, doc)
        print(f"{name}: {doc['error']} (logs kept in {workdir})", file=sys.stderr)
        return 1
    dump(out, doc)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0
