"""Decision to traffic after a restart in ``k3s-service`` mode, with the stand-in unit.

    python bench/k3s_restart.py --out FILE.json [--repeats N]  (as root)

The set-up of tests/remediation_dbus/test_e2e_k3s_service.py: a two-node wireguard-go mesh
(edge, cloud), Mosquitto in the cloud reachable through the tunnel (overlay address) and
directly, a private dbus-daemon with the stand-in systemd whose ``k3s-agent.service``
restart re-creates the edge's device (what K3s's embedded Flannel does), and the real agent
in the edge namespace with ``mode = "k3s-service"``. Each repeat removes the cloud peer
from the edge's device and measures: fault -> ``failed``; the agent's decision (the
action's time stamp) -> the first TCP connection through the tunnel that opens again (a
probe every 0.1 s); decision -> ``wireguard`` ok. Everything is removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from edgeheal.base import compat

sys.path.insert(0, str(Path(__file__).resolve().parent))

import labkit
from labkit import TunnelProbe

from edgeheal.lab import nsutil
from edgeheal.lab.mosquitto import Mosquitto
from edgeheal.lab.netns import Sandbox
from edgeheal.lab.systemd_bus import FakeSystemd, start_system_bus
from edgeheal.lab.wireguard import WgMesh

AGENT = "k3s-agent.service"


def config(tmp: Path, *, port: int, iface: str, broker: int, tunnel_host: str,
           direct_host: str) -> str:
    return f"""
[agent]
node_name = "edge-bench"
state_dir = "{tmp}/state"
check_interval = "1s"

[http]
listen = ["127.0.0.1:{port}"]

[wireguard]
interfaces = ["{iface}"]
connect_grace = "10s"
recover_after = 1

[[mqtt.targets]]
name = "broker-tunnel"
host = "{tunnel_host}"
port = {broker}
path = "tunnel"
interval = "1s"
timeout = "1s"
recover_after = 1

[[mqtt.targets]]
name = "broker-direct"
host = "{direct_host}"
port = {broker}
path = "direct"
interval = "1s"
timeout = "1s"

[remediation]
mode = "k3s-service"
startup_grace = "0s"
cooldown = "0s"
restart_jitter = "0s"
max_per_hour = 10
verify_timeout = "30s"

[remediation.service]
timeout = "20s"
"""


async def until(get: Any, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(get)
        if value:
            return value
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no {what} within {within:g}s")


async def bench(repeats: int, tmp: Path) -> dict[str, Any]:
    sandbox = Sandbox()
    try:
        mesh = WgMesh(2, keepalive=2, sandbox=sandbox)
        edge, cloud = mesh.nodes
        broker = Mosquitto(sandbox, tmp, ns=cloud.ns, host="0.0.0.0")  # noqa: S104 - own namespace
        broker.start()
        bus = start_system_bus(sandbox)
        mesh.wait_handshake(edge, cloud)
        port = 20000 + secrets.randbelow(40000)  # a fresh namespace: any port is free
        conf = tmp / "edgeheal.toml"
        conf.write_text(config(tmp, port=port, iface=edge.ifname, broker=broker.port,
                               tunnel_host=cloud.overlay,
                               direct_host=mesh.endpoint(edge, cloud).rsplit(":", 1)[0]))

        async def rebuild(unit: str) -> None:
            await asyncio.to_thread(mesh.recreate_device, edge)

        def status() -> dict[str, Any]:
            try:
                _, doc = nsutil.get_json(edge.ns, "127.0.0.1", port, "/status", timeout=2.0)
            except OSError:
                return {}
            return doc if isinstance(doc, dict) else {}

        def wg_state() -> str:
            return str(status().get("checks", {}).get("wireguard", {}).get("state", ""))

        runs: list[dict[str, Any]] = []
        async with FakeSystemd.with_units(bus.address, {AGENT: "active"},
                                          on_restart=rebuild) as fake:
            sandbox.spawn([sys.executable, "-m", "edgeheal", "run", "--config", str(conf)],
                          ns=edge.ns, env={**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": bus.address},
                          log_path=sandbox.track(tmp / "agent.log"))
            await until(lambda: wg_state() == "ok", 30, "a healthy tunnel")
            for i in range(repeats):
                probe = TunnelProbe(edge.ns, broker.port, host=cloud.overlay, period=0.1,
                                    timeout=0.3).start()
                try:
                    t0 = time.monotonic()
                    await asyncio.to_thread(mesh.remove_peer, edge, cloud)
                    await until(lambda: wg_state() == "failed", 30, "failed")
                    detect = time.monotonic() - t0
                    action = await until(lambda n=i: _nth_action(status(), n), 60,
                                         "the restart")
                    decision = datetime.fromisoformat(
                        action["time"].replace("Z", "+00:00")).timestamp()
                    flowing = await until(lambda d=decision, p=probe: p.first_ok(d), 60,
                                          "traffic through the tunnel")
                    await until(lambda: wg_state() == "ok", 60, "wireguard ok again")
                    ok_at = time.time()
                    done = await until(lambda n=i: _finished(status(), n), 60, "the result")
                finally:
                    await probe.stop()
                runs.append({"detect": detect, "traffic": flowing - decision,
                             "ok_after_decision": ok_at - decision,
                             "result": done.get("result"),
                             "restart_duration": done.get("duration_seconds")})
            restarts = list(fake.restarts)
        return {"runs": runs, "restarts": restarts, "keepalive": 2}
    finally:
        await asyncio.to_thread(sandbox.close)


def _nth_action(doc: dict[str, Any], n: int) -> dict[str, Any] | None:
    actions = doc.get("actions") or []  # newest first
    return actions[0] if len(actions) == n + 1 else None


def _finished(doc: dict[str, Any], n: int) -> dict[str, Any] | None:
    action = _nth_action(doc, n)
    return action if action and action.get("result") != "in_progress" else None


def _terminate(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    with tempfile.TemporaryDirectory(prefix="edgeheal-bench-k3s-") as tmp:
        try:
            doc = asyncio.run(bench(args.repeats, Path(tmp)))
            doc["ok"] = True
        except (*compat.TimeoutErrors, OSError, RuntimeError) as err:
            doc = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            log = Path(tmp) / "agent.log"
            if log.exists():
                print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
    labkit.dump(args.out, doc)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
