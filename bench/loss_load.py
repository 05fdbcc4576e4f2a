"""Readiness under random loss on a busy box, at the shipped defaults (issue 27, item 9).

    python bench/loss_load.py --out FILE.json [--losses 0,5,10,20] [--seconds 180]
                              [--busy N] [--pin CPU] [--side-probes S] [--setting field|lab]
                              [--keep DIR]
    python bench/loss_load.py render FILE.json[=COMMAND] ... [--doc docs/benchmarks.md]

One lab world (``edgeheal lab --field``'s with ``--setting field``: K = 25 s, userspace
WireGuard, the agent on its shipped defaults; remediation off, offload enforcement off so
nothing acts on the edge), past the agent's grace. Then, per loss level in turn:

1. a healthy edge (``/readyz`` 200, then 15 s more);
2. ``P`` % random loss on the edge's uplink, both ways (:func:`lose`: every packet,
   tunnel and direct path alike), and ``--busy`` CPU-bound processes (nice 0, one per
   core in turn with ``taskset``, each ending by itself after the phase and killed in a
   ``finally``) beside the agent, the tunnel's wireguard-go and the collector, for
   ``--seconds``;
3. the loss and the load lifted; the next level starts once the edge is ready again.

Level 0 is the load alone. ``/readyz`` is asked every 0.25 s from inside the edge (the
kubelet's view); the 2 s figure is every 8th of those samples (a kubelet probing every
2 s would have seen exactly these). Each 503 keeps the ``failing`` list it named (which
check, which state, which reason); ``/status`` is sampled every 0.5 s beside it, so the
raw result waiting behind a debounce (``observed``) is kept too. The load average is
recorded at the start and end of each phase: the machine is shared, and its own load is
part of "a loaded box". ``--pin CPU`` puts the agent, wireguard-go, the collector and the
busy processes on that one CPU (the load right beside them). ``--keep DIR`` copies the
agent's log (debug level) there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import labkit
from labkit import BenchWorld

from edgeheal.lab import nsutil
from edgeheal.lab.netns import run
from edgeheal.lab.world import AGENT_PORT, BROKER_CLUSTER_IP, Edge

GRACE = {"lab": 35.0, "field": 100.0}
"""Agent uptime before the first phase: past startup_grace and uplink_settle."""
READY_WITHIN = 240.0
"""Longest wait for a ready edge between phases."""
BUSY = (
    "import time\n"
    "end = time.monotonic() + float(__import__('sys').argv[1])\n"
    "n = 0\n"
    "while time.monotonic() < end:\n"
    "    n += 1\n")
"""One CPU-bound process that ends by itself (bounded in time)."""
SIDE_PROBE = r"""
import asyncio, json, sys, time
from edgeheal.boundaries.mqtt.session import Session
from edgeheal.config import MqttTarget
host, port, seconds, period = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])

async def main():
    target = MqttTarget(name="side", host=host, port=port, path="tunnel")
    session = Session(target, "side-probe")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        r = await session.check()
        print(json.dumps({"t": began, "took": time.monotonic() - began, "reason": r.reason,
                          "ping": r.ping_seconds, "connects": session.connects}), flush=True)
        await asyncio.sleep(max(0.0, period - (time.monotonic() - began)))
    await session.close()

asyncio.run(main())
"""
"""``--side-probes``: the agent's own probe session (shipped target defaults: 4 s timeout,
the 1 s ping grace, a reconnect in what is left) run every ``period`` from inside the edge
through the tunnel, beside the agent's, so the chance that one probe fails under loss
and load is measured over hundreds of tries instead of the agent's three a phase."""


class LogWorld(BenchWorld):
    """The bench world with the agent logging at debug (the evidence of a flip)."""

    def start_agent(self, edge: Edge, **kw: Any) -> None:
        edge.config_path.write_text(self.agent_config(edge, **kw))
        env = {**os.environ, "EDGEHEAL_LOG_LEVEL": "debug"}
        edge.agent = self.sandbox.spawn(
            [sys.executable, "-m", "edgeheal", "run", "--config", str(edge.config_path)],
            ns=edge.ns, log_path=edge.workdir / "agent.log", env=env)


