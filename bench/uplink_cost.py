"""The steady-state cost of the ``uplink`` check: the same world, the feature on and off.

    python bench/uplink_cost.py --out FILE.json [--quick] [--clutter N] [--window S]  (root)

Why a comparison in one run: the agent's idle CPU and RSS move with the machine's load and
with the Python heap's history, so a figure "with the uplink on" measured today against one
"with it off" measured last week says little. Here one world holds two edges built alike
(both uplinks are modems behind the stand-in ModemManager, both agents on the shipped
defaults); edge-0's agent has the example config's uplink sections enabled with every
default value, edge-1's has none. Both run side by side over the same window (600 s, or
60 s with ``--quick``), sampled together every 10 s: CPU seconds, RSS and PSS from ``/proc``.

A K3s node is not the lab's bare namespace: it has a veth per pod, the CNI bridge, Flannel's
routes. The check's cost grows with what a netlink dump returns, so each edge namespace gets
``--clutter`` veth pairs (default 24: 48 links, each pair with an address and a route) before
the agents start, on both edges alike. Collectors are stopped on both (only the agents run).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import labkit
from labkit import BenchWorld, Recorder

from edgeheal.lab.netns import run, stop_process
from edgeheal.lab.world import Edge

SETTLE = 120.0
PERIOD = 10.0


def clutter(edge: Edge, pairs: int) -> None:
    """``pairs`` veth pairs in the edge's namespace, up, each with an address and a route
    (what pods, the CNI bridge and Flannel's routes add to a K3s node's dumps)."""
    lines = []
    for i in range(pairs):
        a, b = f"ehpod{i}", f"ehcni{i}"
        lines += [f"link add {a} type veth peer name {b}", f"link set {a} up",
                  f"link set {b} up", f"addr add 10.99.{i}.1/24 dev {a}",
                  f"route add 10.98.{i}.0/24 via 10.99.{i}.2 dev {a} onlink"]
    run(["ip", "-batch", "-"], ns=edge.ns, input="\n".join(lines) + "\n", timeout=60)


def stats(samples: list[dict[str, float]]) -> dict[str, Any]:
    first, last = samples[0], samples[-1]
    return {"cpu_percent": labkit.cpu_percent(first, last),
            "rss_mb": [round(s["rss_mb"], 2) for s in samples],
            "pss_mb": [round(s["pss_mb"], 2) for s in samples],
            "rss_first_mb": first["rss_mb"], "rss_last_mb": last["rss_mb"],
            "rss_growth_mb": last["rss_mb"] - first["rss_mb"]}


async def measure(workdir: Path, quick: bool, pairs: int,
                  window: float | None = None) -> dict[str, Any]:
    window = window or (60.0 if quick else 600.0)
    on, off = "edge-0", "edge-1"
    world = BenchWorld(workdir, edges=2, agent=True, offload_on_at_boot=False, defaults=True,
                       modem=True, uplink_off=frozenset({off}))
    recs: list[Recorder] = []
    out: dict[str, Any] = {"window": window, "clutter_pairs": pairs, "uplink_on": on,
                           "uplink_off": off}
    try:
        await world.build()
        for edge in world.edges:
            stop_process(edge.collector)
            await asyncio.to_thread(clutter, edge, pairs)
            world.start_agent(edge)
        recs = [Recorder(world, e, period=1.0).start() for e in world.edges]
        for rec in recs:
            await rec.until(lambda s: all(st == "ok" for st, _ in s.checks.values())
                            and s.uptime >= 15, SETTLE, "every check ok")
        checks = {r.edge.name: sorted(r.last.checks) if r.last else [] for r in recs}
        if "uplink" not in checks[on] or "uplink" in checks[off]:
            raise RuntimeError(f"the uplink check is not on {on} only: {checks}")
        out["checks"] = checks
        pids = {e.name: labkit.agent_pid(e) for e in world.edges}
        series: dict[str, list[dict[str, float]]] = {n: [] for n in pids}
        began = time.monotonic()
        while True:
            for name, pid in pids.items():
                series[name].append(labkit.proc_sample(pid))
            if time.monotonic() - began >= window:
                break
            await asyncio.sleep(min(PERIOD, window - (time.monotonic() - began)))
        out["agents"] = {n: stats(s) for n, s in series.items()}
        out["not_ok_samples"] = {r.edge.name: sum(1 for s in r.samples if any(
            st != "ok" for st, _ in s.checks.values())) for r in recs}
        a, b = out["agents"][on], out["agents"][off]
        out["delta"] = {"cpu_percent": a["cpu_percent"] - b["cpu_percent"],
                        "rss_last_mb": a["rss_last_mb"] - b["rss_last_mb"],
                        "rss_growth_mb": a["rss_growth_mb"] - b["rss_growth_mb"]}
        out["loadavg"] = labkit.loadavg()
    finally:
        for rec in recs:
            await rec.stop()
        await world.close()
    return out


def _terminate(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--clutter", type=int, default=24, help="veth pairs per edge")
    parser.add_argument("--window", type=float, help="seconds sampled (default 600, "
                        "60 with --quick; 3600: the hour the footprint budget asks for)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)  # unwinds through world.close()
    return labkit.run_bench("uplink-cost", lambda w: measure(
        w, args.quick, args.clutter, args.window), args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
