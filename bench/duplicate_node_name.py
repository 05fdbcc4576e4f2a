"""How long two agents with one ``node_name`` on one broker take to find each other out.

    python bench/duplicate_node_name.py [--runs N]       (root: it runs Mosquitto and agents)

Starts a real Mosquitto on loopback and two ``edgeheal run`` processes whose configs differ
only in ``state_dir`` and the HTTP port (so they send the same client id), and measures,
from the moment both serve, the seconds until each has raised ``alerts.duplicate_client_id``
(its log line). Both MQTT protocols, at the shipped ``[alerts] reconnect_max`` (60 s) and at
1 s; medians over ``--runs``. The detection needs three takeovers in ten minutes
(``edgeheal.boundaries.mqtt.link.TAKEOVER_COUNT``), and the agents' reconnect backoff
(1 s doubling, jittered) sets the pace. Results are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from edgeheal.lab.mosquitto import Mosquitto, free_port
from edgeheal.lab.netns import Sandbox

ALERT = "alert alerts.duplicate_client_id "


def _config(path: Path, state: Path, *, port: int, broker: int, protocol: str,
            reconnect_max: str | None) -> Path:
    path.write_text(f'[agent]\nstate_dir = "{state}"\nnode_name = "edge-twin"\n'
                    f'[http]\nlisten = ["127.0.0.1:{port}"]\n[wireguard]\nenabled = false\n'
                    '[offload]\ninterfaces = ["lo"]\nenforce = false\n'
                    f'[[mqtt.targets]]\nname = "broker"\nhost = "127.0.0.1"\nport = {broker}\n'
                    f'protocol = "{protocol}"\n[alerts]\ntarget = "broker"\n'
                    + (f'reconnect_max = "{reconnect_max}"\n' if reconnect_max else ""))
    return path


def _serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def once(protocol: str, reconnect_max: str | None, limit: float) -> list[float]:
    """Seconds from both serving to each agent's alert (sorted); ``limit`` bounds it."""
    with tempfile.TemporaryDirectory(prefix="edgeheal-dup-") as tmp, Sandbox() as sandbox:
        work = Path(tmp)
        broker = Mosquitto(sandbox, work)
        broker.start()
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET",)}
        env["EDGEHEAL_LOG_LEVEL"] = "info"
        logs, ports = [], []
        for name in ("a", "b"):
            state = work / name / "state"
            state.mkdir(parents=True, mode=0o700)
            port = free_port()
            cfg = _config(work / name / "edgeheal.toml", state, port=port,
                          broker=broker.port, protocol=protocol, reconnect_max=reconnect_max)
            log = work / name / "agent.log"
            sandbox.spawn([sys.executable, "-m", "edgeheal", "run", "--config", str(cfg)],
                          log_path=log, env=env)
            logs.append(log)
            ports.append(port)
        deadline = time.monotonic() + 60
        while not all(_serving(p) for p in ports):
            if time.monotonic() > deadline:
                raise SystemExit("the agents did not start within 60 s")
            time.sleep(0.1)
        began = time.monotonic()
        found: dict[int, float] = {}
        while len(found) < 2 and time.monotonic() - began < limit:
            for i, log in enumerate(logs):
                if i not in found and ALERT in log.read_text(errors="replace"):
                    found[i] = time.monotonic() - began
            time.sleep(0.1)
        if len(found) < 2:
            raise SystemExit(f"not found out within {limit:g} s ({protocol}, "
                             f"reconnect_max {reconnect_max or 'default'})")
        return sorted(found.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--limit", type=float, default=300.0)
    args = parser.parse_args()
    out = []
    for reconnect_max in (None, "1s"):
        for protocol in ("3.1.1", "5"):
            runs = [once(protocol, reconnect_max, args.limit) for _ in range(args.runs)]
            out.append({"protocol": protocol,
                        "reconnect_max": reconnect_max or "60s (shipped)",
                        "first_s": round(statistics.median(r[0] for r in runs), 1),
                        "both_s": round(statistics.median(r[1] for r in runs), 1),
                        "runs": [[round(x, 1) for x in r] for r in runs]})
            print(json.dumps(out[-1]), flush=True)


if __name__ == "__main__":
    main()