@dataclass
class Poller:
    """``GET path`` from inside the edge every ``period`` seconds, in a thread."""

    edge: Edge
    path: str
    period: float
    rows: list[tuple[float, int, Any]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> Poller:
        self._task = asyncio.create_task(self._loop(), name=f"bench.poll{self.path}")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _get(self) -> tuple[int, Any]:
        try:
            code, body = nsutil.http_get(self.edge.ns, "127.0.0.1", AGENT_PORT, self.path,
                                         2.0)
        except OSError as err:
            return 0, f"{type(err).__name__}: {err}"
        try:
            return code, json.loads(body)
        except ValueError:
            return code, body[:200].decode(errors="replace")

    async def _loop(self) -> None:
        while True:
            began = time.monotonic()
            code, doc = await asyncio.to_thread(self._get)
            self.rows.append((began, code, doc))
            await asyncio.sleep(max(0.0, self.period - (time.monotonic() - began)))

    def since(self, after: float, until: float | None = None) -> list[tuple[float, int, Any]]:
        return [r for r in self.rows if r[0] >= after and (until is None or r[0] < until)]


def lose(world: BenchWorld, edge: Edge, percent: int | None) -> int:
    """Random loss on the uplink, both ways (None lifts it): nftables ``numgen random``
    on arrival at each end of the uplink veth (the carrier's end for what the edge
    sends, the edge's end for what it receives), so every packet, tunnel and direct path
    alike, is dropped with the same chance, as on a lossy radio link. (This kernel has
    no netem; an ingress drop never shows the sender an error, as netem does not.)"""
    dropped = 0
    for dev, ns in ((edge.uplink_peer, edge.carrier), (edge.uplink, edge.ns)):
        listed = run(["nft", "-j", "list", "table", "netdev", "bench_loss"], ns=ns,
                     check=False).stdout
        with contextlib.suppress(ValueError):
            dropped += sum(int(e["counter"]["packets"]) for item in
                           json.loads(listed or "{}").get("nftables", [])
                           for e in (item.get("rule") or {}).get("expr", []) if "counter" in e)
        run(["nft", "delete", "table", "netdev", "bench_loss"], ns=ns, check=False)
        if percent is not None:
            world.sandbox.nft(ns, "table netdev bench_loss {\n chain ingress {\n"
                              f"  type filter hook ingress device \"{dev}\" priority 0;\n"
                              f"  numgen random mod 100 < {percent} counter drop\n }}\n}}\n")
    return dropped


def pin(edge: Edge, cpu: int) -> list[int]:
    """Pin the edge's agent, wireguard-go and collector (every thread) to ``cpu``."""
    pids = [int(p.pid) for p in (edge.agent, edge.wg_process, edge.collector)
            if p is not None and p.poll() is None]
    for pid in pids:
        run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)])
    return pids


def busy(count: int, seconds: float, cpu: int | None = None,
         ) -> list[subprocess.Popen[bytes]]:
    cpus = sorted(os.sched_getaffinity(0)) if cpu is None else [cpu]
    pin = shutil.which("taskset")
    procs = []
    for i in range(count):
        argv = [sys.executable, "-c", BUSY, str(seconds)]
        if pin:
            argv = [pin, "-c", str(cpus[i % len(cpus)]), *argv]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    return procs


