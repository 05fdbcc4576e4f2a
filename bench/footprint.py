"""Measure the running agent's memory (RSS, PSS) and CPU, and the import floor.

    python bench/footprint.py [--config FILE] [--seconds N]

Starts ``edgeheal run`` (default: a config with every check that can run without a lab),
waits, samples /proc/<pid>/status and smaps_rollup, and prints JSON. The import floor is the
RSS of a bare interpreter that imports the agent's runtime dependencies. Results are
recorded in docs/footprint.md.
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = args.config
        if cfg is None:
            cfg = f"{tmp}/edgeheal.toml"
            Path(cfg).write_text(
                f'[agent]\nstate_dir = "{tmp}/state"\n[http]\n'
                f'listen = ["127.0.0.1:{free_port()}"]\n[offload]\ninterfaces = ["lo"]\n'
                '[wireguard]\ninterfaces = ["wg-none"]\n')
        proc = subprocess.Popen([sys.executable, "-m", "edgeheal", "run", "--config", cfg],
                                stderr=subprocess.DEVNULL)
        try:
            time.sleep(5)
            first = sample(proc.pid)
            time.sleep(args.seconds)
            last = sample(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    cpu = (last["cpu_seconds"] - first["cpu_seconds"]) / args.seconds * 100
    print(json.dumps({
        "rss_mb": round(last["rss_mb"], 1), "pss_mb": round(last["pss_mb"], 1),
        "idle_cpu_percent_of_one_core": round(cpu, 3), "window_seconds": args.seconds,
        "import_floor_mb": {
            "python": round(import_floor(["sys"]), 1),
            "aiohttp+prometheus_client+pyroute2+paho": round(import_floor(
                ["aiohttp", "prometheus_client", "pyroute2", "paho.mqtt.client"]), 1),
            "edgeheal.agent.supervisor (spine only)": round(import_floor(
                ["edgeheal.agent.supervisor", "edgeheal.agent.endpoints"]), 1),
        }}, indent=2))


if __name__ == "__main__":
    main()
