"""What the control ladder takes and costs: a stuck K3s agent to its restart and recovery,
and the agent's RSS with the ladder on and off.

The setup of tests/remediation_dbus/test_e2e_control.py, on loopback: the real agent
(``python -m edgeheal run``), the stand-in API server whose stand-in kubelet renews the
node's Lease, one TCP connection held to it as the K3s agent's, and a private dbus-daemon
with the stand-in systemd whose ``k3s-agent.service`` restart brings the kubelet and the
connection back. Fault: the connection goes and the kubelet stops renewing, the server
still answering. Measured: seconds from the fault to the ``RestartUnit`` and to the
attempt ``recovered`` in ``/status``; and, on a healthy node, the agent's VmRSS 20 s after
its control check is first ``ok``, with ``[remediation.control]`` on and off.

Two settings: the lab's (check every 1 s, ``api_spacing`` 5 s, a 2 s Lease renewed every
0.2 s, ``act_after`` 0) and the shipped defaults (10 s, 20 s, kubelet's 40 s Lease renewed
every 10 s, ``act_after`` 60 s). Prints Markdown (medians, min-max).

    nice -n 5 /opt/edgeheal/bin/python bench/control_ladder.py [--runs 3] [--default-runs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeheal.lab.kubeapi import FakeKube
from edgeheal.lab.netns import Sandbox
from edgeheal.lab.systemd_bus import FakeSystemd, start_system_bus

NODE = "edge-bench"
AGENT = "k3s-agent.service"
LAB = {"renew": 0.2, "duration": 2, "check": '"1s"', "spacing": '"5s"', "act_after": '"0s"',
       "jitter": '"0s"'}
DEFAULTS = {"renew": 10.0, "duration": 40, "check": '"10s"', "spacing": '"20s"',
            "act_after": '"60s"', "jitter": '"30s"'}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2.0) as resp:
            doc = json.loads(resp.read())
    except OSError as err:
        if getattr(err, "code", None) != 503:
            return {}
        doc = json.loads(err.read())  # type: ignore[attr-defined]
    return doc if isinstance(doc, dict) else {}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def poll(probe: Any, within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(probe)
        if value:
            return value
        await asyncio.sleep(0.25)
    raise TimeoutError(f"{what}: not within {within:g}s")


async def one(settings: dict[str, Any], *, ladder: bool, fault: bool) -> dict[str, float]:
    box = Sandbox()
    api = FakeKube()
    held: list[socket.socket] = []
    try:
        with tempfile.TemporaryDirectory(prefix="edgeheal-bench-") as tmp:
            tmp_path = Path(tmp)
            api.add_node(NODE)
            api.set_addresses(NODE, "127.0.0.1")
            await api.start()
            host, sport = api.url.removeprefix("https://").rsplit(":", 1)

            def agent_back(unit: str = "") -> None:
                api.kubelet_start(NODE, renew=settings["renew"], grace=3600.0,
                                  duration=settings["duration"])
                held.append(socket.create_connection((host, int(sport)), timeout=5.0))

            agent_back()
            account = api.add_user(f"system:serviceaccount:kube-flannel:edgeheal-{NODE}")
            api.allow_agent(account.user)
            kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", account)
            port = free_port()
            conf = tmp_path / "edgeheal.toml"
            conf.write_text(f"""
[agent]
node_name = "{NODE}"
state_dir = "{tmp_path}/state"
[http]
listen = ["127.0.0.1:{port}"]
[kubernetes]
kubeconfig = "{kubeconfig}"
retries = 0
[control]
servers = ["{host}:{sport}"]
balancer = "127.0.0.1:{free_port()}"
kubelet_healthz = ""
interval = {settings["check"]}
retry_interval = {settings["check"]}
api_spacing = {settings["spacing"]}
[remediation]
mode = "none"
restart_jitter = {settings["jitter"]}
[remediation.control]
enabled = {"true" if ladder else "false"}
act_after = {settings["act_after"]}
startup_grace = "0s"
""", encoding="utf-8")
            bus = start_system_bus(box)
            restarted: list[float] = []

            def on_restart(unit: str) -> None:
                restarted.append(time.monotonic())
                agent_back()

            async with FakeSystemd.with_units(bus.address, {AGENT: "active"},
                                              on_restart=on_restart):
                env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": bus.address}
                proc = box.spawn([sys.executable, "-m", "edgeheal", "run", "--config",
                                  str(conf)], env=env, log_path=box.track(tmp_path / "log"))

                def ok() -> bool:
                    check = status(port).get("checks", {}).get("control", {})
                    return (check.get("state"), check.get("reason")) == ("ok", "ok")

                await poll(ok, 60, "the control check ok")
                if not fault:
                    await asyncio.sleep(20)
                    return {"rss_mb": rss_mb(proc.pid)}
                for sock in held:
                    sock.close()
                held.clear()
                api.kubelet_stop(NODE)
                began = time.monotonic()

                def recovered() -> bool:
                    doc = status(port).get("control_remediation", {})
                    return any(a.get("result") == "recovered" for a in doc.get("actions", []))

                await poll(recovered, 900, "a recovered restart")
                done = time.monotonic()
                return {"to_restart": restarted[0] - began, "to_recovered": done - began,
                        "restarts": float(len(restarted))}
    finally:
        for sock in held:
            sock.close()
        await api.close()
        box.close()


def summary(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--default-runs", type=int, default=1)
    args = parser.parse_args()
    print("| settings | runs | fault to RestartUnit, s | fault to recovered, s | restarts |")
    print("|---|---|---|---|---|")
    for name, settings, runs in (("lab", LAB, args.runs),
                                 ("shipped defaults", DEFAULTS, args.default_runs)):
        got = [await one(settings, ladder=True, fault=True) for _ in range(runs)]
        print(f"| {name} | {runs} | {summary([g['to_restart'] for g in got])} | "
              f"{summary([g['to_recovered'] for g in got])} | "
              f"{summary([g['restarts'] for g in got])} |", flush=True)
    print()
    print("| healthy agent, control check on | VmRSS, MB |")
    print("|---|---|")
    for ladder in (False, True):
        got = [await one(LAB, ladder=ladder, fault=False) for _ in range(args.runs)]
        print(f"| ladder {'on' if ladder else 'off'} | "
              f"{summary([g['rss_mb'] for g in got])} |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
