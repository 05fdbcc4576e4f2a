"""Reachability: one MQTT CONNECT probe per configured broker, both paths at once, each
under its own deadline (:func:`edgeheal.boundaries.mqtt.probe`: CONNECT, CONNACK, DISCONNECT)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from edgeheal.tools.doctor.finding import Finding, fail, ok, skip

if TYPE_CHECKING:
    from edgeheal.config import Config, MqttTarget
    from edgeheal.tools.doctor.system import System

LIMIT = 4.0
"""Longest one probe may take, seconds (less when the target's own timeout is shorter)."""

FIXES = {
    "refused": "the broker rejected the credentials or client id: check username, "
               "password_file and the broker's ACL",
    "tls_error": "check ca_file, server_name and the clock (see time above)",
    "timeout": "the broker did not answer: check the path (firewall, tunnel) and the port",
    "unreachable": "nothing answers at that address and port: check host, port and routes",
    "protocol_error": "that port does not speak MQTT: check port and tls",
    "config_error": "fix the named setting or file",
}


async def brokers(config: Config, system: System) -> list[Finding]:
    targets = list(config.mqtt.targets)
    if not targets:
        return [skip("mqtt", "no [[mqtt.targets]] configured")]
    results = await asyncio.gather(*(_one(config, t, system) for t in targets))
    tunnel_down = [t.name for t, r in zip(targets, results, strict=True)
                   if t.path == "tunnel" and r.result.value == "fail"]
    direct_up = any(t.path == "direct" and r.result.value == "ok"
                    for t, r in zip(targets, results, strict=True))
    if tunnel_down and direct_up:  # the difference between the paths is the diagnosis
        results = [r if r.check != "mqtt.tunnel" or r.result.value != "fail" else
                   fail(r.check, r.found + " while the direct path answers: the tunnel is "
                        "at fault", r.fix + "; see the wireguard rows and `edgeheal "
                        "diagnose`", **r.detail) for r in results]
    return list(results)


async def _one(config: Config, target: MqttTarget, system: System) -> Finding:
    name = f"mqtt.{target.path}"
    limit = min(LIMIT, target.timeout)
    result = await system.mqtt_probe(target, config.node, limit)
    where = f"{target.name} ({target.host}:{target.port})"
    detail = {"target": target.name, "reason": result.reason}
    if result.ok:
        rtt = result.rtt_seconds or 0.0
        return ok(name, f"{where}: CONNACK in {rtt * 1000:.0f} ms", **detail,
                  rtt_seconds=rtt)
    return fail(name, f"{result.reason}: {result.message}",
                FIXES.get(result.reason, "see the message; the agent logs more"), **detail)
