"""Run a lab scenario: build the world, inject the fault, watch the agent, judge, report.

The runner observes from outside, as an operator would: it polls each agent's ``/status``
and ``/metrics`` once a second (inside the edge's namespace), reads the faulty-NIC
emulator's events, the test Kubernetes API's record of deletions and Events, the alert
subscriber's log, and the collector's counters. Every change becomes a timeline entry; the
scenario's expectations are checked against these observations only, and the process exits
0 only when all of them held.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeheal.base import compat
from edgeheal.lab import nsutil
from edgeheal.lab.world import AGENT_PORT, Edge, World

log = logging.getLogger(__name__)


@dataclass
class Expectation:
    what: str
    held: bool
    evidence: str = ""


@dataclass
class EdgeView:
    """What the runner last saw of one edge."""

    states: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    actions_seen: int = 0
    nic_seen: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)


class Lab:
    """The scenario's handle on the running world, with a live timeline."""

    def __init__(self, world: World, *, out: Any = sys.stdout, live: bool = True) -> None:
        self.world = world
        self.t0 = time.monotonic()
        self.timeline: list[dict[str, Any]] = []
        self.views = {e.name: EdgeView() for e in world.edges}
        self.out, self.live = out, live
        self.marks: dict[str, float] = {}
        self.alerts_seen = 0
        self.deletions_seen = 0
        self.events_seen = 0
        self.remediation = "pod"
        self.outage = 90.0
        self.loss_seconds = 300.0
        self.flaps = 10
        self.address_loss = 60.0
        self.field = world.field
        self.k = float(world.keepalive)
        """The tunnels' persistent keepalive: 5 s in the lab, 25 s with ``--field``."""

    def scaled(self, lab: float, field: float) -> float:
        """A wait or bound: ``lab`` at the lab's tuning, ``field`` with ``--field`` (the
        shipped defaults check every 5 s, MQTT every 60 s, restart after 60 s of grace)."""
        return field if self.field else lab

    # --- time and notes ------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self.t0

    def note(self, source: str, what: str, edge: str = "", **detail: Any) -> None:
        entry = {"t": round(self.now(), 2), "source": source, "edge": edge, "what": what}
        if detail:
            entry["detail"] = detail
        self.timeline.append(entry)
        if self.live:
            where = f" {edge}" if edge else ""
            print(f"[{entry['t']:7.1f}s] {source:<6}{where}: {what}", file=self.out,
                  flush=True)

    def mark(self, name: str) -> float:
        self.marks[name] = self.now()
        return self.marks[name]

    # --- observing -----------------------------------------------------------------------

    def observe_once(self) -> None:
        for edge in self.world.edges:
            self._observe_edge(edge)
        self._observe_cloud()

    def _observe_edge(self, edge: Edge) -> None:
        view = self.views[edge.name]
        for event in self.world.nic_events(edge)[view.nic_seen:]:
            view.nic_seen += 1
            if event["event"] == "corrupted":
                self.note("nic", f"handshake type {event['type']} sent with a bad checksum "
                          "(TX offload on)", edge.name)
            elif event["event"] == "nat_mapping":
                self.note("nic", f"carrier NAT: edge {event['edge']} now leaves as "
                          f"{event['public']} (a new mapping)", edge.name)
            elif event["event"] == "offload":
                self.note("nic", f"uplink TX checksum offload is {_onoff(event['on'])}",
                          edge.name)
        if edge.agent is None:
            return
        doc = self.world.status(edge)
        if doc is None:
            if view.states.get("_agent") != "down":
                view.states["_agent"] = "down"
                self.note("agent", "not answering /status", edge.name)
            return
        if view.states.get("_agent") != "up":
            view.states["_agent"] = "up"
            self.note("agent", "serving /status", edge.name)
        for name, check in doc.get("checks", {}).items():
            state, reason = check.get("state"), check.get("reason")
            if view.states.get(name) != state or view.reasons.get(name) != reason:
                view.states[name], view.reasons[name] = state, reason
                self.note("agent", f"{name}: {state} ({reason}) {check.get('message', '')}",
                          edge.name, check=name, state=state, reason=reason)
        ready = "ready" if doc.get("ready") else "not ready"
        if view.states.get("_ready") != ready:
            view.states["_ready"] = ready
            self.note("agent", f"/readyz: {ready}", edge.name, ready=ready == "ready")
        fault = (doc.get("path") or {}).get("fault")
        if fault and view.states.get("_path") != fault:
            view.states["_path"] = fault
            self.note("agent", f"path verdict: {fault} — {doc['path'].get('message', '')}",
                      edge.name, path=fault)
        actions = doc.get("actions") or []
        for action in actions[view.actions_seen:]:
            self.note("agent", f"remediation {action.get('action')}: {action.get('result')} "
                      f"({action.get('reason')})", edge.name, **action)
        view.actions_seen = len(actions)
        view.samples.append(self._sample(edge, doc))

    def _sample(self, edge: Edge, doc: dict[str, Any]) -> dict[str, Any]:
        wg = doc.get("checks", {}).get("wireguard", {})
        peers = (wg.get("detail") or {}).get("peers") or []
        stats = self.world.collector_stats(edge)
        return {"t": round(self.now(), 2), "wireguard": wg.get("state"),
                "reason": wg.get("reason"), "ready": bool(doc.get("ready")),
                "path": (doc.get("path") or {}).get("fault"),
                "peers": [{k: p.get(k) for k in ("fingerprint", "watched", "reason",
                                                  "handshake_age_seconds", "rx_bytes",
                                                  "tx_bytes")} for p in peers],
                "checks": {n: c.get("state") for n, c in doc.get("checks", {}).items()},
                "collector": {k: stats.get(k) for k in ("sent", "delivered", "lost")}}

    def _observe_cloud(self) -> None:
        kube = self.world.kube
        if kube is not None:
            for deletion in kube.deletions[self.deletions_seen:]:
                self.deletions_seen += 1
                self.note("api", f"pod {_describe(deletion)} deleted")
            for event in kube.events[self.events_seen:]:
                self.events_seen += 1
                self.note("api", f"Event {event.get('reason')}: {event.get('message', '')}")
        alerts = self.world.alerts()
        for alert in alerts[self.alerts_seen:]:
            self.note("alert", f"{alert.get('severity')} {alert.get('kind')}: "
                      f"{alert.get('message', '')}", alert.get("node", ""))
        self.alerts_seen = len(alerts)

    # --- waiting -------------------------------------------------------------------------

    def state(self, edge: Edge, check: str) -> str | None:
        return self.views[edge.name].states.get(check)

    def reason(self, edge: Edge, check: str) -> str | None:
        return self.views[edge.name].reasons.get(check)

    async def until(self, predicate: Callable[[], bool], within: float, what: str) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            await asyncio.to_thread(self.observe_once)
            if predicate():
                return True
            await asyncio.sleep(0.5)
        self.note("lab", f"gave up waiting {within:g}s for {what}")
        return False

    async def hold(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.to_thread(self.observe_once)
            await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def first(self, edge: Edge | None, source: str, predicate: Callable[[dict[str, Any]], bool],
              after: float = 0.0) -> float | None:
        for entry in self.timeline:
            if entry["t"] < after or entry["source"] != source:
                continue
            if edge is not None and entry["edge"] != edge.name:
                continue
            if predicate(entry):
                return float(entry["t"])
        return None

    def metric(self, edge: Edge, name: str, **labels: str) -> float:
        """Sum of an agent metric's samples matching ``labels`` (0 when absent)."""
        try:
            code, body = nsutil.http_get(edge.ns, "127.0.0.1", AGENT_PORT, "/metrics")
        except OSError:
            return 0.0
        if code != 200:
            return 0.0
        total = 0.0
        for line in body.decode().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, label_text = head.partition("{")
            if metric != name:
                continue
            if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                total += float(value)
        return total


EPILOGUE = 8.0
"""Seconds the runner keeps observing after a scenario's last expectation was judged, so
the report (and its picture) shows the state the run ended in, e.g. the recovery."""
FIELD_BUDGET = 2.0
"""``--field`` multiplies a scenario's budget: K is five times the lab's, and the shipped
defaults check every 5 s, probe MQTT every 60 s and hold restarts for 60 s after start."""


@dataclass
class Scenario:
    name: str
    summary: str
    run: Callable[[Lab], Awaitable[list[Expectation]]]
    edges: int = 1
    offload_on_at_boot: bool = False
    agent: bool = True
    remediation: str = "pod"
    budget: float = 300.0
    """Seconds the scenario may take at most (the CI bound)."""
    start_agents: bool = True
    """False: the scenario starts the agents itself (e.g. after showing the fault)."""
    modem: bool = False
    """The uplinks are modems behind a stand-in ModemManager; the agents run the uplink
    check and ladder (edgeheal.lab.modems)."""
    collector_payload: int = 0
    """Bytes of each collector reading (0: the usual small one)."""
    agent_extra: str = ""
    """TOML added to every agent's config (``{wg}``: the edge's tunnel device)."""
    agent_extra_tuned: str = ""
    """TOML added after ``agent_extra`` at the lab's tuning only (not with ``--field``)."""
    uplinks: int = 1
    """2: every edge has a second uplink (the failover scenario)."""
    carrier_nat: bool = False
    """The carriers' NAT keeps stale mappings (:mod:`edgeheal.lab.carriernat`)."""
    uplink_ladder: str = ""
    """TOML keys added to the agents' ``[remediation.uplink]`` (a ``modem`` world's)."""
    k3s_agent: bool = False
    """Every edge runs the stand-in K3s agent, its agent the control check and ladder
    (:mod:`edgeheal.lab.k3s_agent`)."""


async def run_scenario(scenario: Scenario, workdir: Path, *, edges: int | None = None,
                       agent: bool | None = None, live: bool = True, quick: bool = False,
                       field: bool = False, out: Any = sys.stdout) -> dict[str, Any]:
    """Run one scenario; ``quick`` shortens the long ones (lossy 90 s, 3 flaps) for CI;
    ``field`` runs it with the field's timings (K = 25 s, the agent's shipped defaults)."""
    world = World(workdir, edges=edges or scenario.edges,
                  agent=scenario.agent if agent is None else agent,
                  offload_on_at_boot=scenario.offload_on_at_boot, field=field,
                  modem=scenario.modem, collector_payload=scenario.collector_payload,
                  agent_extra=scenario.agent_extra + (
                      "" if field else scenario.agent_extra_tuned),
                  uplinks=scenario.uplinks, carrier_nat=scenario.carrier_nat,
                  uplink_ladder=scenario.uplink_ladder, k3s_agent=scenario.k3s_agent)
    budget = scenario.budget * FIELD_BUDGET if field else scenario.budget
    lab: Lab | None = None
    began = time.monotonic()
    expectations: list[Expectation] = []
    error = ""
    try:
        await world.build()
        lab = Lab(world, out=out, live=live)
        lab.remediation = scenario.remediation
        if quick:
            lab.loss_seconds, lab.flaps = 90.0, 3
        lab.note("lab", f"world built: cloud + {len(world.edges)} edge(s), "
                 f"uplink offload {'on' if scenario.offload_on_at_boot else 'off'} at boot, "
                 f"keepalive {world.keepalive} s, agent on "
                 + ("the shipped defaults (--field)" if field else "the lab's tuning"))
        if world.with_agent and scenario.start_agents:
            for edge in world.edges:
                world.start_agent(edge, remediation=scenario.remediation)
            lab.mark("agent_started")
            lab.note("lab", "agents started")
        expectations = await asyncio.wait_for(scenario.run(lab), budget)
        await lab.hold(lab.scaled(EPILOGUE, 2 * EPILOGUE))  # the picture shows the end state
    except compat.TimeoutErrors:
        error = f"scenario exceeded its budget of {budget:g}s"
    except Exception as err:  # report it, and still tear everything down
        log.exception("scenario %s failed", scenario.name)
        error = f"{type(err).__name__}: {err}"
    finally:
        report = _report(scenario, world, lab, expectations=expectations, error=error,
                         took=time.monotonic() - began, quick=quick)
        await world.close()
    return report


def _report(scenario: Scenario, world: World, lab: Lab | None, *,
            expectations: list[Expectation], error: str, took: float,
            quick: bool) -> dict[str, Any]:
    collectors = {e.name: world.collector_stats(e) for e in world.edges}
    alerts = world.alerts()
    kinds: dict[str, int] = {}
    for alert in alerts:
        kinds[alert.get("kind", "?")] = kinds.get(alert.get("kind", "?"), 0) + 1
    ok = not error and bool(expectations) and all(e.held for e in expectations)
    return {
        "scenario": scenario.name,
        "quick": quick,
        "field": world.field,
        "keepalive": world.keepalive,
        "summary": scenario.summary,
        "passed": ok,
        "error": error,
        "duration_seconds": round(took, 1),
        "edges": len(world.edges),
        "agent": world.with_agent,
        "expectations": [{"what": e.what, "held": e.held, "evidence": e.evidence}
                         for e in expectations],
        "marks": lab.marks if lab else {},
        "alerts_received": kinds,
        "pod_deletions": [_describe(d) for d in (world.kube.deletions if world.kube else [])],
        "collector": {n: {k: s.get(k) for k in ("sent", "delivered", "lost")}
                      for n, s in collectors.items()},
        "timeline": lab.timeline if lab else [],
        "samples": {n: v.samples for n, v in lab.views.items()} if lab else {},
    }


def render_summary(report: dict[str, Any]) -> str:
    lines = ["", f"scenario {report['scenario']}"
             f"{' (--field: K = 25 s, shipped defaults)' if report.get('field') else ''}: "
             f"{'PASSED' if report['passed'] else 'FAILED'} in {report['duration_seconds']}s"]
    if report["error"]:
        lines.append(f"  error: {report['error']}")
    for key, value in report.get("marks", {}).items():
        lines.append(f"  {key.replace('_', ' ')}: {value:.1f}s")
    lines.append(f"  pod deletions: {len(report['pod_deletions'])}"
                 + (f" ({', '.join(report['pod_deletions'])})" if report["pod_deletions"]
                    else ""))
    lines.append("  alerts received: " + (", ".join(
        f"{k} x{v}" for k, v in sorted(report["alerts_received"].items())) or "none"))
    for name, stats in report["collector"].items():
        lines.append(f"  collector {name}: sent {stats.get('sent')}, delivered "
                     f"{stats.get('delivered')}, lost {stats.get('lost')}")
    for exp in report["expectations"]:
        lines.append(f"  [{'ok' if exp['held'] else 'FAIL'}] {exp['what']}"
                     + (f" — {exp['evidence']}" if exp["evidence"] else ""))
    return "\n".join(lines)


def write_report(report: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(report, indent=2, default=str))


def _describe(deletion: Any) -> str:
    if isinstance(deletion, dict):
        meta = deletion.get("metadata", deletion)
        node = (deletion.get("spec") or {}).get("nodeName", "")
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        return f"{name} on {node}" if node else name
    return str(deletion)


def _onoff(value: object) -> str:
    if value is None:
        return "unknown (interface gone)"
    return "on" if value else "off"
