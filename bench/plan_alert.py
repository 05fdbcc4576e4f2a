"""The uplink's data plan in a lab run: a tiny plan, and the alerts it must raise.

    python bench/plan_alert.py --out FILE.json [--plan 300kB] [--within 180]   (root)

Why: the unit and namespace tests hold the ledger's rules and the counting; this runs the
whole path on one lab edge (the lab's tuning, a modem behind the stand-in ModemManager, the
uplink check on): the agent counts its uplink's bytes, crosses a plan a few minutes of lab
traffic fill (WireGuard keepalives at K = 5 s, the collector's messages through the tunnel,
the probes), and ``uplink.plan_forecast`` then ``uplink.plan_exceeded`` must arrive on the
alert topic through the real broker, each once. Records when each arrived, the usage
``/status`` showed, and the kernel's counters for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import labkit
from labkit import BenchWorld

from edgeheal.lab.netns import run
from edgeheal.lab.world import Edge

KINDS = ("uplink.plan_forecast", "uplink.plan_exceeded")


class PlanWorld(BenchWorld):
    def __init__(self, workdir: Path, plan: str, **kw: Any) -> None:
        super().__init__(workdir, **kw)
        self.plan = plan

    def agent_config(self, edge: Edge, *, remediation: str = "pod", extra: str = "") -> str:
        text = super().agent_config(edge, remediation=remediation, extra=extra)
        return text.replace("[uplink]\n", f'[uplink]\nplan = "{self.plan}"\n', 1)


def kernel_bytes(edge: Edge) -> int:
    out = run(["ip", "-s", "-j", "link", "show", edge.uplink], ns=edge.ns).stdout
    import json

    stats = json.loads(out)[0]["stats64"]
    return int(stats["rx"]["bytes"]) + int(stats["tx"]["bytes"])


async def measure(workdir: Path, plan: str, within: float) -> dict[str, Any]:
    world = PlanWorld(workdir, plan, edges=1, agent=True, modem=True)
    out: dict[str, Any] = {"plan": plan}
    try:
        await world.build()
        edge = world.edges[0]
        world.start_agent(edge)
        began = time.monotonic()
        seen: dict[str, float] = {}
        while time.monotonic() - began < within and len(seen) < len(KINDS):
            for alert in world.alerts():
                kind = alert.get("kind")
                if kind in KINDS and kind not in seen:
                    seen[kind] = round(time.monotonic() - began, 1)
                    out.setdefault("alerts", {})[kind] = {
                        "after_s": seen[kind], "message": alert.get("message"),
                        "detail": alert.get("detail")}
            await asyncio.sleep(1.0)
        doc = world.status(edge) or {}
        out["status_data"] = doc.get("checks", {}).get("uplink", {}).get("detail", {}).get(
            "data")
        out["kernel_bytes"] = kernel_bytes(edge)
        out["counts"] = {k: sum(1 for a in world.alerts() if a.get("kind") == k)
                         for k in KINDS}
        missing = [k for k in KINDS if k not in seen]
        if missing:
            raise RuntimeError(f"no {', '.join(missing)} within {within:g}s: {out}")
        out["loadavg"] = labkit.loadavg()
    finally:
        await world.close()
    return out


def _terminate(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plan", default="300kB")
    parser.add_argument("--within", type=float, default=180.0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)  # unwinds through world.close()
    return labkit.run_bench("plan-alert", lambda w: measure(w, args.plan, args.within),
                            args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
