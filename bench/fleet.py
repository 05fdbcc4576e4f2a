"""The restart storm of a hub fault, counted: without the fleet hold, with the operator's,
with the automatic one.

    python bench/fleet.py [--edges 5] [--fault 120] [--modes none,operator,auto]
                          [--defaults] [--keep-firing-for 20s]
                          [--out fleet.json]                  (root: it builds lab worlds)

Each mode builds a fresh lab world (:mod:`edgeheal.lab.world`: N edges on real
wireguard-go tunnels to one hub, one Mosquitto, the test K3s API and the stand-in Flannel
that rebuilds an edge's tunnel device whenever its Flannel pod is replaced) with a real
agent per edge on the lab's tuning plus ``[fleet] hold = true``, waits for every tunnel to
be ok, then breaks the hub's side: the hub drops every WireGuard packet it receives (an
nftables rule in the cloud namespace, its firewall), for ``--fault`` seconds, while every
edge's direct path keeps working. Then it lifts the fault and watches the edges recover.

- ``none``: no hold: each edge's ladder restarts Flannel up to ``give_up_after`` (3).
- ``operator``: ``edgeheal fleet hold --for 30m`` published the moment the fault starts (a
  planned hub maintenance), ``edgeheal fleet release`` after the recovery.
- ``auto``: a real Prometheus in the cloud scrapes every agent's ``/metrics`` (every 1 s)
  and evaluates the shipped ``EdgehealHubFaultFleetwide`` rule (every 1 s); a real
  Alertmanager routes it with the shipped route to ``edgeheal fleet receive``. The rule's
  ``for:`` is scaled to the lab's tuning: the shipped 1 m is half the shipped ``cooldown``
  (2 m), and the lab's cooldown is 20 s, so 10 s; its ``keep_firing_for`` (a shipped
  cooldown) likewise 20 s (``--keep-firing-for`` sets another); the route's
  ``group_interval`` is 1 s.

Counted, from the cloud's side: Flannel pod replacements (what the K3s API server
suffers: each one is a pod deletion and a tunnel rebuild) during the fault and after it;
the time from the fault to the hold being heard by every agent (``/status``); the time
from the lift to every tunnel ok. In the first mode also, healthy, per node: ``/metrics``
series and bytes per scrape, broker messages and bytes (everything under ``edgeheal/#``,
from the lab's subscriber) extrapolated to a day, agent RSS and CPU. Results go to
``--out`` (JSON) and into docs/benchmarks.md by hand.

``--defaults``: every agent on the shipped config (plus the fleet hold), the shipped rule
and route unchanged, Prometheus scraping and evaluating every 15 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit import BenchWorld, agent_pid, cpu_percent, loadavg, proc_sample, run_bench

from edgeheal.lab import nsutil
from edgeheal.lab.world import AGENT_PORT, WG_PORT, Edge

ROOT = Path(__file__).resolve().parents[1]
ALERT = "EdgehealHubFaultFleetwide"
LAB_FOR = "10s"
LAB_KEEP = "20s"
"""The shipped ``keep_firing_for`` (2 m, a shipped cooldown) at the lab's cooldown."""
FLEET = '\n[fleet]\nhold = true\nmax_hold = "2h"\n'
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"


class FleetWorld(BenchWorld):
    """The lab world; each agent also listens on its uplink address (the cloud's
    Prometheus scrapes it there) and obeys the fleet hold."""

    keep_firing_for = LAB_KEEP
    """The fleet rule's ``keep_firing_for`` at the lab's tuning (``--keep-firing-for``)."""

    def agent_config(self, edge: Edge, *, remediation: str = "pod", extra: str = "") -> str:
        text = super().agent_config(edge, remediation=remediation, extra=extra + FLEET)
        if self.defaults:  # the shipped config takes no extra: the table goes at the end
            text += FLEET
        old = f'listen = ["127.0.0.1:{AGENT_PORT}"]'
        assert old in text
        return text.replace(old, f'listen = ["127.0.0.1:{AGENT_PORT}", '
                                 f'"{edge.edge_ip}:{AGENT_PORT}"]')


