"""Run every benchmark and write docs/benchmarks.md (issue 11). Not part of CI.

    python bench/run.py [--quick] [--out FILE]   (as root; full set about 15 minutes)

What runs, each in its own process (a lab world per process: a namespace switch is
per-thread, and one world's teardown must never wait on another's):

- ``bench/lab_phases.py detection``: detection delay per fault (lost peer, blackhole, the
  incident's checksum fault) against the protocol floor and against handshake-age alerts at
  180 s and 135 s read off the same run; decision -> traffic after a Flannel pod restart.
- ``bench/k3s_restart.py``: decision -> traffic in ``k3s-service`` mode (stand-in unit).
- ``bench/onoff.py``: per scenario, the agent on and off *at the same time* in two worlds,
  outage seconds (TCP probe through the tunnel) and collector messages lost in one window.
- ``bench/lab_phases.py footprint``: RSS/PSS/CPU of the lab edge's agent over 10 minutes on
  the default config with every feature on, the uplink bytes of all probing (nft counters,
  collector stopped).
- ``bench/lab_phases.py edges``: ten edges in one lab: per-agent cost, detection delays.
- ``bench/lab_phases.py readyz``, last: ``/readyz`` latency under ``wrk`` at 500
  requests/s while the agent's checks run.
- In this process: the import floor (``bench/footprint.py``) and UAPI read vs
  ``wg show dump`` (``bench/wireguard.py``), before the worlds start.

Detection and readiness latency per fault at the lab's tuning and the shipped defaults is
``bench/readiness.py all`` (its own section of docs/benchmarks.md, kept when this rewrites
the file), as is everything after the ``KEPT`` line.

``--quick`` shortens everything (no incident, one repeat, 1-minute footprint, two
scenarios) to check the machinery in about 4 minutes; its figures are not the results.
The machines are shared and noisy: comparisons are same-run ratios, and the load average
is recorded at start and end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from edgeheal.base import compat
from edgeheal.base.compat import UTC

sys.path.insert(0, str(Path(__file__).resolve().parent))

import footprint
import labkit
import wireguard as wgbench

from edgeheal import settings as validation
from edgeheal.boundaries.wg.health import thresholds
from edgeheal.lab.world import KEEPALIVE

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "docs" / "benchmarks.md"
NONE = "\u2013"
"""An en dash: not measured."""
WINDOWS = {"boot-with-offload": 90.0, "stuck-flannel": 90.0, "modem-reconnect": 200.0,
           "uplink-outage": 150.0, "lossy-link": 90.0, "dead-neighbour": 60.0,
           "flapping-uplink": 180.0, "stuck-modem": 240.0, "no-coverage": 180.0,
           "uplink-failover": 90.0, "stale-nat": 120.0, "agent-stuck": 120.0,
           "node-ip-changed": 120.0}
"""Seconds measured from each scenario's fault, the same for the agent on and off."""
LANES = (("modem-reconnect", "flapping-uplink", "dead-neighbour", "stuck-modem",
          "uplink-failover", "agent-stuck"),
         ("uplink-outage", "boot-with-offload", "stuck-flannel", "lossy-link", "no-coverage",
          "stale-nat", "node-ip-changed"))
KEPT = "<!-- kept: the sections below are written by other benchmarks and by hand -->"
"""docs/benchmarks.md from this line on is kept as it is when this rewrites the file:
bench/readiness.py's section, the uplink ladder's and the stale-nat runs at the shipped
defaults (ten-minute runs measured by hand), the support bundle's cost, the per-issue
before/after sections."""
QUICK_LANES = (("stuck-flannel",), ("boot-with-offload",))
QUICK_WINDOW = 60.0


