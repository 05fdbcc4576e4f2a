"""Detection and readiness latency per fault, at the lab's tuning and the shipped defaults.

    python bench/readiness.py all [--quick]      # every world at once -> docs/benchmarks.md
                                                 # (with loss x load: bench/loss_load.py)
    python bench/readiness.py SETTING FAULT[,FAULT...] --repeats N --out FILE.json
    python bench/readiness.py SETTING bytes --out FILE.json [--window S] [--fault-window S]

``SETTING`` is ``lab`` (K = 5 s, checks every 1 s, the lab's MQTT tuning) or ``field``
(K = 25 s and the agent on its shipped defaults: ``edgeheal lab --field``'s world). One
lab world per process (``bench/run.py`` runs several at once), remediation off (mode
``none``) so every fault is lifted by the harness and one repeat cannot spend the next
one's restart budget; offload enforcement off so the incident can be injected.

Faults (each on a healthy, settled edge; ``t0`` = the moment it is injected):

- ``blackhole``: the carrier drops every tunnel packet, both directions (the direct path
  still works). Floor: one keepalive K (the first keepalive that does not arrive).
- ``send``: a send failure: the uplink loses its address (and routes), as when the modem
  drops its data session; given back after. Floor: one keepalive K.
- ``peer``: the tunnel device loses its cloud peer (stuck Flannel). Floor: the next read
  of the device (one check interval).
- ``rekey``: the incident: TX checksum offload back on, so every rekey is corrupted and
  the session dies at 180 s. ``t0`` = the last handshake before the fault. Two rows:
  ``rekey_failing`` (floor 125 s: the first rekey initiation, sent at 120 s, unanswered for
  REKEY_TIMEOUT) and ``dead`` (floor 180 s, REJECT_AFTER_TIME: the session is refused and
  traffic stops).

Per repeat: *detection* = first ``/status`` sample (every 0.25 s) with the verdict
(``wireguard`` failed; ``degraded``/``rekey_failing`` and ``failed``/``dead`` for the
incident); *not ready* = first ``/probe/broker-tunnel`` 503 (polled every 0.25 s);
*recovered* = after the fault is lifted, the first TCP connection through the tunnel to
the broker's cluster address (every 0.25 s); *ready again* = first 200 after that.

``bytes``: the collector stopped, nft counters in the edge: ``--window`` seconds healthy,
then ``--fault-window`` seconds of a tunnel blackhole; all probing bytes (direct-path
packets on the uplink and the agent's packets inside the tunnel plus WireGuard framing),
each extrapolated to a day.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeheal.base import compat

sys.path.insert(0, str(Path(__file__).resolve().parent))

import labkit
from labkit import BenchWorld, Recorder, TunnelProbe, wg_is

from edgeheal.lab import nsutil
from edgeheal.lab.netns import LabError, stop_process
from edgeheal.lab.world import AGENT_PORT, Edge

NONE = "\u2013"
"""An en dash: not measured."""
GRACE = {"lab": 35.0, "field": 100.0}
"""Agent uptime before the first fault: past startup_grace and uplink_settle."""
HOLD = {"lab": 60.0, "field": 150.0}
"""Longest a dead-path fault is held while waiting for both the verdict and the 503."""
RECOVER = {"lab": 90.0, "field": 180.0}
REKEY_HOLD = 300.0


@dataclass
class ProbePoller:
    """``GET /probe/<check>`` every ``period`` seconds: (monotonic, status code)."""

    edge: Edge
    check: str = "broker-tunnel"
    period: float = 0.25
    codes: list[tuple[float, int]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> ProbePoller:
        self._task = asyncio.create_task(self._loop(), name="bench.probe-poller")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _get(self) -> int:
        try:
            code, _ = nsutil.http_get(self.edge.ns, "127.0.0.1", AGENT_PORT,
                                      f"/probe/{self.check}", 2.0)
        except OSError:
            return 0
        return int(code)

    async def _loop(self) -> None:
        while True:
            began = time.monotonic()
            code = await asyncio.to_thread(self._get)
            self.codes.append((began, code))
            await asyncio.sleep(max(0.0, self.period - (time.monotonic() - began)))

    async def until(self, code: int, after: float, within: float) -> float | None:
        deadline = time.monotonic() + within
        seen = 0
        while time.monotonic() < deadline:
            for mono, got in self.codes[seen:]:
                seen += 1
                if mono >= after and got == code:
                    return mono
            await asyncio.sleep(0.05)
        return None


class Bench:
    def __init__(self, setting: str, workdir: Path) -> None:
        self.setting = setting
        self.world = BenchWorld(workdir, edges=1, agent=True, offload_on_at_boot=False,
                                enforce=False, field=setting == "field")
        self.edge: Edge | None = None
        self.rec: Recorder | None = None
        self.probe: ProbePoller | None = None

    async def start(self) -> None:
        await self.world.build()
        self.edge = self.world.edges[0]
        self.world.start_agent(self.edge, remediation="none")
        self.rec = Recorder(self.world, self.edge).start()
        self.probe = ProbePoller(self.edge).start()
        await self.rec.until(lambda s: s.uptime >= GRACE[self.setting], 300,
                             "the agent past its grace")

    async def healthy(self) -> None:
        rec, probe, _ = self.parts()
        await rec.until(wg_is("ok"), RECOVER[self.setting], "a healthy tunnel")
        now = time.monotonic()
        if await probe.until(200, now, RECOVER[self.setting]) is None:
            raise TimeoutError("broker-tunnel not ready before the fault")
        await asyncio.sleep(5 if self.setting == "lab" else 15)

    def parts(self) -> tuple[Recorder, ProbePoller, Edge]:
        if self.rec is None or self.probe is None or self.edge is None:
            raise RuntimeError("the bench world was not started")
        return self.rec, self.probe, self.edge

    async def close(self) -> None:
        for part in (self.rec, self.probe):
            if part is not None:
                await part.stop()
        await self.world.close()

    # --- the dead-path faults --------------------------------------------------------------

    def inject(self, fault: str, on: bool) -> None:
        edge = self.edge
        if edge is None:
            raise RuntimeError("the bench world was not built")
        if fault == "blackhole":
            self.world.tunnel_blackhole(edge, on)
        elif fault == "send":
            if on:
                self.world.drop_address(edge)
            else:
                self.world.give_address(edge, host=edge.host)
        elif fault == "peer":
            if on:
                self.world.remove_cloud_peer(edge)
            else:
                self.world.add_cloud_peer(edge)
        else:
            raise ValueError(fault)

    async def dead_path(self, fault: str) -> dict[str, Any]:
        rec, probe, _ = self.parts()
        await self.healthy()
        t0 = time.monotonic()
        await asyncio.to_thread(self.inject, fault, True)
        hold = HOLD[self.setting]
        try:
            failed = await rec.until(wg_is("failed"), hold, f"failed ({fault})", t0)
            not_ready = await probe.until(503, t0, max(1.0, t0 + hold - time.monotonic()))
        finally:
            repaired = time.monotonic()
            await asyncio.to_thread(self.inject, fault, False)
        return {"detect": failed.mono - t0, "reason": failed.checks["wireguard"][1],
                "not_ready": None if not_ready is None else not_ready - t0,
                **await self._recovery(repaired)}

    async def _recovery(self, repaired: float) -> dict[str, Any]:
        _, probe, edge = self.parts()
        tunnel = TunnelProbe(edge.ns, self.world.mqtt_port, period=0.25, timeout=0.5).start()
        try:
            deadline = time.monotonic() + RECOVER[self.setting]
            flowing = None
            while flowing is None and time.monotonic() < deadline:
                flowing = next((m for _, m, ok in tunnel.results if ok and m >= repaired),
                               None)
                await asyncio.sleep(0.1)
        finally:
            await tunnel.stop()
        if flowing is None:
            raise TimeoutError("no traffic through the tunnel after the repair")
        ready = await probe.until(200, flowing, RECOVER[self.setting])
        return {"recovered_after_repair": flowing - repaired,
                "ready_again": None if ready is None else max(0.0, ready - flowing)}

    # --- the incident ----------------------------------------------------------------------

    async def rekey(self) -> dict[str, Any]:
        rec, probe, edge = self.parts()
        await self.healthy()
        fault = time.monotonic()
        await asyncio.to_thread(self.world.set_uplink_offload, edge, True)
        try:
            # the last handshake before the fault: one may complete right after it (in
            # flight), so the origin is the last handshake the samples show after it
            warn = await rec.until(wg_is("degraded", "rekey_failing"), REKEY_HOLD,
                                   "rekey_failing", fault)
            hs = rec.last_handshake(warn.mono)
            dead = await rec.until(wg_is("failed"), REKEY_HOLD, "failed (dead)", fault)
            if hs is None:
                raise RuntimeError("no handshake seen before the incident")
            not_ready = await probe.until(503, fault, REKEY_HOLD)
        finally:
            repaired = time.monotonic()
            await asyncio.to_thread(self.world.set_uplink_offload, edge, False)
        return {"age_at_fault": fault - hs, "warn": warn.mono - hs,
                "warn_reason": warn.checks["wireguard"][1], "dead": dead.mono - hs,
                "dead_reason": dead.checks["wireguard"][1],
                "not_ready": None if not_ready is None else not_ready - hs,
                **await self._recovery(repaired)}


async def latency(setting: str, faults: list[str], repeats: int, workdir: Path,
                  ) -> dict[str, Any]:
    bench = Bench(setting, workdir)
    out: dict[str, Any] = {"setting": setting, "keepalive": bench.world.keepalive,
                           "runs": {f: [] for f in faults}, "load": [labkit.loadavg()]}
    try:
        await bench.start()
        for _ in range(repeats):
            for fault in faults:
                run = await (bench.rekey() if fault == "rekey" else bench.dead_path(fault))
                out["runs"][fault].append(run)
                print(f"{setting} {fault}: {run}", flush=True)
        out["load"].append(labkit.loadavg())
    finally:
        await bench.close()
    return out


async def probing_bytes(setting: str, window: float, fault_window: float, workdir: Path,
                        ) -> dict[str, Any]:
    bench = Bench(setting, workdir)
    out: dict[str, Any] = {"setting": setting, "keepalive": bench.world.keepalive}
    try:
        await bench.world.build()
        edge = bench.edge = bench.world.edges[0]
        stop_process(edge.collector)  # only the agent's probing on the uplink
        labkit.count_uplink(bench.world, edge)
        bench.world.start_agent(edge, remediation="none")
        bench.rec = Recorder(bench.world, edge, period=1.0).start()
        bench.probe = ProbePoller(edge, period=1.0).start()
        await bench.rec.until(lambda s: s.uptime >= GRACE[setting], 300, "past grace")
        await bench.healthy()
        for phase, seconds in (("healthy", window), ("blackhole", fault_window)):
            if phase == "blackhole":
                bench.inject("blackhole", True)
            c0, m0 = await asyncio.to_thread(labkit.read_counters, edge), time.monotonic()
            await asyncio.sleep(seconds)
            c1, m1 = await asyncio.to_thread(labkit.read_counters, edge), time.monotonic()
            delta = {k: (c1[k][0] - c0[k][0], c1[k][1] - c0[k][1]) for k in c1}
            direct = delta["direct_out"][1] + delta["direct_in"][1]
            packets = delta["inner_out"][0] + delta["inner_in"][0]
            inner = (delta["inner_out"][1] + delta["inner_in"][1]
                     + labkit.WG_FRAMING * packets)
            out[phase] = {"span": m1 - m0, "direct": direct, "tunnel": inner,
                          "per_day": (direct + inner) / (m1 - m0) * 86400,
                          "wg_udp_per_day": delta["wg_udp"][1] / (m1 - m0) * 86400}
        bench.inject("blackhole", False)
    finally:
        await bench.close()
    return out


# --- all of it, in parallel, into docs/benchmarks.md ---------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- readiness:begin -->", "<!-- readiness:end -->"
FAULTS = ("blackhole", "send", "peer")
ROWS = (("blackhole", "blackhole (carrier drops the tunnel's UDP)", "detect", "not_ready"),
        ("send", "send failure (uplink address removed)", "detect", "not_ready"),
        ("peer", "peer lost (stuck Flannel)", "detect", "not_ready"),
        ("rekey", "incident: first rekey unanswered (`rekey_failing`)", "warn", None),
        ("dead", "incident: session dead (`dead`)", "dead", "not_ready"))


def jobs(quick: bool) -> list[tuple[str, list[str]]]:
    """(name, argv) of every world: one per setting and fault group, all at once."""
    n = "1" if quick else "3"
    # the lab's repeats are short: one world takes its three faults in turn
    out = [("lab-paths", ["lab", ",".join(FAULTS), "--repeats", n])]
    out += [(f"field-{fault}", ["field", fault, "--repeats", n]) for fault in FAULTS]
    out += [(f"{setting}-rekey", [setting, "rekey", "--repeats", "1" if quick else "2"])
            for setting in ("lab", "field")]
    out.append(("field-bytes", ["field", "bytes", "--window", "60" if quick else "300",
                                "--fault-window", "30" if quick else "120"]))
    # loss x load at the shipped defaults (bench/loss_load.py: its own section)
    out.append(("field-loss", ["loss_load.py", "--losses", "10" if quick else "0,5,10,20",
                               "--seconds", "60" if quick else "180", "--busy", "2",
                               "--side-probes", "1"]))
    return out


async def run_all(quick: bool, tmp: Path) -> dict[str, Any]:
    from datetime import datetime

    from edgeheal.base.compat import UTC

    began = time.monotonic()
    res: dict[str, Any] = {"quick": quick, "started": datetime.now(UTC),
                           "load_start": labkit.loadavg(), "results": {}, "commands": []}
    procs: list[asyncio.subprocess.Process] = []

    async def one(name: str, args: list[str]) -> None:
        out = tmp / f"{name}.json"
        script, args = ((Path(__file__).with_name(args[0]), args[1:])
                        if args[0].endswith(".py") else (Path(__file__), args))
        res["commands"].append(" ".join([f"python bench/{script.name}", *args]))
        with (tmp / f"{name}.log").open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(script), *args, "--out", str(out), stdout=log,
                stderr=log)
        procs.append(proc)
        code = await proc.wait()
        print(f"done {name} (exit {code}, {time.monotonic() - began:.0f}s)", flush=True)
        try:
            res["results"][name] = json.loads(out.read_text())
        except (OSError, ValueError):
            res["results"][name] = {"ok": False, "error": f"exit {code}, no result"}

    try:
        await asyncio.gather(*(one(name, args) for name, args in jobs(quick)))
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
    res["load_end"] = labkit.loadavg()
    res["minutes"] = (time.monotonic() - began) / 60
    return res


def _values(res: dict[str, Any], setting: str, fault: str, key: str) -> list[float]:
    which = "rekey" if fault in ("rekey", "dead") else fault
    runs = [r for doc in res["results"].values() if doc.get("setting") == setting
            for r in (doc.get("runs") or {}).get(which) or []]
    return [float(r[key]) for r in runs if r.get(key) is not None]


def _spread(values: list[float]) -> str:
    if not values:
        return NONE
    m = float(labkit.median(values) or 0.0)
    return f"{m:.1f} s" + (f" ({min(values):.1f}-{max(values):.1f})" if len(values) > 1
                           else "")


def _floor(setting: str, fault: str) -> float:
    k = 25.0 if setting == "field" else 5.0
    return {"blackhole": k, "send": k, "peer": 5.0 if setting == "field" else 1.0,
            "rekey": 125.0, "dead": 180.0}[fault]


def _ratio(values: list[float], floor: float) -> str:
    return NONE if not values else f"{float(labkit.median(values) or 0.0) / floor:.2f}"


def render(res: dict[str, Any]) -> str:
    lines = [BEGIN, "## Detection and readiness latency per fault, lab tuning vs shipped "
             "defaults", "",
             f"Measured {res['started']:%Y-%m-%d %H:%M} UTC by `python bench/readiness.py all"
             f"{' --quick' if res['quick'] else ''}` in {res['minutes']:.1f} minutes"
             + (" — **`--quick`: a check of the machinery, not results**" if res["quick"]
                else "") + f"; load average (1, 5, 15 min) at start "
             f"{' '.join(res['load_start'])}, at end {' '.join(res['load_end'])} (2 cores, "
             f"{len(jobs(res['quick']))} lab worlds at once, shared with other work).", "",
             "*Lab*: K = 5 s, checks every 1 s, the lab's MQTT tuning (`edgeheal lab`). "
             "*Defaults*: K = 25 s and the agent on its shipped defaults, only addresses and "
             "interfaces set (`edgeheal lab --field`). Remediation off (the harness lifts "
             "every fault). Times from the fault (the incident: from the last handshake "
             "before it). *Detection*: `wireguard` reports the verdict in `/status` "
             "(sampled every 0.25 s). *Not ready*: `/probe/broker-tunnel` answers 503 "
             "(polled every 0.25 s). *Ready again*: its first 200 after traffic flows "
             "through the tunnel again (a TCP connection to the broker's cluster address, "
             "every 0.25 s, after the fault is lifted). Medians (min-max); ratio = median / "
             "floor. Floors: one keepalive K for a dead path (the first keepalive that does "
             "not arrive), the next read (one check interval) for a lost peer, 125 s after "
             "the last handshake for the first unanswered rekey, 180 s for the dead "
             "session.", "",
             "| fault | setting | n | floor | detection | ratio | not ready | ratio | "
             "ready again after recovery |", "|---|---|---|---|---|---|---|---|---|"]
    for fault, title, detect_key, ready_key in ROWS:
        for setting, label in (("lab", "lab"), ("field", "defaults")):
            det = _values(res, setting, fault, detect_key)
            nr = _values(res, setting, fault, ready_key) if ready_key else []
            again = _values(res, setting, fault, "ready_again") if fault != "rekey" else []
            floor = _floor(setting, fault)
            lines.append(f"| {title} | {label} | {len(det)} | {floor:g} s | {_spread(det)} | "
                         f"{_ratio(det, floor)} | {_spread(nr) if ready_key else NONE} | "
                         f"{_ratio(nr, floor) if ready_key else NONE} | {_spread(again)} |")
    reasons = sorted({f"{f}: `{r.get('reason') or r.get('dead_reason')}`"
                      for name, doc in res["results"].items() if not name.endswith("bytes")
                      for f, runs in (doc.get("runs") or {}).items() for r in runs})
    errors = [f"{name}: {doc.get('error')}" for name, doc in res["results"].items()
              if not doc.get("ok")]
    lines += ["", "Verdict reasons seen: " + (", ".join(reasons) or "none") + "."]
    if errors:
        lines += ["", "**Not measured**: " + "; ".join(errors).replace("\n", " ")]
    b = res["results"].get("field-bytes") or {}
    if b.get("ok"):
        lines += ["", "Bytes of all probing with the shipped defaults (collector stopped; nft "
                  "counters in the edge: direct-path packets on the uplink plus the agent's "
                  f"packets inside the tunnel with {labkit.WG_FRAMING} bytes of WireGuard "
                  "framing each, an upper bound), extrapolated to a day:", "",
                  "| phase | window | direct | tunnel | **per day** |", "|---|---|---|---|---|"]
        for phase, name in (("healthy", "healthy"), ("blackhole", "during a tunnel "
                                                                  "blackhole")):
            p = b[phase]
            lines.append(f"| {name} | {p['span']:.0f} s | {p['direct']} B | {p['tunnel']} B | "
                         f"**{p['per_day'] / 1e6:.2f} MB** |")
        lines += ["", "Not counted: the tunnel's own keepalives and handshakes, which Flannel "
                  f"sends anyway ({b['healthy']['wg_udp_per_day'] / 1e6:.2f} MB/day at K = "
                  "25 s)."]
    lines += ["", "Commands (each a lab world of its own, all at once):", "", "```",
              *res["commands"], "```", END]
    return "\n".join(lines)


def splice(doc: Path, section: str) -> None:
    """Put the section into ``doc`` between its markers (appended the first time)."""
    text = doc.read_text(encoding="utf-8") if doc.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(text, encoding="utf-8")


def _terminate(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if argv[:1] == ["all"]:
        return main_all(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("setting", choices=("lab", "field"))
    parser.add_argument("faults", help="comma-separated: blackhole,send,peer,rekey; or bytes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=float, default=300.0)
    parser.add_argument("--fault-window", type=float, default=120.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    faults = args.faults.split(",")
    unknown = set(faults) - {"blackhole", "send", "peer", "rekey", "bytes"}
    if unknown:
        parser.error(f"unknown fault(s): {', '.join(sorted(unknown))}")
    signal.signal(signal.SIGTERM, _terminate)  # unwinds through the world's close()
    workdir = Path(tempfile.mkdtemp(prefix=f"edgeheal-bench-ready-{args.setting}-"))
    try:
        if faults == ["bytes"]:
            doc = asyncio.run(probing_bytes(args.setting, args.window, args.fault_window,
                                            workdir))
        else:
            doc = asyncio.run(latency(args.setting, faults, args.repeats, workdir))
        doc["ok"] = True
    except (*compat.TimeoutErrors, RuntimeError, OSError, KeyError, AssertionError,
            LabError) as err:
        doc = {"ok": False, "error": f"{type(err).__name__}: {err}", "workdir": str(workdir)}
        labkit.dump(args.out, doc)
        print(f"readiness {args.setting} {args.faults}: {doc['error']} (logs kept in "
              f"{workdir})", file=sys.stderr)
        return 1
    labkit.dump(args.out, doc)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main_all(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/readiness.py all")
    parser.add_argument("--quick", action="store_true", help="one repeat, short windows")
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    with tempfile.TemporaryDirectory(prefix="edgeheal-bench-ready-") as tmp:
        res = asyncio.run(run_all(args.quick, Path(tmp)))
        (Path(tmp) / "results.json").write_text(json.dumps(res, default=str, indent=2))
        print(json.dumps(res, default=str, indent=1))
    section = render(res)
    splice(args.doc, section)
    print(section)
    loss = res["results"].get("field-loss") or {}
    if loss.get("ok"):
        import loss_load

        command = next(c for c in res["commands"] if "loss_load.py" in c)
        loss_load.splice(args.doc, loss_load.render([(command, loss)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