def _wg_ok(world: FleetWorld, edge: Edge) -> bool:
    doc = world.status(edge) or {}
    return bool((doc.get("checks") or {}).get("wireguard", {}).get("state") == "ok")


def _held(world: FleetWorld, edge: Edge) -> bool:
    doc = world.status(edge) or {}
    return bool((doc.get("remediation") or {}).get("fleet_hold"))


async def _until_all(world: FleetWorld, probe: Any, within: float, what: str,
                     ) -> dict[str, float]:
    """edge name -> seconds until ``probe(world, edge)`` first held, for every edge."""
    began, seen = time.monotonic(), {}
    while len(seen) < len(world.edges):
        if time.monotonic() - began > within:
            missing = [e.name for e in world.edges if e.name not in seen]
            raise RuntimeError(f"{what}: not within {within:g}s on {missing}")
        for edge in world.edges:
            if edge.name not in seen and await asyncio.to_thread(probe, world, edge):
                seen[edge.name] = time.monotonic() - began
        await asyncio.sleep(0.5)
    return seen


def _replacements(world: FleetWorld) -> dict[str, int]:
    return {e.name: e.device_builds for e in world.edges}


def _ops_config(world: FleetWorld) -> Path:
    path = world.workdir / "ops.toml"
    path.write_text(f'[agent]\nnode_name = "ops"\nstate_dir = "{world.workdir}/ops-state"\n'
                    f'[[mqtt.targets]]\nname = "cloud"\nhost = "127.0.0.1"\n'
                    f'port = {world.mqtt_port}\n[alerts]\ntarget = "cloud"\n'
                    '[fleet]\nmax_hold = "2h"\n')
    return path


def _fleet_cli(world: FleetWorld, *args: str) -> None:
    proc = subprocess.run(["ip", "netns", "exec", world.cloud, sys.executable, "-m",
                           "edgeheal", "--config", str(_ops_config(world)), "fleet", *args],
                          capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"fleet {args[0]}: {proc.stderr.strip()}")


def _free_port(ns: str) -> int:
    with nsutil.inside(ns):
        sock = socket.socket()
    with sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_alerting(world: FleetWorld) -> tuple[Path, Any]:
    """Prometheus, Alertmanager and the receiver in the cloud; the receiver's log and
    Prometheus (its process and port, for its own cost). At the shipped defaults
    (``world.defaults``) the rule and the route are the shipped ones and Prometheus scrapes
    and evaluates every 15 s."""
    every = "15s" if world.defaults else "1s"
    work = world.workdir / "alerting"
    (work / "prom").mkdir(parents=True)
    (work / "am").mkdir()
    receiver_port, am_port, prom_port = (_free_port(world.cloud) for _ in range(3))
    token = work / "token"
    token.write_text(os.urandom(16).hex() + "\n")
    log = work / "receive.log"
    world.sandbox.spawn([sys.executable, "-m", "edgeheal", "--config",
                         str(_ops_config(world)), "fleet", "receive", "--listen",
                         f"127.0.0.1:{receiver_port}", "--for", "30m", "--token-file",
                         str(token)], ns=world.cloud, log_path=log)
    route = yaml.safe_load((ROOT / "monitoring" / "alertmanager" / "fleet-hold.yaml")
                           .read_text())
    if not world.defaults:
        route["route"]["routes"][0]["group_interval"] = "1s"
    hook = route["receivers"][1]["webhook_configs"][0]
    hook["url"] = f"http://127.0.0.1:{receiver_port}/alertmanager"
    hook["http_config"]["authorization"]["credentials_file"] = str(token)
    (work / "am" / "alertmanager.yml").write_text(yaml.safe_dump(route))
    world.sandbox.spawn([ALERTMANAGER, f"--config.file={work / 'am' / 'alertmanager.yml'}",
                         f"--storage.path={work / 'am'}",
                         f"--web.listen-address=127.0.0.1:{am_port}",
                         "--cluster.listen-address=", "--log.level=warn"],
                        ns=world.cloud, log_path=work / "am" / "log")
    rules = yaml.safe_load((ROOT / "monitoring" / "alerts.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == ALERT and not world.defaults:
                rule["for"], rule["keep_firing_for"] = LAB_FOR, world.keep_firing_for
    (work / "prom" / "alerts.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    (work / "prom" / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": every, "evaluation_interval": every,
                   "scrape_timeout": "1s"},
        "rule_files": [str(work / "prom" / "alerts.yaml")],
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "edgeheal", "static_configs": [
            {"targets": [f"{e.edge_ip}:{AGENT_PORT}" for e in world.edges]}]}]}))
    prom = world.sandbox.spawn([PROMETHEUS,
                                f"--config.file={work / 'prom' / 'prometheus.yml'}",
                                f"--storage.tsdb.path={work / 'prom' / 'data'}",
                                f"--web.listen-address=127.0.0.1:{prom_port}",
                                "--log.level=warn"],
                               ns=world.cloud, log_path=work / "prom" / "log")
    return log, (prom, prom_port)