class Jobs:
    """Child processes, each writing one JSON file; all terminated on the way out."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[asyncio.subprocess.Process] = []
        self.commands: list[str] = []
        self.took: dict[str, float] = {}

    async def run(self, name: str, script: str, *args: str) -> dict[str, Any]:
        out = self.tmp / f"{name}.json"
        argv = [sys.executable, str(HERE / script), *args, "--out", str(out)]
        self.commands.append(" ".join(["python", f"bench/{script}", *args, "--out",
                                       f"{name}.json"]))
        began = time.monotonic()
        print(f"[{_clock()}] start {name}", flush=True)
        log = (self.tmp / f"{name}.log").open("wb")
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
        finally:
            log.close()
        self.procs.append(proc)
        code = await proc.wait()
        self.took[name] = time.monotonic() - began
        print(f"[{_clock()}] done  {name} (exit {code}, {self.took[name]:.0f}s)", flush=True)
        try:
            doc: dict[str, Any] = json.loads(out.read_text())
        except (OSError, ValueError):
            tail = (self.tmp / f"{name}.log").read_text(errors="replace")[-2000:]
            doc = {"ok": False, "error": f"exit {code}, no result; log tail:\n{tail}"}
        if code != 0 and not doc.get("error"):
            doc["error"] = f"exit {code}"
        return doc

    async def terminate(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            if proc.returncode is None:
                try:
                    await asyncio.wait_for(proc.wait(), 60)
                except compat.TimeoutErrors:
                    proc.kill()


async def onoff_lane(jobs: Jobs, names: tuple[str, ...], window: float | None,
                     ) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        w = str(window or WINDOWS[name])
        on, off = await asyncio.gather(
            jobs.run(f"onoff-{name}-on", "onoff.py", name, "--window", w),
            jobs.run(f"onoff-{name}-off", "onoff.py", name, "--window", w, "--no-agent"))
        results[name] = {"on": on, "off": off}
    return results


async def detection_then_edges(jobs: Jobs, quick: bool) -> tuple[dict[str, Any],
                                                                   dict[str, Any]]:
    flag = ["--quick"] if quick else []
    det = await jobs.run("detection", "lab_phases.py", "detection", *flag)
    edges = await jobs.run("edges", "lab_phases.py", "edges", *flag)
    return det, edges


async def run_all(quick: bool, tmp: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"quick": quick, "started": datetime.now(UTC),
                           "load_start": labkit.loadavg()}
    print(f"[{_clock()}] import floor, UAPI read cost", flush=True)
    res["floor"] = {
        "python": footprint.import_floor(["sys"]),
        "runtime deps (aiohttp, prometheus_client, pyroute2, paho)": footprint.import_floor(
            ["aiohttp", "prometheus_client", "pyroute2", "paho.mqtt.client"]),
        "edgeheal.agent.supervisor + edgeheal.agent.endpoints": footprint.import_floor(
            ["edgeheal.agent.supervisor", "edgeheal.agent.endpoints",
             "edgeheal.agent.http_server"]),
    }
    reads = 50 if quick else 300
    res["read_cost"] = await wgbench.read_cost(reads)
    jobs = Jobs(tmp)
    lanes = QUICK_LANES if quick else LANES
    window = QUICK_WINDOW if quick else None
    flag = ["--quick"] if quick else []
    try:
        fp, det_edges, k3s, *lane_results = await asyncio.gather(
            jobs.run("footprint", "lab_phases.py", "footprint", *flag),
            detection_then_edges(jobs, quick),
            jobs.run("k3s", "k3s_restart.py", "--repeats", "1" if quick else "3"),
            *(onoff_lane(jobs, lane, window) for lane in lanes))
        # last and alone (but for whatever else shares the machine): latency under load
        res["readyz"] = await jobs.run("readyz", "lab_phases.py", "readyz", *flag)
    finally:
        await jobs.terminate()
    res.update(footprint=fp, detection=det_edges[0], edges=det_edges[1], k3s=k3s,
               onoff={k: v for lane in lane_results for k, v in lane.items()},
               commands=jobs.commands, took=jobs.took, load_end=labkit.loadavg(),
               finished=datetime.now(UTC))
    return res


# --- rendering ----------------------------------------------------------------------------

def s(x: float | None, digits: int = 1) -> str:
    return NONE if x is None else f"{x:.{digits}f} s"


def ms(x: float | None) -> str:
    return NONE if x is None else f"{x * 1000:.2f} ms"


def med(rows: list[dict[str, Any]], key: str) -> float | None:
    return labkit.median([float(r[key]) for r in rows if r.get(key) is not None])


def spread(rows: list[dict[str, Any]], key: str, unit: str = "s") -> str:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    if not values:
        return NONE
    m = float(labkit.median(values) or 0.0)
    text = f"{m:.1f} {unit}" if unit == "s" else f"{m * 1000:.0f} ms"
    if len(values) > 1:
        lo, hi = min(values), max(values)
        text += (f" ({lo:.1f}-{hi:.1f})" if unit == "s"
                 else f" ({lo * 1000:.0f}-{hi * 1000:.0f})")
    return text


def machine() -> list[str]:
    mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal:")), "0")
    wg = subprocess.run(["wireguard-go", "--version"], capture_output=True, text=True,
                        check=False).stdout.split()
    uname = subprocess.run(["uname", "-a"], capture_output=True, text=True,
                           check=False).stdout.strip()
    return [f"- `uname -a`: `{uname}`",
            f"- nproc: {os.cpu_count()}; memory: {int(mem) / 1024 / 1024:.1f} GiB; "
            f"Python {platform.python_version()}; wireguard-go {wg[1] if len(wg) > 1 else '?'}"]


def render(res: dict[str, Any]) -> str:
    minutes = (res["finished"] - res["started"]).total_seconds() / 60
    lines = [
        "# Benchmarks", "",
        f"Measured {res['started']:%Y-%m-%d %H:%M} UTC by `python bench/run.py"
        f"{' --quick' if res['quick'] else ''}` in {minutes:.1f} minutes"
        + (" — **`--quick`: a check of the machinery, not results**" if res["quick"] else "")
        + ".", "", *machine(),
        f"- load average (1, 5, 15 min) at start {' '.join(res['load_start'])}, "
        f"at end {' '.join(res['load_end'])}. The machine is shared and several lab worlds "
        "run at once (see Commands), so comparisons below are ratios or differences from "
        "the same run.",
        f"- Lab: persistent keepalive K = {KEEPALIVE} s (the field's is 20 to 25 s), agent "
        "checks every 1 s unless stated.", ""]
    lines += _detection(res) + _restart(res) + _onoff(res) + _footprint(res)
    lines += _readyz(res) + _read_cost(res) + _bytes(res) + _edges(res)
    lines += ["## Commands", "", "Run by `bench/run.py` as root, in this order (concurrently "
              "where they overlap; each writes its figures to a temporary JSON file), with "
              "how long each took:", "", "```"]
    lines += [f"{c}    # {res['took'].get(c.split('--out ')[1][:-5], 0):.0f} s"
              for c in res["commands"]]
    lines += ["```", "", "In-process: `bench/footprint.py:import_floor`, "
              f"`bench/wireguard.py:read_cost` ({int(res['read_cost']['reads'])} reads).", ""]
    return "\n".join(lines)


def _failed(doc: dict[str, Any]) -> list[str]:
    return [f"**Not measured**: {doc.get('error', 'no result')}".replace("\n", " "), ""]


def _detection(res: dict[str, Any]) -> list[str]:
    det = res["detection"]
    out = ["## Detection delay per fault", ""]
    if not det.get("ok"):
        return out + _failed(det)
    k = det["keepalive"]
    lp, bh = det["lost_peer"], det["blackhole"]
    out += [
        "One lab edge (real agent, offload enforcement off so the incident can be injected), "
        "`/status` read every 0.25 s. Medians (min-max) over repeats. *Floor*: the earliest "
        "moment any observer of the device could know. *Age alert*: when a rule "
        "\"latest handshake older than N s\" would fire, from the last handshake before "
        "the fault as the same run's samples show it.", "",
        "| fault | n | floor | edgeheal `failed` | age alert 135 s | age alert 180 s |",
        "|---|---|---|---|---|---|",
        f"| lost peer (stuck Flannel) | {len(lp)} | 0.0 s (next read) | "
        f"{spread(lp, 'detect')} | never: the peer is gone, no age to read | never |",
        f"| blackhole (carrier drops all) | {len(bh)} | {k:.1f} s (one keepalive) | "
        f"{spread(bh, 'detect')} | {spread(bh, 'age_alert_135')} | "
        f"{spread(bh, 'age_alert_180')} |"]
    inc = det.get("incident")
    if inc:
        out += [
            f"| incident: checksum fault, warning | 1 | {s(inc['floor_warn'])} | "
            f"{s(inc['warn'])} (`{inc['warn_reason']}`) | {s(inc['age_alert_135'])} | "
            f"{s(inc['age_alert_180'])} |",
            f"| incident: tunnel dead | 1 | {s(inc['floor_dead'])} | {s(inc['detect'])} "
            f"(`{inc['reason']}`) | | |"]
    stall = thresholds(validation.loads("").wireguard, k).rx_stall_after or 0.0
    out += ["", f"Blackhole: edgeheal is {med(bh, 'detect') or 0:.1f} s after the fault, "
            f"{(med(bh, 'detect') or 0) / k:.1f}x the floor (it waits rx_stall_after, "
            f"{stall:g} s at K = {k} s, so a lost keepalive or a late timer is not an outage, "
            "then the debounce); the age "
            f"rules fire {(med(bh, 'age_alert_135') or 0) - (med(bh, 'detect') or 0):.0f} s "
            f"and {(med(bh, 'age_alert_180') or 0) - (med(bh, 'detect') or 0):.0f} s later "
            "(medians; they depend on where in the 120 s rekey cycle the fault lands: the "
            f"handshake was {spread(bh, 'age_at_fault')} old at the fault)."]
    if inc:
        out += ["", "Incident (TX checksum offload turned back on while the tunnel ran; "
                "times from the last good handshake, one run): the faulty NIC corrupted "
                f"{inc['corrupted']} handshake packets, the cloud counted {inc['csum_errors']}"
                f" `InCsumErrors`; traffic through the tunnel stopped at "
                f"{s(inc['traffic_stopped'])}. edgeheal warned {s(inc['warn'])} in — "
                f"{180 - inc['warn']:.0f} s before the session expired — and declared the "
                f"tunnel dead {inc['detect'] - 180:.1f} s after it expired. The 180 s age rule "
                f"fires at the expiry itself ({inc['detect'] - inc['age_alert_180']:.1f} s "
                f"before edgeheal's `failed`), the 135 s rule {180 - inc['age_alert_135']:.0f} s "
                "before it — but see the footprint section for what the 135 s rule does on a "
                "healthy tunnel at the field's keepalive."]
    else:
        out += ["", "The incident (about 3.5 minutes) is skipped with `--quick`."]
    return [*out, ""]


def _restart(res: dict[str, Any]) -> list[str]:
    det, k3s = res["detection"], res["k3s"]
    out = ["## Decision to traffic after a Flannel restart", "",
           "Decision: the time stamp of the agent's restart action in `/status`. Traffic: the "
           "first TCP connection to the broker's tunnel-only address that opens again "
           "(probed every 0.1 s from inside the edge).", "",
           "| mode | n | fault -> decision | decision -> traffic | decision -> `wireguard` ok "
           "| restart action took |", "|---|---|---|---|---|---|"]
    if det.get("ok"):
        lp = det["lost_peer"]
        out.append(f"| pod (lab: test API, stand-in Flannel rebuilds the device) | {len(lp)} | "
                   f"{spread(lp, 'decision_after_fault')} | {spread(lp, 'traffic', 'ms')} | "
                   f"{spread(lp, 'ok_after_decision')} | {spread(lp, 'restart_duration')} |")
    if k3s.get("ok"):
        runs = k3s["runs"]
        out.append(f"| k3s-service (stand-in systemd on dbus-daemon, K = {k3s['keepalive']} s)"
                   f" | {len(runs)} | {spread(runs, 'detect')} (to `failed`) | "
                   f"{spread(runs, 'traffic', 'ms')} | {spread(runs, 'ok_after_decision')} | "
                   f"{spread(runs, 'restart_duration')} |")
    else:
        out += ["", *_failed(k3s)]
    out += ["", "Fault -> decision is detection (next read + debounce) plus the actor's "
            "once-a-second look at the snapshot; faults are injected once the agent has run "
            "35 s (see below). Decision -> traffic includes the lab's stand-ins: the test API "
            "replaces the pod after 0.5 s, the stand-in Flannel then rebuilds the device "
            "(wireguard-go) and the first handshake follows; the stand-in systemd takes 0.2 s "
            "per restart. On a node the real Flannel pod's start-up dominates. Results: "
            + ", ".join(str(r.get("result")) for r in
                        (det.get("lost_peer") or []) + (k3s.get("runs") or [])) + ".", "",
            "Found on the way: in the first 30 s after the agent starts, a failed tunnel is "
            "skipped as `uplink_settling`: the direct path's first `ok` after start counts as "
            "the uplink coming back, so `uplink_settle` (30 s) acts as a second, longer "
            "startup grace (a lost peer 20 s after start was acted on 10.5 s after the "
            "fault instead of 2 s).", ""]
    return out


def _onoff(res: dict[str, Any]) -> list[str]:
    out = ["## Outage and lost messages per scenario, edgeheal on vs off", "",
           "Each scenario ran twice at the same time (`bench/onoff.py`, the lab's scenarios "
           "with `--quick` lengths): with the agent and without it. Over the same window "
           "from the fault: *outage* = seconds in which a TCP connection through edge-0's "
           "tunnel did not open (probed every 0.5 s), *lost* = the collector's readings "
           "(one a second, QoS 1) not acknowledged within 10 s.", "",
           "| scenario | window | outage on | outage off | lost on | lost off | restarts on "
           "| scenario's expectations (on) |", "|---|---|---|---|---|---|---|---|"]
    for name, pair in res["onoff"].items():
        on, off = pair["on"], pair["off"]
        if "outage_seconds" not in on or "outage_seconds" not in off:
            out.append(f"| {name} | | not measured: "
                       f"{(on.get('error') or off.get('error') or '?')[:120]} | | | | | |")
            continue
        key, shown = "outage_seconds", name
        if on.get("control_outage_seconds") is not None:  # the control path's outage
            key, shown = "control_outage_seconds", f"{name} (control path)"
        restarts = on["restarts"] + (on.get("agent_restarts") or 0)
        out.append(f"| {shown} | {on['window']:.0f} s | {on[key]:.1f} s | "
                   f"{off[key]:.1f} s | {on['lost']} | {off['lost']} | "
                   f"{restarts} | {'held' if on.get('passed') else 'FAILED'} |")
    out += ["", "uplink-outage and flapping-uplink take the uplink itself away: no agent can "
            "shorten that; what matters there is no restart (`restarts on`) and the alerts "
            "delivered afterwards (the lab scenarios' own expectations). lossy-link: under 10 % "
            "loss single probes fail at random (a lost SYN outlasts the 0.5 s probe), so its "
            "two columns differ by chance; dead-neighbour breaks another edge, not edge-0. "
            "The control-path rows (agent-stuck, node-ip-changed) count the seconds edge-0's "
            "Node was not Ready, its Lease not renewed or its InternalIP not its address, and "
            "k3s-agent restarts with the Flannel ones (docs/control.md). "
            "The last column is the scenario's own verdict in the run with the agent "
            "(`edgeheal lab` exit status)."]
    boot = res["onoff"].get("boot-with-offload", {})
    on, off = boot.get("on", {}), boot.get("off", {})
    if on.get("outage_after_agent_start") is not None and off.get("agent_started"):
        out += ["", "boot-with-offload starts the agent only after it has shown the blocked "
                f"tunnel ({on['agent_started']:.0f} s after boot in the run with the agent); "
                "from that moment to the window's end the outage was "
                f"{on['outage_after_agent_start']:.1f} s with the agent and "
                f"{off['outage_after_agent_start']:.1f} s without."]
    return [*out, ""]


def _footprint(res: dict[str, Any]) -> list[str]:
    fp = res["footprint"]
    out = ["## Agent footprint", ""]
    floor = res["floor"]
    floor_rows = [f"| import floor: {k} | {v:.1f} MB | | |" for k, v in floor.items()]
    if not fp.get("ok"):
        return out + _failed(fp) + floor_rows
    rss, pss = fp["rss_mb"], fp["pss_mb"]
    out += [
        f"The lab edge's `edgeheal run` (its `/proc/<pid>`), on the default config with every "
        f"feature on (offload enforcer, WireGuard, MQTT tunnel + direct, durable alerts, "
        f"Kubernetes, pod remediation), sampled every 10 s over {fp['span'] / 60:.1f} "
        "minutes of a healthy tunnel. Targets: under 60 MB RSS, under 1 % of one core.", "",
        "| | median | max | target |", "|---|---|---|---|",
        f"| RSS | {labkit.median(rss):.1f} MB | {max(rss):.1f} MB | < 60 MB "
        f"{'✓' if max(rss) < 60 else '✗'} |",
        f"| PSS | {labkit.median(pss):.1f} MB | {max(pss):.1f} MB | |",
        f"| CPU over the window | {fp['cpu_percent']:.2f} % of one core | | < 1 % "
        f"{'✓' if fp['cpu_percent'] < 1 else '✗'} |",
        *floor_rows, "",
        f"During the window {fp['not_ok_samples']} of the once-a-second `/status` samples "
        "showed a check not ok. The highest handshake age of this healthy tunnel was "
        f"{s(fp['max_healthy_age'])} (K = {KEEPALIVE} s: a keepalive-only tunnel rekeys on the "
        "first send after 120 s, up to K later). At the field's K = 25 s a healthy tunnel's "
        "age reaches up to about 145 s, so the 135 s age rule can fire on healthy tunnels "
        "there, and the 180 s rule only fires once the session is already refused.", ""]
    return out


def _readyz(res: dict[str, Any]) -> list[str]:
    w = res["readyz"]
    out = ["## `/readyz` latency under load", ""]
    if not w.get("ok"):
        return out + _failed(w)
    runs = w["runs"]
    p99 = float(labkit.median([r["p99_us"] / 1000 for r in runs]) or 0.0)
    out += [
        f"`wrk` (Debian 4.1: no fixed-rate mode, so {runs[0]['connections']} connections each "
        "wait `delay()` between requests) against a lab edge's agent while its checks run "
        "(every second), after every other benchmark here had finished; "
        f"{len(runs)} runs of {runs[0]['duration_us'] / 1e6:.0f} s. Target p99 under 5 ms.",
        "", "| run | requests/s | errors | p50 | p90 | p99 | max | agent CPU | load average |",
        "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        out.append(f"| {i} | {r['rate']:.0f} | {r['errors']} | {r['p50_us'] / 1000:.2f} ms | "
                   f"{r['p90_us'] / 1000:.2f} ms | {r['p99_us'] / 1000:.2f} ms | "
                   f"{r['max_us'] / 1000:.1f} ms | {r['agent_cpu_percent']:.1f} % | "
                   f"{' '.join(r['loadavg'])} |")
    out += ["", f"Median p99: **{p99:.2f} ms** {'✓' if p99 < 5 else '✗'}. `wireguard` at the "
            f"end: {w['wireguard_during'][0]}; checks that left ok during the load: "
            f"{', '.join(w['checks_not_ok']) or 'none'}.", ""]
    return out


def _read_cost(res: dict[str, Any]) -> list[str]:
    c = res["read_cost"]
    return ["## One WireGuard read: UAPI socket vs `wg show <if> dump`", "",
            f"{int(c['reads'])} interleaved reads of a wireguard-go device with one peer "
            "(`bench/wireguard.py:read_cost`), medians:", "",
            "| UAPI socket, in-process (the agent) | `wg show <if> dump` subprocess | ratio |",
            "|---|---|---|",
            f"| {ms(c['uapi'])} | {ms(c['dump'])} | **{c['ratio']:.1f}x** |", "",
            "The `wg` figure includes fork/exec and not yet the parsing of its output.", ""]


def _bytes(res: dict[str, Any]) -> list[str]:
    fp = res["footprint"]
    out = ["## Uplink bytes per day of all probing (default config)", ""]
    if not fp.get("ok"):
        return out + _failed(fp)
    c = fp["counters"]
    mb = fp["bytes_per_day"] / 1e6
    out += [
        f"nft counters in the lab edge over {fp['span'] / 60:.1f} minutes, collector "
        "stopped, agent on the default config: the uplink's non-tunnel traffic (direct MQTT "
        "probe, alert connection, Kubernetes API) plus the agent's traffic inside the tunnel "
        f"(tunnel-path MQTT probe) with {labkit.WG_FRAMING} bytes of WireGuard framing per "
        "packet (an upper bound), extrapolated to a day.", "",
        "| path | packets | bytes | per day |", "|---|---|---|---|",
        f"| direct (uplink, out + in) | {c['direct_out'][0] + c['direct_in'][0]} | "
        f"{fp['direct_bytes']} | {fp['direct_bytes'] / fp['span'] * 86400 / 1e6:.2f} MB |",
        f"| through the tunnel (+ framing) | {c['inner_out'][0] + c['inner_in'][0]} | "
        f"{fp['tunnel_bytes']} | {fp['tunnel_bytes'] / fp['span'] * 86400 / 1e6:.2f} MB |",
        f"| **all probing** | | | **{mb:.2f} MB/day** "
        f"{'✓' if mb < 10 else '✗'} (target < 10 MB) |", "",
        "Not counted, because Flannel sends it whether edgeheal runs or not: the tunnel's own "
        f"keepalives and handshakes ({fp['wg_udp_bytes_per_day'] / 1e6:.2f} MB/day at the lab's "
        f"K = {KEEPALIVE} s).", ""]
    return out


def _edges(res: dict[str, Any]) -> list[str]:
    ed, det = res["edges"], res["detection"]
    out = ["## Ten edges in one lab", ""]
    if not ed.get("ok"):
        return out + _failed(ed)
    agents = ed["agents"]
    rss = [a["rss_mb"] for a in agents]
    pss = [a["pss_mb"] for a in agents]
    cpu = [a["cpu_percent"] for a in agents]
    one_b = med(det.get("blackhole") or [], "detect")
    one_l = med(det.get("lost_peer") or [], "detect")
    out += [
        f"{ed['edges']} edges (full WireGuard mesh, one agent each, lab config) built in "
        f"{ed['build_seconds']:.0f} s, all tunnels ok {ed['settled_seconds']:.0f} s after the "
        f"start. Per agent over {ed['window']:.0f} s:", "",
        "| | median | max |", "|---|---|---|",
        f"| RSS | {labkit.median(rss):.1f} MB | {max(rss):.1f} MB |",
        f"| PSS | {labkit.median(pss):.1f} MB | {max(pss):.1f} MB |",
        f"| CPU | {labkit.median(cpu):.2f} % | {max(cpu):.2f} % |", "",
        "Then a blackhole on edge-0 and a lost peer on edge-1 at the same moment:", "",
        "| fault | 10 edges | 1 edge (median, same run) | ratio |", "|---|---|---|---|",
        f"| blackhole | {s(ed['blackhole']['detect'])} (`{ed['blackhole']['reason']}`) | "
        f"{s(one_b)} | {_ratio(ed['blackhole']['detect'], one_b)} |",
        f"| lost peer | {s(ed['lost_peer']['detect'])} (`{ed['lost_peer']['reason']}`) | "
        f"{s(one_l)} | {_ratio(ed['lost_peer']['detect'], one_l)} |", "",
        "Edges other than these two that left `ok` meanwhile: "
        + (", ".join(ed["others_not_ok"]) or "none") + ".", ""]
    return out


def _ratio(a: float | None, b: float | None) -> str:
    return NONE if a is None or not b else f"{a / b:.2f}x"


def _clock() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="check the machinery (~4 min)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/run.py needs root (network namespaces, wireguard-go)", file=sys.stderr)
        return 3

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    with tempfile.TemporaryDirectory(prefix="edgeheal-bench-") as tmp:
        res = asyncio.run(run_all(args.quick, Path(tmp)))
        (Path(tmp) / "results.json").write_text(json.dumps(res, default=str, indent=2))
        text = render(res)
    old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    if KEPT in old:  # sections written by other benchmarks and by hand, kept as they are
        text = text.rstrip("\n") + "\n\n" + old[old.index(KEPT):].rstrip("\n") + "\n"
    args.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
