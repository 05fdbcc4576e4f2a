"""Where a running lab agent's memory grows: tracemalloc's top allocations, before and after.

    python bench/heapdiff.py --out FILE.json [--clutter N] [--seconds S] [--frames F]  (root)

Why: RSS says *that* the agent grew, not *what* grew. This builds one lab edge on the
shipped defaults with the uplink feature on (a modem behind the stand-in ModemManager), adds
``--clutter`` veth pairs to its namespace (each up, with an address and a route, as
bench/uplink_cost.py), starts the agent with ``EDGEHEAL_TRACEMALLOC=F`` and asks its control
socket for ``debug.allocations`` twice, ``--seconds`` apart (after the first round has
settled): the second answer's ``grown`` rows are what was allocated in between and is still
held, by source line. RSS is sampled every 10 s alongside. Tracing costs memory of its own
(``overhead_mib``), so the RSS here is not the budget figure: bench/footprint.py is.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import labkit
from labkit import BenchWorld, Recorder
from uplink_cost import clutter

from edgeheal.boundaries.control_socket import call
from edgeheal.lab.netns import stop_process

SETTLE = 120.0


async def measure(workdir: Path, pairs: int, seconds: float, frames: int,
                  top: int) -> dict[str, Any]:
    world = BenchWorld(workdir, edges=1, agent=True, offload_on_at_boot=False,
                       defaults=True, modem=True)
    rec: Recorder | None = None
    out: dict[str, Any] = {"clutter_pairs": pairs, "seconds": seconds, "frames": frames}
    os.environ["EDGEHEAL_TRACEMALLOC"] = str(frames)  # the agent inherits it
    try:
        await world.build()
        edge = world.edges[0]
        stop_process(edge.collector)
        await asyncio.to_thread(clutter, edge, pairs)
        world.start_agent(edge)
        rec = Recorder(world, edge, period=1.0).start()
        # tracing slows the start, so a first run may time out: settle on uptime, and
        # record the checks' states (the answer is about memory, not health)
        await rec.until(lambda s: s.uptime >= 90, SETTLE + 90, "90 s of uptime")
        out["checks"] = dict(rec.last.checks) if rec.last else {}
        pid = labkit.agent_pid(edge)
        ask = {"top": top, "by": "lineno"}
        first = await asyncio.to_thread(call, edge.state_dir, "debug.allocations", ask,
                                        timeout=180.0)
        series = [labkit.proc_sample(pid)]
        began = time.monotonic()
        while (left := seconds - (time.monotonic() - began)) > 0:
            await asyncio.sleep(min(10.0, left))
            series.append(labkit.proc_sample(pid))
        second = await asyncio.to_thread(call, edge.state_dir, "debug.allocations", ask,
                                        timeout=180.0)
        out.update({
            "traced_mib": [first["traced_mib"], second["traced_mib"]],
            "overhead_mib": second["overhead_mib"],
            "rss_mb": [round(s["rss_mb"], 2) for s in series],
            "rss_growth_mb": round(series[-1]["rss_mb"] - series[0]["rss_mb"], 2),
            "grown": second.get("grown", []), "top": second["top"],
            "loadavg": labkit.loadavg()})
    finally:
        os.environ.pop("EDGEHEAL_TRACEMALLOC", None)
        if rec is not None:
            await rec.stop()
        await world.close()
    return out


def _terminate(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--clutter", type=int, default=50, help="veth pairs")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--frames", type=int, default=1)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)  # unwinds through world.close()
    return labkit.run_bench("heapdiff", lambda w: measure(
        w, args.clutter, args.seconds, args.frames, args.top), args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