PROM_SELF = ("prometheus_tsdb_head_series", "prometheus_tsdb_head_samples_appended_total",
             "process_resident_memory_bytes", "go_memstats_heap_inuse_bytes")


def _cloud_cost(world: FleetWorld, prom: Any) -> dict[str, Any]:
    """What the fleet costs the cloud's side right now: Prometheus's own figures (its
    ``/metrics``: head series, samples appended, RSS, Go heap in use) and Mosquitto's RSS
    and CPU seconds (``/proc``). Called twice, the difference gives the ingest rate."""
    proc, port = prom
    out: dict[str, Any] = {"mono": time.monotonic()}
    for attempt in range(30):  # Prometheus may still be starting: 30 tries, 1 s apart
        try:
            status, body = nsutil.http_get(world.cloud, "127.0.0.1", port, "/metrics")
        except OSError as err:
            out["prometheus_error"] = f"{err} (after {attempt + 1} tries)"
            time.sleep(1.0)
            continue
        out.pop("prometheus_error", None)
        for line in body.decode(errors="replace").splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if status == 200 and name in PROM_SELF:  # summed over labels (type="float")
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        break
    out["prometheus_pid_rss_mb"] = round(proc_sample(proc.pid)["rss_mb"], 1)
    assert world.broker is not None
    assert world.broker.proc is not None
    broker = proc_sample(world.broker.proc.pid)
    out["mosquitto_rss_mb"] = round(broker["rss_mb"], 1)
    out["mosquitto_cpu_seconds"] = broker["cpu_seconds"]
    return out


def _hub_fault(world: FleetWorld, on: bool) -> None:
    if on:
        world.sandbox.nft(world.cloud, "table inet bench_hub {\n chain inp {\n"
                          "  type filter hook input priority -10;\n"
                          f"  udp dport {WG_PORT} drop\n }}\n}}\n")
    else:
        subprocess.run(["ip", "netns", "exec", world.cloud, "nft", "delete", "table",
                        "inet", "bench_hub"], check=False, capture_output=True, timeout=10)


def _broker_lines(world: FleetWorld) -> list[str]:
    try:
        return world.alerts_path.read_text(errors="replace").splitlines()
    except OSError:
        return []


async def _cost(world: FleetWorld, seconds: float) -> dict[str, Any]:
    """Healthy, per node: /metrics, broker messages, RSS, CPU over ``seconds``."""
    pids = {e.name: agent_pid(e) for e in world.edges}
    first = {n: proc_sample(p) for n, p in pids.items()}
    lines0 = len(_broker_lines(world))
    began = time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - began
    last = {n: proc_sample(p) for n, p in pids.items()}
    new = _broker_lines(world)[lines0:]
    scrapes = []
    for edge in world.edges:
        status, body = await asyncio.to_thread(nsutil.http_get, edge.ns, "127.0.0.1",
                                               AGENT_PORT, "/metrics")
        assert status == 200
        series = [x for x in body.decode().splitlines() if x and not x.startswith("#")]
        scrapes.append((len(series), len(body)))
    per_day = 86400 / elapsed / len(world.edges)
    return {
        "seconds": round(elapsed, 1),
        "series_per_node": statistics.median(s for s, _ in scrapes),
        "scrape_bytes_per_node": statistics.median(b for _, b in scrapes),
        "broker_messages_per_node_day": round(len(new) * per_day),
        "broker_payload_bytes_per_node_day": round(sum(len(x) for x in new) * per_day),
        "rss_mb_median": round(statistics.median(s["rss_mb"] for s in last.values()), 1),
        "cpu_percent_median": round(statistics.median(
            cpu_percent(first[n], last[n]) for n in pids), 2),
    }


