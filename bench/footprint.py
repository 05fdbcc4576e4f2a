"""Measure the running agent's memory (RSS, PSS) and CPU, and the import floor.

    python bench/footprint.py [--config FILE] [--seconds N] [--clutter N]   (root for --clutter)

Starts ``edgeheal run`` (default: a config with every check that can run without a lab),
waits, samples /proc/<pid>/status and smaps_rollup, and prints JSON. ``--clutter N`` runs
the agent in a fresh network namespace holding N veth pairs (2N links, each pair up with an
address and a route: what a K3s node's pods and CNI routes add to every netlink dump) and
samples every 10 s, so growth per link shows (``rss_series_mb``, ``growth_mb``). The import
floor is the RSS of a bare interpreter that imports the agent's runtime dependencies.
Results are recorded in docs/footprint.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _kb(path: Path, field: str) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def sample(pid: int) -> dict[str, float]:
    proc = Path(f"/proc/{pid}")
    stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {"rss_mb": _kb(proc / "status", "VmRSS") / 1024,
            "pss_mb": _kb(proc / "smaps_rollup", "Pss") / 1024,
            "cpu_seconds": (int(stat[11]) + int(stat[12])) / ticks}


def import_floor(modules: list[str]) -> float:
    code = ("import " + ", ".join(modules) + "\n"
            "print(open('/proc/self/status').read())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def clutter(ns: str, pairs: int) -> None:
    """A namespace ``ns`` with loopback up and ``pairs`` veth pairs, as bench/uplink_cost.py."""
    subprocess.run(["ip", "netns", "add", ns], check=True)
    lines = ["link set lo up"]
    for i in range(pairs):
        a, b = f"ehpod{i}", f"ehcni{i}"
        lines += [f"link add {a} type veth peer name {b}", f"link set {a} up",
                  f"link set {b} up", f"addr add 10.99.{i % 250}.{1 + 4 * (i // 250)}/30 dev {a}",
                  f"route add 10.98.{i % 250}.{4 * (i // 250)}/30 via "
                  f"10.99.{i % 250}.{2 + 4 * (i // 250)} dev {a} onlink"]
    subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n",
                   text=True, check=True, timeout=120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clutter", type=int, default=0, help="veth pairs (root)")
    parser.add_argument("--every", type=float, default=10.0, help="sampling period, s")
    args = parser.parse_args()
    ns = f"ehfp{os.getpid()}" if args.clutter else None
    series: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = args.config
        if cfg is None:
            cfg = f"{tmp}/edgeheal.toml"
            Path(cfg).write_text(
                f'[agent]\nstate_dir = "{tmp}/state"\n[http]\n'
                f'listen = ["127.0.0.1:{free_port()}"]\n[offload]\ninterfaces = ["lo"]\n'
                '[wireguard]\ninterfaces = ["wg-none"]\n')
        argv = [sys.executable, "-m", "edgeheal", "run", "--config", cfg]
        try:
            if ns is not None:
                clutter(ns, args.clutter)
                argv = ["ip", "netns", "exec", ns, *argv]
            proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
            try:
                time.sleep(5)
                began = time.monotonic()
                series.append(sample(proc.pid))
                while (left := args.seconds - (time.monotonic() - began)) > 0:
                    time.sleep(min(args.every, left))
                    series.append(sample(proc.pid))
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(10)
        finally:
            if ns is not None:
                subprocess.run(["ip", "netns", "del", ns], check=False)
    first, last = series[0], series[-1]
    cpu = (last["cpu_seconds"] - first["cpu_seconds"]) / args.seconds * 100
    print(json.dumps({
        "rss_mb": round(last["rss_mb"], 1), "pss_mb": round(last["pss_mb"], 1),
        "idle_cpu_percent_of_one_core": round(cpu, 3), "window_seconds": args.seconds,
        "clutter_pairs": args.clutter,
        "rss_series_mb": [round(x["rss_mb"], 2) for x in series],
        "growth_mb": round(last["rss_mb"] - first["rss_mb"], 2),
        "import_floor_mb": {
            "python": round(import_floor(["sys"]), 1),
            "aiohttp+prometheus_client+pyroute2+paho": round(import_floor(
                ["aiohttp", "prometheus_client", "pyroute2", "paho.mqtt.client"]), 1),
            "edgeheal.agent.supervisor (spine only)": round(import_floor(
                ["edgeheal.agent.supervisor", "edgeheal.agent.endpoints",
                 "edgeheal.agent.http_server"]), 1),
        }}, indent=2))


if __name__ == "__main__":
    main()
