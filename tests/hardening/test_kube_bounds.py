"""Issue 27, finding 1: what the Kubernetes API sends cannot grow the agent's memory or
stall its loop.

A watch stream that never sent a newline was buffered without limit (5.6 GB in 25 s); a
45 MB pod list (60,000 pods on other nodes) took RSS from 54 to 348 MB and stalled
``/livez`` for 760 ms. The client runs here in a child process, against the test API
server's faults (:meth:`FakeKube.stream`, :meth:`FakeKube.crowd`), and reports its own
memory growth (``VmHWM`` after minus ``VmRSS`` before) and how long its loop was kept
from a 10 ms ticker: the thread's CPU time between two ticks (``busy``: what the loop
spent on other work before a ``/livez`` could run, which a machine shared by other
processes does not inflate), with the wall-clock lateness (``lag``) reported beside it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

from edgeheal.boundaries.kube import BODY_MAX, WATCH_LINE_MAX
from edgeheal.lab.kubeapi import FakeKube
from tests.remediation.conftest import NODE, NS

ROOT = Path(__file__).resolve().parents[2]
GROWTH_LIMIT_MB = 40
"""Memory a bounded read may add: the 4 MiB body cap, its decoding, the TLS buffers."""
LAG_LIMIT = 0.1
"""The issue's bound on a probe's delay."""

CHILD = r"""
import asyncio, json, sys, time
from edgeheal.boundaries.kube import KubeClient, KubeError
from edgeheal.config import KubernetesSettings
kubeconfig, mode, ns, node = sys.argv[1:5]

def status(field):
    line = [l for l in open("/proc/self/status") if l.startswith(field + ":")][0]
    return int(line.split()[1]) / 1024

async def ticker(lag):
    loop = asyncio.get_running_loop()
    while True:
        before, cpu = loop.time(), time.thread_time()
        await asyncio.sleep(0.01)
        lag[0] = max(lag[0], loop.time() - before - 0.01)
        lag[1] = max(lag[1], time.thread_time() - cpu)

async def main():
    kube = KubeClient(KubernetesSettings(kubeconfig=kubeconfig, request_timeout=20.0,
                                         retries=0))
    await kube.request("GET", "/version", what="warm up")
    out = {"rss_before_mb": status("VmRSS")}
    lag = [0.0, 0.0]
    tick = asyncio.create_task(ticker(lag))
    began = time.monotonic()
    try:
        if mode == "watch":
            async for _ in kube.watch_pods(ns, "app=flannel", node, "", 60.0):
                pass
            out["result"] = "ended"
        else:
            pods, _ = await kube.list_pods(ns, "app=flannel", node)
            out["result"] = [p.node for p in pods]
    except KubeError as err:
        out["error"] = str(err)
    finally:
        tick.cancel()
        await kube.close()
    out["seconds"] = time.monotonic() - began
    out["lag"], out["busy"] = lag
    out["growth_mb"] = status("VmHWM") - out["rss_before_mb"]
    return out

print(json.dumps(asyncio.run(main())))
"""


async def _child(api: FakeKube, tmp_path: Path, mode: str) -> dict[str, object]:
    creds = api.add_user("system:serviceaccount:kube-flannel:edgeheal-edge-1")
    api.allow_agent(creds.user, NS)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", creds)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(kubeconfig), mode, NS, NODE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    return dict(json.loads(out.decode().splitlines()[-1]))


async def _api() -> FakeKube:
    api = FakeKube()
    api.add_node(NODE)
    api.add_node("edge-2")
    api.add_daemonset(NS, "kube-flannel-ds", {"app": "flannel", "tier": "node"})
    await api.start()
    return api


def _endless_line(_request: web.Request) -> Iterator[bytes]:
    yield b'{"type": "ADDED", "object": {"metadata": {"name": "'
    chunk = b"a" * 65536
    for _ in range(1024):  # 64 MiB, never a newline
        yield chunk


async def test_a_watch_line_without_end_is_refused_at_the_cap(tmp_path: Path) -> None:
    api = await _api()
    try:
        api.stream(_endless_line, method="GET", query="watch=true")
        out = await _child(api, tmp_path, "watch")
    finally:
        await api.close()
    assert f"over the {WATCH_LINE_MAX // 2**20} MiB cap" in str(out.get("error")), out
    assert float(out["growth_mb"]) < GROWTH_LIMIT_MB, out  # type: ignore[arg-type]
    assert float(out["busy"]) < LAG_LIMIT, out  # type: ignore[arg-type]


async def test_a_45_mb_list_in_one_answer_is_refused_at_the_cap(tmp_path: Path) -> None:
    api = await _api()
    try:
        api.crowd(42_000, paged=False)  # about 45 MB, limit ignored: one answer
        out = await _child(api, tmp_path, "list")
    finally:
        await api.close()
    assert f"over the {BODY_MAX // 2**20} MiB cap" in str(out.get("error")), out
    assert float(out["growth_mb"]) < GROWTH_LIMIT_MB, out  # type: ignore[arg-type]
    assert float(out["busy"]) < LAG_LIMIT, out  # type: ignore[arg-type]


async def test_60000_pods_elsewhere_are_read_in_pages_within_bounds(tmp_path: Path) -> None:
    """A lax server that ignores fieldSelector but honours limit: the client pages through
    and finds this node's one pod, its memory and its loop unharmed."""
    api = await _api()
    try:
        api.crowd(60_000)
        out = await _child(api, tmp_path, "list")
        pages = [r for r in api.requests if r.path.endswith("/pods")]
    finally:
        await api.close()
    assert out.get("result") == [NODE], out
    assert all("limit=" in r.query for r in pages)
    assert len(pages) > 60_000 // 1000
    assert float(out["growth_mb"]) < GROWTH_LIMIT_MB, out  # type: ignore[arg-type]
    assert float(out["busy"]) < LAG_LIMIT, out  # type: ignore[arg-type]
