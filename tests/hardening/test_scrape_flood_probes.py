"""Issue 27, finding 6: four scrapers of a 5,000-peer /metrics never delay /readyz.

A node that watches a large mesh (or exports it whole, ``[metrics] all_peers = true``)
renders about 35,000 series per scrape, about a second of Python. Rendered on the event
loop, four parallel scrapers from any local user made /readyz miss kubelet's 1 s timeout.

The peers' series come from the real WireGuard collector over a fake reader (5,000 peers,
one run), registered on a running agent's registry; its ``collect`` is wrapped to record
when each render ran, so the test proves the probes were answered *while* one was in
progress. The scrapers are another process (as a local user's would be): four threads on
``/metrics`` and one on ``/status`` (whose 5,000-peer document changes every second), each
checking every body it gets.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric

from edgeheal.agent import endpoints as http
from edgeheal.base import compat
from edgeheal.boundaries import wg
from edgeheal.checks import wireguard as wgcheck
from edgeheal.config import CheckSettings
from edgeheal.model import CheckResult, State
from tests.agent.fakes import ScriptedCheck, ok
from tests.agent.support import running_agent
from tests.support import Clock, context, until

PEERS = 5000
BOUND = 0.5
"""The most one /readyz may take while a render is in progress: it takes about 1 ms, a
render on the loop held it 0.8-1.3 s, and a busy box's scheduling adds tenths (0.245 s
seen under a parallel suite on Python 3.13)."""
WINDOW = 4.0
"""Seconds the scrapers hammer the agent."""
FAST = CheckSettings(interval=0.2, fail_after=1, recover_after=1, required=True)
MESH = CheckSettings(interval=1.0, required=False)

SCRAPERS = r"""
import json, sys, threading, time, http.client
port, window, peers = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
done = {"metrics": 0, "status": 0, "errors": []}
lock = threading.Lock()
deadline = time.monotonic() + window

def get(path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()

def metrics():
    while time.monotonic() < deadline:
        status, body = get("/metrics")
        text = body.decode()
        states = text.count('edgeheal_wireguard_peer_state{')
        ok = (status == 200 and states == 4 * peers and text.endswith("\n")
              and "edgeheal_ready 1.0" in text)
        with lock:
            done["metrics"] += 1
            if not ok:
                done["errors"].append(f"/metrics {status}: {states} peer states")

def status():
    while time.monotonic() < deadline:
        code, body = get("/status")
        doc = json.loads(body)
        got = len(doc["checks"]["mesh"]["detail"]["peers"])
        with lock:
            done["status"] += 1
            if code != 200 or got != peers or doc["node"] != "edge-test":
                done["errors"].append(f"/status {code}: {got} peers")

threads = [threading.Thread(target=metrics) for _ in range(4)]
threads.append(threading.Thread(target=status))
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(done))
"""


def mesh(clock: Clock) -> wg.DeviceStats:
    hs = clock.wall().timestamp() - 30.0
    return wg.DeviceStats("flannel-wg", 51820, tuple(
        wg.PeerStats(public_key=base64.b64encode(i.to_bytes(32, "big")).decode(),
                     endpoint=f"198.51.{i // 250}.{i % 250}:51820",
                     allowed_ips=(f"10.{i // 250}.{i % 250}.0/24",), last_handshake=hs,
                     rx_bytes=1000 + i, tx_bytes=2000 + i, persistent_keepalive=0)
        for i in range(PEERS)), reader="uapi")


class Recorded:
    """The WireGuard check's collector, recording each render as (began, ended)."""

    def __init__(self, check: wgcheck.WireguardCheck) -> None:
        self.check = check
        self.renders: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        began = time.monotonic()
        families = list(self.check.collect())
        with self._lock:
            self.renders.append((began, time.monotonic()))
        yield from families

    def overlapped(self, began: float, ended: float) -> bool:
        """True if a render was in progress during [began, ended] (on the loop, none can
        be: the loop serves nothing while it renders)."""
        with self._lock:
            return any(b < ended and began < e for b, e in self.renders)


async def test_readyz_answers_while_four_scrapers_render_5000_peers(tmp_path: Path) -> None:
    clock = Clock()
    harness = context('[wireguard]\ninterfaces = ["flannel-wg"]\n'
                      '[metrics]\nall_peers = true\n', clock=clock)
    device = mesh(clock)

    async def reader(ifname: str) -> wg.DeviceStats:
        return device

    peers = wgcheck.WireguardCheck(harness.ctx, reader=reader)
    result = await peers.run()
    assert result.state is State.OK
    assert len(result.detail["peers"]) == PEERS
    runs = iter(range(1_000_000))  # a new message each run: a new /status every second
    big = ScriptedCheck("mesh", MESH, [lambda: CheckResult(
        State.OK, "ok", f"run {next(runs)}", result.detail)])
    async with running_agent(tmp_path, [ScriptedCheck("fast", FAST, [ok()]), big]) as agent:
        await until(lambda: agent.agent.snapshot.ready and big.runs > 0,
                    what="the agent ready")
        recorded = Recorded(peers)
        agent.agent.registry.register(recorded)
        port = agent.base.rsplit(":", 1)[1]
        gc.collect()  # the setup's garbage now, not in the window (a 5,000-peer full pass)
        scrapers = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SCRAPERS, port, str(WINDOW), str(PEERS),
            stdout=asyncio.subprocess.PIPE)
        try:
            probes: list[tuple[float, float, int]] = []
            deadline = time.monotonic() + WINDOW
            while time.monotonic() < deadline:
                began = time.monotonic()
                status, _ = await agent.get("/readyz")
                probes.append((began, time.monotonic(), status))
                await asyncio.sleep(0.05)
            async with compat.timeout(60):
                out, _ = await scrapers.communicate()
        finally:
            if scrapers.returncode is None:
                scrapers.kill()
                await scrapers.wait()
        renders = agent.agent.http_runner.app[http.RENDER].renders  # type: ignore[union-attr]
    done: dict[str, Any] = json.loads(out)
    during = [(b, e) for b, e, _ in probes if recorded.overlapped(b, e)]
    worst = max(e - b for b, e, _ in probes)
    assert all(status == 200 for _, _, status in probes)
    assert done["errors"] == [], done["errors"][:5]
    assert done["metrics"] >= 4, done
    assert done["status"] >= 1, done
    assert len(recorded.renders) >= 1, recorded.renders
    assert worst < BOUND, f"/readyz took {worst:.3f}s while 5,000 peers were rendered"
    assert len(during) >= 1, f"only {len(during)} of {len(probes)} probes met a render"
    assert len(recorded.renders) < done["metrics"], "scrapers shared no render"
    assert renders >= len(recorded.renders)
