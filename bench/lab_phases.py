"""The lab benchmarks that need a whole world: detection, footprint, ten edges, /readyz.

    python bench/lab_phases.py detection|footprint|edges|readyz --out FILE.json [--quick]

Each phase builds its own :class:`labkit.BenchWorld` (so phases can run as parallel
processes without sharing a namespace switch), observes the real agent from outside as an
operator would (``/status`` every 0.25 s, a TCP probe through the tunnel, ``/proc`` of the
``edgeheal run`` process, nft counters), writes raw figures as JSON for ``bench/run.py``,
and always closes the world, also on SIGTERM. Needs root.

- ``detection``: one edge, agent with offload enforcement off. Lost peer (the stuck-Flannel
  fault; the agent then restarts the Flannel pod, which also times decision -> traffic),
  blackhole (the carrier drops everything), and the incident: TX offload turned back on,
  so every rekey is corrupted and the session dies at 180 s.
- ``footprint``: one edge, agent on the *default* config (every feature on), collector
  stopped: RSS/PSS/CPU over the window, the uplink bytes of all probing (nft counters), the
  highest handshake age of a healthy tunnel.
- ``readyz``: one edge, lab config (checks every second): ``/readyz`` under ``wrk`` at
  500 requests/s.
- ``edges``: ten edges in one world: each agent's RSS/PSS/CPU, then a blackhole on one
  edge and a lost peer on another at the same moment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import labkit
from labkit import BenchWorld, Recorder, TunnelProbe, wg_is

from edgeheal.lab.netns import run, stop_process
from edgeheal.lab.world import KEEPALIVE, Edge

SETTLE = 90.0
GRACE = 35.0
"""Seconds of agent uptime before a fault: past the lab's startup_grace (10 s) and past
``uplink_settle`` (30 s), which also runs from the direct path's first ``ok`` after the
agent starts; a fault before then measures start-up, not steady state."""


async def settle(rec: Recorder) -> None:
    await rec.until(wg_is("ok"), SETTLE, "healthy tunnel")
    await rec.until(lambda s: s.uptime >= GRACE, SETTLE, f"{GRACE:g}s of uptime")


# --- detection ---------------------------------------------------------------------------

async def lost_peer(world: BenchWorld, edge: Edge, rec: Recorder) -> dict[str, Any]:
    probe = TunnelProbe(edge.ns, world.mqtt_port, period=0.1, timeout=0.3).start()
    try:
        prior = _newest(rec.last.actions if rec.last else [])
        t0, w0 = time.monotonic(), time.time()
        await asyncio.to_thread(world.remove_cloud_peer, edge)
        failed = await rec.until(wg_is("failed"), 30, "failed after the peer was removed", t0)
        acted = await rec.until(lambda s: _newest(s.actions) not in (None, prior), 90,
                                "a restart in /status actions", t0)
        stamp = _newest(acted.actions)
        decision = _wall(str(stamp))
        flowing = await _until_value(lambda: probe.first_ok(decision), 90,
                                     "traffic through the tunnel again")
        done = await rec.until(lambda s: _newest(s.actions) == stamp
                               and s.actions[0].get("result") != "in_progress",
                               90, "the restart's result", t0)
        ok = await rec.until(wg_is("ok"), 90, "wireguard ok again", failed.mono)
        return {"detect": failed.mono - t0, "reason": failed.checks["wireguard"][1],
                "decision_after_fault": decision - w0, "traffic": flowing - decision,
                "ok_after_decision": ok.wall - decision,
                "result": done.actions[0].get("result"),
                "restart_duration": done.actions[0].get("duration_seconds")}
    finally:
        await probe.stop()


async def blackhole(world: BenchWorld, edge: Edge, rec: Recorder) -> dict[str, Any]:
    t0 = time.monotonic()
    hs = rec.last_handshake(t0)
    await asyncio.to_thread(world.uplink_down, edge, True)
    try:
        first = await rec.until(lambda s: s.checks.get("wireguard", ("ok",))[0] != "ok", 60,
                                "a non-ok wireguard", t0)
        failed = await rec.until(wg_is("failed"), 60, "failed in a blackhole", t0)
    finally:
        await asyncio.to_thread(world.uplink_down, edge, False)
    await rec.until(wg_is("ok"), 120, "ok after the blackhole", time.monotonic())
    return {"detect": failed.mono - t0, "first_non_ok": first.mono - t0,
            "reason": failed.checks["wireguard"][1],
            "age_at_fault": None if hs is None else t0 - hs,
            "age_alert_180": None if hs is None else hs + 180 - t0,
            "age_alert_135": None if hs is None else hs + 135 - t0}


async def incident(world: BenchWorld, edge: Edge, rec: Recorder) -> dict[str, Any]:
    probe = TunnelProbe(edge.ns, world.mqtt_port, period=0.5, timeout=0.5).start()
    try:
        t0 = time.monotonic()
        hs = rec.last_handshake(t0)
        await asyncio.to_thread(world.set_uplink_offload, edge, True)
        warn = await rec.until(wg_is("degraded", "rekey_failing"), 240, "rekey_failing", t0)
        failed = await rec.until(wg_is("failed"), 120, "failed (dead)", t0)
        # the age rules, read off the same samples (the tunnel is dead: ages keep growing)
        a135 = await rec.until(lambda s: s.age is not None and s.age >= 135, 30, "age 135", t0)
        a180 = await rec.until(lambda s: s.age is not None and s.age >= 180, 60, "age 180", t0)
        outage = next((m for _, m, ok in probe.results if not ok and m >= t0), None)
        corrupted = sum(1 for e in world.nic_events(edge) if e["event"] == "corrupted")
        base = hs if hs is not None else t0
        return {"age_at_fault": None if hs is None else t0 - hs,
                "warn": warn.mono - base, "warn_reason": warn.checks["wireguard"][1],
                "detect": failed.mono - base, "reason": failed.checks["wireguard"][1],
                "age_alert_135": a135.mono - base, "age_alert_180": a180.mono - base,
                "traffic_stopped": None if outage is None else outage - base,
                "floor_warn": 120 + KEEPALIVE + 5.0, "floor_dead": 180.0,
                "corrupted": corrupted, "csum_errors": world.cloud_in_csum_errors()}
    finally:
        await probe.stop()


async def detection(workdir: Path, quick: bool) -> dict[str, Any]:
    world = BenchWorld(workdir, edges=1, agent=True, offload_on_at_boot=False, enforce=False)
    rec: Recorder | None = None
    out: dict[str, Any] = {"keepalive": KEEPALIVE, "lost_peer": [], "blackhole": []}
    try:
        await world.build()
        edge = world.edges[0]
        world.start_agent(edge)
        rec = Recorder(world, edge).start()
        await settle(rec)
        for _ in range(1 if quick else 2):
            out["lost_peer"].append(await lost_peer(world, edge, rec))
            stamp = _newest(rec.last.actions if rec.last else [])
            # the next restart is allowed once the cooldown (20 s) has passed
            await rec.until(labkit.wall_after(_wall(str(stamp)) + 22), 60, "the cooldown")
        for _ in range(1 if quick else 3):
            out["blackhole"].append(await blackhole(world, edge, rec))
        if not quick:
            out["incident"] = await incident(world, edge, rec)
    finally:
        if rec is not None:
            await rec.stop()
        await world.close()
    return out


# --- footprint, probing bytes, /readyz under load ------------------------------------------

WRK_SCRIPT = """\
-- about RATE requests/s: each of CONNS connections waits DELAY ms between requests
function delay() return %(delay)d end
function done(summary, latency, requests)
  io.write(string.format('{"requests": %%d, "duration_us": %%d, "errors": %%d, '
    .. '"p50_us": %%d, "p90_us": %%d, "p99_us": %%d, "max_us": %%d}\\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.status + summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def wrk(edge: Edge, seconds: int, rate: int, workdir: Path) -> dict[str, Any]:
    conns = 20
    script = workdir / "readyz.lua"
    # each connection's cycle is its delay plus about a millisecond of latency
    script.write_text(WRK_SCRIPT % {"delay": conns * 1000 // rate - 1})
    proc = run(["wrk", "-t", "2", "-c", str(conns), "-d", f"{seconds}s",
                       "-s", str(script), f"http://127.0.0.1:{labkit.agent_port()}/readyz"],
                      ns=edge.ns, timeout=seconds + 60)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    doc: dict[str, Any] = json.loads(line)
    doc["rate"] = doc["requests"] / (doc["duration_us"] / 1e6)
    doc["connections"] = conns
    return doc


async def footprint(workdir: Path, quick: bool) -> dict[str, Any]:
    window = 60.0 if quick else 600.0
    # every feature on: the edge's uplink is a modem (stand-in ModemManager), so the uplink
    # check and ladder run too, on the shipped defaults
    world = BenchWorld(workdir, edges=1, agent=True, offload_on_at_boot=False, defaults=True,
                       modem=True)
    rec: Recorder | None = None
    out: dict[str, Any] = {"window": window, "uplink_feature": True}
    try:
        await world.build()
        edge = world.edges[0]
        stop_process(edge.collector)  # only the agent's probing on the uplink
        labkit.count_uplink(world, edge)
        world.start_agent(edge)
        rec = Recorder(world, edge, period=1.0).start()
        await rec.until(lambda s: all(st == "ok" for st, _ in s.checks.values())
                        and s.uptime >= 15, SETTLE, "every check ok")
        pid = labkit.agent_pid(edge)
        first = labkit.proc_sample(pid)
        c0 = await asyncio.to_thread(labkit.read_counters, edge)
        samples = [first]
        while time.monotonic() - first["mono"] < window:
            await asyncio.sleep(min(10.0, window - (time.monotonic() - first["mono"])))
            samples.append(labkit.proc_sample(pid))
        c1 = await asyncio.to_thread(labkit.read_counters, edge)
        last = samples[-1]
        span = last["mono"] - first["mono"]
        delta = {k: (c1[k][0] - c0[k][0], c1[k][1] - c0[k][1]) for k in c1}
        direct = delta["direct_out"][1] + delta["direct_in"][1]
        inner_packets = delta["inner_out"][0] + delta["inner_in"][0]
        inner = delta["inner_out"][1] + delta["inner_in"][1] + labkit.WG_FRAMING * inner_packets
        healthy = [s for s in rec.samples if s.mono >= first["mono"]]
        out.update({
            "span": span, "cpu_percent": labkit.cpu_percent(first, last),
            "rss_mb": [s["rss_mb"] for s in samples], "pss_mb": [s["pss_mb"] for s in samples],
            "counters": delta, "direct_bytes": direct, "tunnel_bytes": inner,
            "bytes_per_day": (direct + inner) / span * 86400,
            "wg_udp_bytes_per_day": delta["wg_udp"][1] / span * 86400,
            "max_healthy_age": max((s.age for s in healthy if s.age is not None), default=None),
            "not_ok_samples": sum(1 for s in healthy
                                  if any(st != "ok" for st, _ in s.checks.values())),
        })
    finally:
        if rec is not None:
            await rec.stop()
        await world.close()
    return out


async def readyz(workdir: Path, quick: bool) -> dict[str, Any]:
    """``/readyz`` under ``wrk`` at 500 requests/s on a lab edge whose checks run every
    second; run last, when the other benchmarks' worlds are gone."""
    world = BenchWorld(workdir, edges=1, agent=True, offload_on_at_boot=False)
    rec: Recorder | None = None
    try:
        await world.build()
        edge = world.edges[0]
        world.start_agent(edge)
        rec = Recorder(world, edge, period=1.0).start()
        await settle(rec)
        began = time.monotonic()
        pid = labkit.agent_pid(edge)
        runs = []
        for _ in range(1 if quick else 3):
            before = labkit.proc_sample(pid)
            run_ = await asyncio.to_thread(wrk, edge, 10 if quick else 20, 500, workdir)
            after = labkit.proc_sample(pid)
            run_["agent_cpu_percent"] = labkit.cpu_percent(before, after)
            run_["loadavg"] = labkit.loadavg()
            runs.append(run_)
        out: dict[str, Any] = {"runs": runs, "wireguard_during": rec.wg()}
        out["checks_not_ok"] = sorted({n for smp in rec.samples if smp.mono >= began
                                       for n, (st, _) in smp.checks.items() if st != "ok"})
    finally:
        if rec is not None:
            await rec.stop()
        await world.close()
    return out


# --- ten edges -----------------------------------------------------------------------------

async def edges(workdir: Path, quick: bool, count: int = 10) -> dict[str, Any]:
    window = 30.0 if quick else 60.0
    world = BenchWorld(workdir, edges=count, agent=True, offload_on_at_boot=False)
    recs: list[Recorder] = []
    out: dict[str, Any] = {"edges": count, "window": window}
    try:
        began = time.monotonic()
        await world.build()
        out["build_seconds"] = time.monotonic() - began
        for edge in world.edges:
            world.start_agent(edge)
        recs = [Recorder(world, e, period=0.5).start() for e in world.edges]
        for rec in recs:
            await settle(rec)
        out["settled_seconds"] = time.monotonic() - began
        pids = [labkit.agent_pid(e) for e in world.edges]
        firsts = [labkit.proc_sample(p) for p in pids]
        await asyncio.sleep(window)  # the measurement window itself
        lasts = [labkit.proc_sample(p) for p in pids]
        out["agents"] = [{"rss_mb": b["rss_mb"], "pss_mb": b["pss_mb"],
                          "cpu_percent": labkit.cpu_percent(a, b)}
                         for a, b in zip(firsts, lasts, strict=True)]
        # two faults at the same moment on two edges; the rest must stay ok
        black, lost = world.edges[0], world.edges[1]
        t0 = time.monotonic()
        await asyncio.to_thread(world.uplink_down, black, True)
        await asyncio.to_thread(world.remove_cloud_peer, lost)
        try:
            got_b = await recs[0].until(wg_is("failed"), 60, "blackhole failed", t0)
            got_l = await recs[1].until(wg_is("failed"), 60, "lost peer failed", t0)
        finally:
            await asyncio.to_thread(world.uplink_down, black, False)
        out["blackhole"] = {"detect": got_b.mono - t0, "reason": got_b.checks["wireguard"][1]}
        out["lost_peer"] = {"detect": got_l.mono - t0, "reason": got_l.checks["wireguard"][1]}
        out["others_not_ok"] = sorted({r.edge.name for r in recs[2:] for s in r.samples
                                       if s.mono >= t0
                                       and s.checks.get("wireguard", ("ok",))[0] != "ok"})
    finally:
        for rec in recs:
            await rec.stop()
        await world.close()
    return out


def _newest(actions: list[dict[str, Any]]) -> str | None:
    """The time stamp of the newest action (/status lists them newest first)."""
    return str(actions[0].get("time")) if actions else None


def _wall(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


async def _until_value(get: Any, within: float, what: str) -> float:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = get()
        if value is not None:
            return float(value)
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no {what} within {within:g}s")


PHASES = {"detection": detection, "footprint": footprint, "edges": edges, "readyz": readyz}


def _terminate(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("phase", choices=sorted(PHASES))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)  # unwinds through every world.close()
    return labkit.run_bench(args.phase, lambda w: PHASES[args.phase](w, args.quick), args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