def _fault_cost(world: FleetWorld, lines0: int, prom: Any) -> dict[str, Any]:
    """Broker messages and bytes (topic + payload) per node since line ``lines0`` of the
    lab's subscriber, and the cloud's cost now (with Prometheus)."""
    new = _broker_lines(world)[lines0:]
    out: dict[str, Any] = {
        "broker_messages_per_node_during_fault": round(len(new) / len(world.edges), 1),
        "broker_bytes_per_node_during_fault": round(sum(len(x) for x in new)
                                                    / len(world.edges))}
    out["broker_messages_during_fault_by_kind"] = _by_kind(new)
    if prom is not None:
        out["cloud_end_of_fault"] = _cloud_cost(world, prom)
    return out


def _by_kind(lines: list[str]) -> dict[str, int]:
    """The subscriber's ``topic payload`` lines counted by what they are: ``status`` (the
    retained state), an alert's ``kind``, or the topic's last level (the fleet hold)."""
    counts: dict[str, int] = {}
    for line in lines:
        topic, _, payload = line.partition(" ")
        what = topic.rsplit("/", 1)[-1]
        if what == "alerts":
            try:
                what = str(json.loads(payload).get("kind"))
            except (ValueError, AttributeError):
                what = "alerts (unparsed)"
        counts[what] = counts.get(what, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


async def _timeline(world: FleetWorld, t0: float, receiver_log: Path | None,
                    out: dict[str, Any]) -> None:
    """Every 0.25 s: seconds after ``t0`` of each Flannel pod replacement (all, and by
    edge), and of the receiver's first "fleet hold set" and "released" lines."""
    seen = _replacements(world)
    restarts: list[float] = out.setdefault("restart_times_s", [])
    by_edge: dict[str, list[float]] = out.setdefault("restart_times_by_edge_s", {})
    while True:
        now = _replacements(world)
        for name, count in now.items():
            moment = round(time.monotonic() - t0, 1)
            restarts.extend([moment] * (count - seen[name]))
            if count > seen[name]:
                by_edge.setdefault(name, []).extend([moment] * (count - seen[name]))
        seen = now
        if receiver_log is not None and "hold_released_s" not in out:
            text = await asyncio.to_thread(receiver_log.read_text, errors="replace")
            if "hold_set_s" not in out and "fleet hold set until" in text:
                out["hold_set_s"] = round(time.monotonic() - t0, 1)
            if "hold_set_s" in out and "fleet hold released" in text:
                out["hold_released_s"] = round(time.monotonic() - t0, 1)
        await asyncio.sleep(0.25)


async def _bring_up(world: FleetWorld) -> dict[str, float]:
    """Build the world and start every agent; how long each took (the setup's cost)."""
    began = time.monotonic()
    await world.build()
    built = time.monotonic() - began
    for edge in world.edges:
        world.start_agent(edge)
    # a busy shared machine brings 20 or more tunnels up slowly: 9 s an edge, 3 min least
    up = await _until_all(world, _wg_ok, max(180, 9 * len(world.edges)),
                          "tunnels ok at start")
    return {"build_s": round(built, 1), "tunnels_ok_after_agents_s": round(max(up.values()), 1)}


async def once(workdir: Path, mode: str, edges: int, fault: float, *, cost: bool,
               defaults: bool = False) -> dict[str, Any]:
    world = FleetWorld(workdir / mode, edges=edges, defaults=defaults)
    result: dict[str, Any] = {"mode": mode, "edges": edges, "fault_seconds": fault,
                              "defaults": defaults, "load_start": loadavg()}
    try:
        result.update(await _bring_up(world))
        receiver_log, prom = _start_alerting(world) if mode == "auto" else (None, None)
        if cost:
            result["healthy"] = await _cost(world, 60)
        if prom is not None:
            result["cloud_healthy"] = await asyncio.to_thread(_cloud_cost, world, prom)
        # past every agent's startup_grace (10 s tuned, 1 m shipped), the rules loaded
        await asyncio.sleep(70 if defaults else 15)
        base = _replacements(world)
        t_fault = time.monotonic()
        _hub_fault(world, True)
        lines0 = _broker_lines(world)
        sampler = asyncio.create_task(_timeline(world, t_fault, receiver_log, result),
                                      name="bench.timeline")
        if mode == "operator":
            await asyncio.to_thread(_fleet_cli, world, "hold", "--for", "30m", "--reason",
                                    "hub maintenance", "--by", "bench")
        if mode != "none":
            heard = await _until_all(world, _held, fault, "the hold heard")
            result["hold_heard_s"] = {"median": round(statistics.median(heard.values()), 1),
                                      "max": round(max(heard.values()), 1)}
        if receiver_log is not None:
            text = receiver_log.read_text(errors="replace")
            result["receiver_said_hold"] = "fleet hold set until" in text
        await asyncio.sleep(max(0.0, fault - (time.monotonic() - t_fault)))
        during = _replacements(world)
        result.update(await asyncio.to_thread(_fault_cost, world, len(lines0), prom))
        _hub_fault(world, False)
        t_lift = time.monotonic()
        recovered = await _until_all(world, _wg_ok, 300, "tunnels ok after the fault")
        await asyncio.sleep(150 if defaults else 30)  # a late restart would show here
        after = _replacements(world)
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        if mode == "operator":
            await asyncio.to_thread(_fleet_cli, world, "release")
        if mode == "auto":
            released = await _until_all(world, lambda w, e: not _held(w, e), 300,
                                        "the hold released")
            result["release_heard_after_recovery_s"] = round(max(released.values()), 1)
        result.update({
            "restarts_during_fault": {n: during[n] - base[n] for n in base},
            "restarts_after_lift": {n: after[n] - during[n] for n in base},
            "recovery_s": {"median": round(statistics.median(recovered.values()), 1),
                           "max": round(max(recovered.values()), 1)},
            "recovery_by_edge_s": {n: round(s, 1) for n, s in recovered.items()},
            "fault_to_lift_s": round(t_lift - t_fault, 1),
        })
    finally:
        result["load_end"] = loadavg()
        await world.close()
    result["restarts_total_during"] = sum(result.get("restarts_during_fault", {}).values())
    result["restarts_total_after"] = sum(result.get("restarts_after_lift", {}).values())
    print(f"{mode}: {result}", file=sys.stderr, flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=5)
    parser.add_argument("--fault", type=float, default=120.0)
    parser.add_argument("--modes", default="none,operator,auto")
    parser.add_argument("--out", type=Path, default=Path("fleet.json"))
    parser.add_argument("--keep-firing-for", default=LAB_KEEP,
                        help="the fleet rule's keep_firing_for at the lab's tuning "
                        f"(default {LAB_KEEP}; the shipped rule's with --defaults)")
    parser.add_argument("--defaults", action="store_true",
                        help="agents, rule and route on the shipped defaults (Prometheus "
                        "every 15 s)")
    args = parser.parse_args()
    modes = args.modes.split(",")
    FleetWorld.keep_firing_for = args.keep_firing_for
    if not set(modes) <= {"none", "operator", "auto"}:
        parser.error("--modes: a comma-separated subset of none, operator, auto")

    async def measure(workdir: Path) -> dict[str, Any]:
        began = time.monotonic()
        runs = [await once(workdir, m, args.edges, args.fault, cost=i == 0,
                           defaults=args.defaults) for i, m in enumerate(modes)]
        return {"runs": runs, "minutes": round((time.monotonic() - began) / 60, 1)}

    return run_bench("fleet", measure, args.out)


if __name__ == "__main__":
    sys.exit(main())
