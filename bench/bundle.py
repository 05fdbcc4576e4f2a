"""What ``edgeheal bundle`` costs: wall time, peak RSS and archive size, agent up and down.

    python bench/bundle.py [--repeats N] [--out FILE.json]

Starts one real agent on loopback (the shipped defaults plus what names this machine: a
listen port, a state directory, WireGuard off, one direct-path MQTT target on a closed
loopback port so doctor's and the agent's broker rows fail at once, as offline), lets it
run 20 s so its outbox, metrics and log have content, then runs ``edgeheal bundle`` N
times against it and N times after it stopped (``--log-file``: this machine has no
journal). Reports medians (min-max) of the command's wall time and peak RSS (``wait4``'s
``ru_maxrss``) and the archive's size. Prints Markdown; ``--out`` also writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bundle(config: Path, log: Path, out: Path) -> dict[str, float]:
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeheal", "bundle", "--config", str(config),
         "--log-file", str(log), "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.monotonic() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"edgeheal bundle exited {proc.returncode}")
    return {"seconds": took, "rss_mb": usage.ru_maxrss / 1024, "bytes": out.stat().st_size}


def _summary(rows: list[dict[str, float]], key: str) -> dict[str, float]:
    values = [r[key] for r in rows]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgeheal-bench-bundle-") as tmp:
        work = Path(tmp)
        port, dead = _port(), _port()
        config = work / "edge.toml"
        config.write_text(
            f'[agent]\nnode_name = "bench-edge"\nstate_dir = "{work}/state"\n'
            f'[http]\nlisten = ["127.0.0.1:{port}"]\n[wireguard]\nenabled = false\n'
            f'[[mqtt.targets]]\nname = "cloud"\nhost = "127.0.0.1"\nport = {dead}\n'
            'path = "direct"\n[alerts]\ntarget = "cloud"\n')
        log = work / "agent.log"
        with log.open("a") as f:
            agent = subprocess.Popen(
                [sys.executable, "-m", "edgeheal", "run", "--config", str(config)],
                stdout=f, stderr=f, env={**os.environ, "EDGEHEAL_LOG_LEVEL": "debug"})
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                timeout=2):
                        break
                except OSError:
                    time.sleep(0.2)
            time.sleep(20)
            up = [_bundle(config, log, work / f"up-{i}.tar.gz") for i in range(args.repeats)]
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
        down = [_bundle(config, log, work / f"down-{i}.tar.gz") for i in range(args.repeats)]
    result = {"repeats": args.repeats, "load": os.getloadavg(),
              "up": {k: _summary(up, k) for k in ("seconds", "rss_mb", "bytes")},
              "down": {k: _summary(down, k) for k in ("seconds", "rss_mb", "bytes")}}
    print("| agent | n | wall time | peak RSS | archive |\n|---|---|---|---|---|")
    for name in ("up", "down"):
        s = result[name]
        print(f"| {name} | {args.repeats} | {s['seconds']['median']:.2f} s "
              f"({s['seconds']['min']:.2f}-{s['seconds']['max']:.2f}) | "
              f"{s['rss_mb']['median']:.1f} MB | {s['bytes']['median'] / 1024:.1f} KB "
              f"({s['bytes']['min'] / 1024:.1f}-{s['bytes']['max'] / 1024:.1f}) |")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
