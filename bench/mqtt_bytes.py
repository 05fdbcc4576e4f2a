"""Bytes on the wire that MQTT probing costs per day (edge boxes pay for 4G data).

    python bench/mqtt_bytes.py [--probes N] [--json]

Runs a real Mosquitto and the real probe/link code inside a fresh network namespace and
counts every IP byte and packet to and from the broker port with an nftables counter in
that namespace (IP + TCP headers included; on a 4G link there is no Ethernet header
either). Measured: one check on the kept-open probe session (a PINGREQ/PINGRESP and the
ACK: what the mqtt check does from its second run on, plain and TLS), one plain probe
(TCP handshake, CONNECT, CONNACK, DISCONNECT, FIN), one
TLS probe with a full handshake and one with session resumption (what the check does from
the second probe on), one probe into a blackhole (the broker's answers dropped: what a
probe costs while a dead path is confirmed, TCP's SYN retransmits until the timeout), and
one keepalive round (PINGREQ/PINGRESP + ACKs) of the kept-open alert connection. Then it
extrapolates to a day with the shipped defaults (:class:`edgeheal.config.MqttTarget`:
probe interval, timeout, retry interval, keepalive) for the example config: a ``tunnel``
target probed, the ``direct`` alert target kept open; healthy, and during a tunnel fault
(probes every timeout + retry interval for the agent's quick-retry window, then every
interval; a dead path's probes are connects, as they start with no session). Tunnel-path
packets also pay WireGuard's 60 bytes (outer IPv4 20 + UDP 8 + WireGuard header 16 + tag
16). Results: docs/mqtt.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edgeheal.base import compat

WG_OVERHEAD = 60
DAY = 86400.0
BUDGET = 10_000_000
HEALTHY_BUDGET = 1_000_000
"""Probe traffic with the shipped defaults on a healthy node, per day (issue 32)."""


def _counter(ns: str | None) -> tuple[int, int]:
    argv = ["nft", "-j", "list", "counter", "inet", "ehcount", "mqtt"]
    if ns:
        argv = ["ip", "netns", "exec", ns, *argv]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    for item in json.loads(out)["nftables"]:
        if "counter" in item:
            return int(item["counter"]["packets"]), int(item["counter"]["bytes"])
    raise RuntimeError("no counter in nft output")


async def _per_session_check(target: Any, probes: int) -> dict[str, float]:
    """Bytes of one check on the kept-open session (after its one CONNECT)."""
    from edgeheal.boundaries.mqtt.session import Session

    session = Session(target, "bench")
    assert (await session.check()).ok  # the CONNECT, once
    p0, b0 = _counter(None)
    for _ in range(probes):
        await asyncio.sleep(0.25)  # past the delayed ACK, as a minute apart would be
        result = await session.check()
        assert result.ping_seconds is not None, result.message
    p1, b1 = _counter(None)
    await session.close()
    return {"bytes": (b1 - b0) / probes, "packets": (p1 - p0) / probes}


async def _inner(args: argparse.Namespace) -> dict[str, Any]:
    """Runs inside the namespace: the workload, with counter readings around it."""
    from edgeheal.boundaries.mqtt import probe
    from edgeheal.boundaries.mqtt.link import Link
    from edgeheal.boundaries.mqtt.transport import TlsResumption
    from edgeheal.config import MqttTarget

    base = dict(name="bench", host="127.0.0.1", port=args.port, username="edge",
                password_file=args.password_file, timeout=5.0)
    plain = MqttTarget(**base)  # type: ignore[arg-type]
    tls = MqttTarget(**{**base, "port": args.tls_port, "tls": True,  # type: ignore[arg-type]
                        "ca_file": args.ca_file})
    out: dict[str, Any] = {}

    async def per_probe(target: MqttTarget, resume: bool) -> dict[str, float]:
        state = TlsResumption() if resume else None
        await probe(target, "bench", resume=state)  # warm-up (and the first ticket)
        p0, b0 = _counter(None)
        for _ in range(args.probes):
            result = await probe(target, "bench", resume=state)
            assert result.ok, result.message
        p1, b1 = _counter(None)
        return {"bytes": (b1 - b0) / args.probes, "packets": (p1 - p0) / args.probes}

    out["session_ping_plain"] = await _per_session_check(plain, args.probes)
    out["session_ping_tls"] = await _per_session_check(tls, args.probes)
    out["probe_plain"] = await per_probe(plain, False)
    if args.hole_port:
        hole = MqttTarget(**{**base, "port": args.hole_port,  # type: ignore[arg-type]
                             "timeout": MqttTarget().timeout})  # the shipped deadline
        p0, b0 = _counter(None)
        result = await probe(hole, "bench")
        assert result.reason == "timeout", result.message
        p1, b1 = _counter(None)
        out["probe_blackholed"] = {"bytes": b1 - b0, "packets": p1 - p0}
    out["probe_tls_full"] = await per_probe(tls, False)
    out["probe_tls_resumed"] = await per_probe(tls, True)

    link = Link(MqttTarget(**{**base, "keepalive": 1.0}), "bench")  # type: ignore[arg-type]
    task = asyncio.create_task(link.run())
    async with compat.timeout(10):
        await link.wait_up()
    conn = link._conn  # the bench reads the MQTT-level byte counter
    assert conn is not None
    tx0 = conn.byte_counts[1]
    p0, b0 = _counter(None)
    await asyncio.sleep(args.link_seconds)
    p1, b1 = _counter(None)
    pings = (conn.byte_counts[1] - tx0) / 2  # PINGREQ is 2 bytes; nothing else was sent
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await link.close()
    out["keepalive_round"] = {"bytes": (b1 - b0) / pings, "packets": (p1 - p0) / pings,
                              "pings": pings}
    return out


def per_day(m: dict[str, Any]) -> dict[str, float]:
    """Bytes a day with the shipped defaults (read from the settings, not copied here)."""
    from edgeheal.config import MqttTarget

    defaults = MqttTarget()
    interval = defaults.interval or 60.0
    probes = DAY / interval
    pings = DAY / defaults.keepalive

    def tunnel(key: str, per_day: float = probes) -> float:
        return per_day * (m[key]["bytes"] + WG_OVERHEAD * m[key]["packets"])

    alert_link = pings * m["keepalive_round"]["bytes"]
    out = {
        "tunnel_session_plain": tunnel("session_ping_plain"),
        "tunnel_session_tls": tunnel("session_ping_tls"),
        "tunnel_probe_plain": tunnel("probe_plain"),
        "tunnel_probe_tls_resumed": tunnel("probe_tls_resumed"),
        "tunnel_probe_tls_full": tunnel("probe_tls_full"),
        "alert_link_keepalive": alert_link,
        "example_config_plain": tunnel("session_ping_plain") + alert_link,
        "example_config_tls": tunnel("session_ping_tls") + alert_link,
        # before the kept-open session: a new connection per probe, same keepalive
        "example_config_plain_connect_per_probe": tunnel("probe_plain") + alert_link,
    }
    if "probe_blackholed" in m:
        # during a tunnel blackhole: a probe every timeout + retry_interval while the agent
        # retries quickly, then every interval; the direct alert link is unaffected
        quick = DAY / (defaults.timeout + (defaults.retry_interval or interval))
        out["fault_tunnel_probe_quick"] = tunnel("probe_blackholed", quick)
        out["fault_example_config_quick"] = out["fault_tunnel_probe_quick"] + alert_link
        out["fault_example_config_after_quick"] = tunnel("probe_blackholed") + alert_link
    return out


def measure(probes: int = 20, link_seconds: float = 3.5) -> dict[str, Any]:
    from edgeheal.lab.mosquitto import Mosquitto
    from edgeheal.lab.netns import Sandbox

    with tempfile.TemporaryDirectory() as tmp, Sandbox() as sb:
        ns = sb.netns("mb")
        broker = Mosquitto(sb, Path(tmp), ns=ns, users={"edge": "bench-pw"}, tls=True)
        broker.start()
        hole = broker.port + 1 if broker.port < 65000 else broker.port - 1
        ports = f"{{ {broker.port}, {broker.tls_port}, {hole} }}"
        sb.nft(ns, "table inet ehcount {\n counter mqtt { }\n chain out {\n"
                   "  type filter hook output priority 0;\n"
                   f"  tcp dport {ports} counter name mqtt\n"
                   f"  tcp sport {ports} counter name mqtt\n }}\n"
                   "  chain in {\n  type filter hook input priority 0;\n"
                   f"  tcp dport {hole} drop\n }}\n}}\n")
        argv = ["ip", "netns", "exec", ns, sys.executable, __file__, "--inner",
                "--port", str(broker.port), "--tls-port", str(broker.tls_port),
                "--ca-file", broker.ca_file, "--password-file",
                broker.password_file_for("edge"), "--probes", str(probes),
                "--link-seconds", str(link_seconds), "--hole-port", str(hole)]
        began = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"bench workload failed: {done.stderr[-2000:]}")
        measured = json.loads(done.stdout)
        return {"measured": measured, "per_day_bytes": per_day(measured),
                "budget_bytes_per_day": BUDGET, "healthy_budget_bytes_per_day": HEALTHY_BUDGET,
                "seconds": round(time.monotonic() - began, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--link-seconds", type=float, default=3.5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tls-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ca-file", help=argparse.SUPPRESS)
    parser.add_argument("--password-file", help=argparse.SUPPRESS)
    parser.add_argument("--hole-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(asyncio.run(_inner(args))))
        return 0
    result = measure(args.probes, args.link_seconds)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for key, value in result["measured"].items():
        print(f"{key:20s} {value['bytes']:8.0f} bytes  {value['packets']:5.1f} packets")
    for key, value in result["per_day_bytes"].items():
        print(f"{key:26s} {value / 1e6:7.2f} MB/day")
    return 0


if __name__ == "__main__":
    sys.exit(main())
