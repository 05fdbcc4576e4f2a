"""A real Prometheus server scrapes a lab edge through the stuck-Flannel scenario.

Why: the promtool unit tests (test_rules.py) prove the rules against series written by
hand; this proves them against the agent. Prometheus (the Debian package, installed by
``install.sh --dev``) runs inside the edge's network namespace, on its loopback, on a port
chosen for this run, with a temporary data directory; it scrapes the agent's ``/metrics``
every second and evaluates the *shipped* rule files every second. The one change to them:
every ``for:`` is set to 0 (in the lab the agent restarts Flannel within seconds of the
fault, so the tunnel is failed for only a few seconds; the shipped 2-minute ``for:`` would
need a fault that lasts minutes and would prove nothing more: the unit tests hold the real
durations). Scrapes and evaluations run every 0.5 s. The test reads Prometheus's own HTTP
API: the rules loaded and healthy (``/api/v1/rules``); ``EdgehealTunnelFailed`` firing
after the fault and before the recovery, with the check's reason as its label (its
``ALERTS`` series, ``/api/v1/query_range``: every evaluation, not a poller's sample); and
no longer active once the agent has restarted Flannel and the tunnel is ok
(``/api/v1/alerts``).

Everything runs in the lab world's sandbox (namespaces, processes, Prometheus included), so
it is killed and removed even when the test fails.
"""

from __future__ import annotations

import asyncio
import io
import shutil
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml  # type: ignore[import-untyped]

from edgeheal.lab import nsutil
from edgeheal.lab.runner import Lab
from edgeheal.lab.scenarios import stuck_flannel
from edgeheal.lab.world import AGENT_PORT, World

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ALERT = "EdgehealTunnelFailed"
SHORT_FOR = "0s"
STEP = 0.5
"""Seconds between scrapes, between rule evaluations and between points read back."""

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="prometheus not installed (install.sh --dev)")]


def _shortened_rules(into: Path) -> list[str]:
    """The shipped rule files with every ``for:`` set to :data:`SHORT_FOR`."""
    out = []
    for source in sorted((ROOT / "monitoring").glob("*.yaml")):
        doc = yaml.safe_load(source.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = SHORT_FOR
        target = into / source.name
        target.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(str(target))
    return out


def _free_port(ns: str) -> int:
    with nsutil.inside(ns):
        sock = socket.socket()
    with sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _api(ns: str, port: int, path: str) -> dict[str, Any] | None:
    try:
        status, doc = nsutil.get_json(ns, "127.0.0.1", port, path, 2.0)
    except OSError:
        return None
    return doc if status == 200 and isinstance(doc, dict) else None


def _firing_series(ns: str, port: int, start: float, end: float,
                   ) -> list[tuple[float, dict[str, str]]]:
    """(time, labels) of every evaluation at which :data:`ALERT` was firing, from
    Prometheus's own ``ALERTS`` series (wall-clock seconds)."""
    query = f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}'
    doc = _api(ns, port, f"/api/v1/query_range?query={quote(query)}&start={start:.3f}"
                         f"&end={end:.3f}&step={STEP}")
    assert doc is not None, "prometheus did not answer the range query"
    assert doc["status"] == "success", doc
    return sorted((float(ts), series["metric"]) for series in doc["data"]["result"]
                  for ts, _ in series["values"])


def _active(ns: str, port: int) -> list[dict[str, Any]]:
    doc = _api(ns, port, "/api/v1/alerts")
    assert doc is not None, "prometheus stopped answering /api/v1/alerts"
    return [a for a in doc["data"]["alerts"] if a["labels"].get("alertname") == ALERT]


async def _rules_loaded(ns: str, port: int, server: Any) -> dict[str, Any] | None:
    """/api/v1/rules once every rule has been evaluated at least once (within 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and server.poll() is None:
        doc = await asyncio.to_thread(_api, ns, port, "/api/v1/rules")
        rules = [r for g in (doc or {}).get("data", {}).get("groups", []) for r in g["rules"]]
        if rules and all(not r["lastEvaluation"].startswith("0001") for r in rules):
            return doc
        await asyncio.sleep(STEP)
    return None


async def test_the_tunnel_alert_fires_during_stuck_flannel_and_resolves_after(
        tmp_path: Path) -> None:
    world = World(tmp_path / "lab")
    try:
        await world.build()
        edge = world.edges[0]
        world.start_agent(edge)
        prom = tmp_path / "prometheus"
        (prom / "data").mkdir(parents=True)
        every = f"{STEP * 1000:.0f}ms"
        (prom / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": every, "evaluation_interval": every,
                       "scrape_timeout": every},
            "rule_files": _shortened_rules(prom),
            "scrape_configs": [{"job_name": "edgeheal", "static_configs": [
                {"targets": [f"127.0.0.1:{AGENT_PORT}"]}]}],
        }))
        port = _free_port(edge.ns)
        server = world.sandbox.spawn(
            [PROMETHEUS, f"--config.file={prom / 'prometheus.yml'}",
             f"--storage.tsdb.path={prom / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"],
            ns=edge.ns, log_path=prom / "prometheus.log")
        rules = await _rules_loaded(edge.ns, port, server)
        log = (prom / "prometheus.log").read_text(errors="replace")[-2000:]
        assert rules is not None, f"prometheus did not evaluate the rules: {log}"
        loaded = {r["name"]: r for g in rules["data"]["groups"] for r in g["rules"]}
        assert ALERT in loaded
        assert loaded[ALERT]["duration"] == 0
        assert all(r["health"] == "ok" for r in loaded.values()), \
            {n: r.get("lastError") for n, r in loaded.items() if r["health"] != "ok"}

        lab = Lab(world, out=io.StringIO(), live=False)
        began = time.time()
        expectations = await asyncio.wait_for(stuck_flannel(lab), 240)
        assert all(e.held for e in expectations), [e for e in expectations if not e.held]
        offset = time.time() - (time.monotonic() - lab.t0)  # lab seconds -> wall clock
        t_fault = offset + lab.marks["fault_injected"]
        t_recovered = offset + lab.marks["recovered"]

        # the agent says ok again: within a few evaluations Prometheus must agree
        active = await asyncio.to_thread(_active, edge.ns, port)
        deadline = time.monotonic() + 30
        while active and time.monotonic() < deadline:
            await asyncio.sleep(STEP)
            active = await asyncio.to_thread(_active, edge.ns, port)
        firing = await asyncio.to_thread(_firing_series, edge.ns, port, began, time.time())
    finally:
        await world.close()

    assert firing, f"{ALERT} never fired"
    first, labels = firing[0]
    assert t_fault <= first <= t_recovered + 2 * STEP, \
        f"{ALERT} first fired {first - t_fault:.1f}s after the fault; the lab saw the " \
        f"recovery {t_recovered - t_fault:.1f}s after it"
    assert (labels["check"], labels["severity"]) == ("wireguard", "critical"), labels
    assert labels["reason"] in ("no_peers", "stalled", "dead", "never_connected",
                                "interface_missing"), labels
    assert not active, f"{ALERT} still active 30 s after the recovery: {active}"
    assert firing[-1][0] <= t_recovered + 10, \
        f"{ALERT} fired until {firing[-1][0] - t_recovered:.1f}s after the recovery"