def stop_busy(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


def _reasons(doc: Any) -> list[str]:
    if not isinstance(doc, dict):
        return [f"no answer: {doc}"]
    return [f"{f.get('check')}={f.get('state')}({f.get('reason')})"
            for f in doc.get("failing") or []] or ["(none named)"]


def _observed(status: dict[str, Any] | None) -> dict[str, Any]:
    if not isinstance(status, dict):
        return {}
    out = {}
    for name, check in (status.get("checks") or {}).items():
        if not check.get("required"):
            continue
        row = {"state": check.get("state"), "reason": check.get("reason"),
               "runs": check.get("runs"), "took": check.get("duration_seconds")}
        if "observed" in check:
            row["observed"] = check["observed"]
        out[name] = row
    return out


def summarize(ready: list[tuple[float, int, Any]], status: list[tuple[float, int, Any]],
              began: float) -> dict[str, Any]:
    codes = [code for _, code, _ in ready]
    grid = codes[::8]
    bad = [(m, code, doc) for m, code, doc in ready if code != 200]
    reasons = Counter(r for _, _, doc in bad for r in _reasons(doc))
    longest = run_len = 0
    for code in codes:
        run_len = run_len + 1 if code != 200 else 0
        longest = max(longest, run_len)
    episodes: list[dict[str, Any]] = []
    for m, _, doc in bad:
        if not episodes or m - episodes[-1]["last"] > 0.6:
            near = min(status, key=lambda r: abs(r[0] - m), default=None)
            episodes.append({"at": round(m - began, 2), "last": m, "failing": _reasons(doc),
                             "status": _observed(near[2] if near else None)})
        else:
            episodes[-1]["last"] = m
    for ep in episodes:
        ep["seconds"] = round(ep.pop("last") - began - ep["at"] + 0.25, 2)
    # every raw result that was not ok, per required check (the debounce's input)
    raw: Counter[str] = Counter()
    seen: dict[str, int] = {}
    for _, _, doc in status:
        for name, row in _observed(doc).items():
            obs = row.get("observed")
            if obs and obs.get("state") not in ("ok", "degraded") and \
                    seen.get(name) != row.get("runs"):
                raw[f"{name}: {obs.get('state')}({obs.get('reason')})"] += 1
            seen[name] = row.get("runs") or 0
    return {"samples": len(codes), "not_ready": len(bad), "samples_2s": len(grid),
            "not_ready_2s": sum(1 for c in grid if c != 200),
            "longest_not_ready_seconds": longest * 0.25, "reasons": dict(reasons),
            "episodes": episodes, "raw_not_ok_seen": dict(raw)}


async def phase(world: BenchWorld, edge: Edge, pollers: tuple[Poller, Poller], *, loss: int,
                seconds: float, n_busy: int, cpu: int | None, side: float) -> dict[str, Any]:
    """One loss level: wait for a ready edge, hold loss and load, lift both."""
    ready, status = pollers
    began = time.monotonic()
    while not (ready.rows and ready.rows[-1][0] > began and ready.rows[-1][1] == 200):
        if time.monotonic() > began + READY_WITHIN:
            raise TimeoutError(f"not ready before the {loss} % phase")
        await asyncio.sleep(0.25)
    await asyncio.sleep(15)
    load0 = labkit.loadavg()
    t0 = time.monotonic()
    if loss:
        await asyncio.to_thread(lose, world, edge, loss)
    procs = busy(n_busy, seconds + 5, cpu)
    side_log = edge.workdir / f"side-{loss}.jsonl"
    if side:
        procs.append(world.sandbox.spawn(
            [sys.executable, "-c", SIDE_PROBE, BROKER_CLUSTER_IP, str(world.mqtt_port),
             str(seconds - 5), str(side)], ns=edge.ns, log_path=side_log))
    try:
        await asyncio.sleep(seconds)
    finally:
        t1 = time.monotonic()
        stop_busy(procs)
        dropped = await asyncio.to_thread(lose, world, edge, None)
    out = {"loss": loss, "dropped_packets": dropped, "load_start": load0,
           "load_end": labkit.loadavg(),
           **summarize(ready.since(t0, t1), status.since(t0, t1), t0)}
    if side:
        out["side_probes"] = side_figures(side_log)
    print(f"loss {loss} %: {out['not_ready']}/{out['samples']} not ready "
          f"(2 s: {out['not_ready_2s']}/{out['samples_2s']}), {out['reasons']}, "
          f"raw {out['raw_not_ok_seen']}, {dropped} packets dropped, "
          f"load {load0} -> {out['load_end']}; side probes {out.get('side_probes')}",
          flush=True)
    return out


def side_figures(path: Path) -> dict[str, Any]:
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    rows = [r for r in rows if isinstance(r, dict) and "reason" in r]
    failed = [r for r in rows if r["reason"] != "ok"]
    pairs = sum(1 for a, b in itertools.pairwise(rows)
                if a["reason"] != "ok" and b["reason"] != "ok")
    took = [float(r["took"]) for r in rows]
    pings = [float(r["ping"]) for r in rows if r.get("ping") is not None]
    return {"probes": len(rows), "failed": len(failed),
            "reasons": dict(Counter(r["reason"] for r in failed)),
            "failed_twice_in_row": pairs,
            "reconnects": (rows[-1]["connects"] - 1) if rows else 0,
            "took_p50": labkit.percentile(took, 50), "took_p99": labkit.percentile(took, 99),
            "took_max": max(took, default=None),
            "pings_over_half_grace": sum(1 for p in pings if p > 0.5)}


def keep_log(world: BenchWorld, keep: Path, setting: str) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        shutil.copy(world.edges[0].workdir / "agent.log", keep / f"agent-{setting}.log")


async def measure(workdir: Path, *, setting: str, losses: list[int], seconds: float,
                  n_busy: int, keep: Path | None, cpu: int | None, side: float,
                  ) -> dict[str, Any]:
    world = LogWorld(workdir, edges=1, agent=True, offload_on_at_boot=False, enforce=False,
                     field=setting == "field")
    out: dict[str, Any] = {"setting": setting, "keepalive": world.keepalive,
                           "seconds": seconds, "busy": n_busy, "cpus": os.cpu_count(),
                           "pinned": cpu,
                           "phases": [], "load_start": labkit.loadavg()}
    pollers: tuple[Poller, Poller] | None = None
    try:
        await world.build()
        edge = world.edges[0]
        world.start_agent(edge, remediation="none")
        pollers = (Poller(edge, "/readyz", 0.25).start(), Poller(edge, "/status", 0.5).start())
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            last = pollers[1].rows[-1] if pollers[1].rows else None
            if last and isinstance(last[2], dict) and \
                    float(last[2].get("uptime_seconds") or 0) >= GRACE[setting]:
                break
            await asyncio.sleep(0.5)
        else:
            raise TimeoutError("the agent did not pass its grace")
        if cpu is not None:
            out["pinned_pids"] = await asyncio.to_thread(pin, edge, cpu)
        for loss in losses:
            out["phases"].append(await phase(world, edge, pollers, loss=loss, seconds=seconds,
                                             n_busy=n_busy, cpu=cpu, side=side))
    finally:
        for poller in pollers or ():
            await poller.stop()
        if world.edges:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(lose, world, world.edges[0], None)
            if keep is not None:
                await asyncio.to_thread(keep_log, world, keep, setting)
        await world.close()
    out["load_end"] = labkit.loadavg()
    return out


# --- the section of docs/benchmarks.md ----------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- loss-load:begin -->", "<!-- loss-load:end -->"


def render(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """The section: one row per loss level of each run (``runs``: command, result)."""
    lines = [BEGIN, "## Readiness under random loss on a busy box (issue 27, item 9)", "",
             "`python bench/loss_load.py` (module docstring): one lab world at the shipped "
             "defaults (`edgeheal lab --field`: K = 25 s, userspace WireGuard, remediation "
             "off), per loss level 3 minutes of random loss on the uplink, both ways, with "
             "CPU-bound processes beside the agent; `/readyz` asked every 0.25 s (the 2 s "
             "column: every 8th answer). *Raw not ok*: results of a required check that "
             "were not ok while its effective state was (waiting behind `fail_after`), "
             "from `/status` every 0.5 s. *Side probes*: the agent's own probe session "
             "(shipped target defaults) through the tunnel every second beside it: failed "
             "/ tried, failed twice in a row, sessions made again inside a probe (a ping "
             "past its 1 s grace), slowest probe (the deadline is 3.6 s).", "",
             "| run | loss | busy | load (1 min) start -> end | dropped packets | 503 / "
             "samples | 503 / samples (2 s) | longest 503 | raw not ok | side probes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n, (_, doc) in enumerate(runs, 1):
        where = (f"{doc['busy']}, pinned with the agent to CPU {doc['pinned']}"
                 if doc.get("pinned") is not None else f"{doc['busy']}")
        for ph in doc.get("phases") or []:
            side = ph.get("side_probes")
            side_text = (f"{side['failed']} / {side['probes']}, {side['failed_twice_in_row']}, "
                         f"{side['reconnects']}, {side['took_max']:.2f} s" if side
                         else "\u2013")
            raw = ", ".join(f"{k} x{v}" for k, v in ph["raw_not_ok_seen"].items()) or "none"
            lines.append(
                f"| {n} | {ph['loss']} % | {where} | {ph['load_start'][0]} -> "
                f"{ph['load_end'][0]} | {ph['dropped_packets']} | {ph['not_ready']} / "
                f"{ph['samples']} | {ph['not_ready_2s']} / {ph['samples_2s']} | "
                f"{ph['longest_not_ready_seconds']:g} s | {raw} | {side_text} |")
    reasons = sorted({r for _, doc in runs for ph in doc.get("phases") or []
                      for r in ph["reasons"]})
    lines += ["", "Reasons named by the 503s: " + (", ".join(reasons) or "none") + ".", "",
              "Commands:", "", "```", *(cmd for cmd, _ in runs), "```", END]
    return "\n".join(lines)


def splice(doc: Path, section: str) -> None:
    """Put the section into ``doc`` between its markers (appended the first time)."""
    text = doc.read_text(encoding="utf-8")
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(text, encoding="utf-8")


def main_render(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/loss_load.py render")
    parser.add_argument("results", nargs="+", type=Path,
                        help="result files, each optionally FILE=COMMAND")
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    runs = []
    for item in args.results:
        path, _, command = str(item).partition("=")
        doc = json.loads(Path(path).read_text())
        if not doc.get("ok"):
            parser.error(f"{path}: not a finished run ({doc.get('error')})")
        runs.append((command or "python bench/loss_load.py", doc))
    section = render(runs)
    splice(args.doc, section)
    print(section)
    return 0


def main() -> int:
    if sys.argv[1:2] == ["render"]:
        return main_render(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--setting", choices=("lab", "field"), default="field")
    parser.add_argument("--losses", default="0,5,10,20",
                        help="comma-separated loss percentages, in order")
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--busy", type=int, default=2,
                        help="CPU-bound processes beside the agent during each phase")
    parser.add_argument("--pin", type=int, default=None, metavar="CPU",
                        help="pin the agent, wireguard-go, the collector and the busy "
                        "processes to this one CPU (the load beside them, not elsewhere)")
    parser.add_argument("--side-probes", type=float, default=0.0, metavar="PERIOD",
                        help="also run the agent's probe session through the tunnel every "
                        "PERIOD seconds (0: not)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="copy the agent's debug log into this directory")
    args = parser.parse_args()
    try:
        losses = [int(p) for p in args.losses.split(",")]
    except ValueError:
        parser.error(f"--losses: expected comma-separated integers, got {args.losses!r}")
    if any(not 0 <= p <= 100 for p in losses):
        parser.error("--losses: each must be 0-100")
    if not 1 <= args.seconds <= 3600 or not 0 <= args.busy <= 16:
        parser.error("--seconds must be 1-3600 and --busy 0-16")
    return labkit.run_bench("loss-load", lambda w: measure(
        w, setting=args.setting, losses=losses, seconds=args.seconds, n_busy=args.busy,
        keep=args.keep, cpu=args.pin, side=args.side_probes), args.out)


if __name__ == "__main__":
    sys.exit(main())
