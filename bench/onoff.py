"""One lab scenario with the agent or without it, measured from outside the same way.

    python bench/onoff.py SCENARIO --window SECONDS [--no-agent] [--field] [--rebind] \
        --out FILE.json

(root). Runs the scenario as ``edgeheal lab --scenario X --quick [--field]`` does, plus
a TCP probe through edge-0's tunnel every 0.5 s and the collector's counters (and, in the
control-path scenarios, edge-0's control path every 0.5 s: Ready, its Lease renewed, its
InternalIP the node's; and the ``k3s-agent.service`` restarts), over a fixed
window that starts at the scenario's fault (its first mark; for ``boot-with-offload`` the
moment the world is built, since the fault is there from boot). Both variants of a scenario
get the same window, so "outage seconds" and "collector messages lost" compare like for
like.

Without the agent, the scenario's waits for agent states can never succeed; they are
capped at 15 s (the world keeps running, which is the point) and the run is held until
the window has passed.

``--field`` runs the world at the field's settings instead of the lab's tuning, as
``edgeheal lab --field`` does: K = 25 s and the agent on its shipped defaults; for the
uplink scenarios the example config's uplink sections enabled with every default value
(``[uplink] window`` 60 s, ``[remediation.uplink] act_after`` 5 min, ...), only the
interface and the lab's D-Bus address named.

``--rebind`` adds ``[remediation.rebind] enabled = true`` to the agent's config (a scenario
that sets it already is unchanged): whether the opt-in rung makes a scenario worse.

How it hooks in without touching the lab: :func:`edgeheal.lab.runner.run_scenario` builds
its ``Lab`` through the module's global name, which this process (and only this process)
points at :class:`ProbedLab`; the scenario's coroutine is wrapped to hold the window and
read the collector before the world is torn down.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import labkit
from labkit import TunnelProbe

from edgeheal.lab import runner
from edgeheal.lab.path_faults import REBIND_ON
from edgeheal.lab.runner import Expectation, Lab, Scenario
from edgeheal.lab.scenarios import SCENARIOS

FAULT_MARKS = {"stuck-flannel": "fault_injected", "modem-reconnect": "uplink_recreated",
               "uplink-outage": "outage_start", "lossy-link": "loss_start",
               "dead-neighbour": "neighbour_off", "flapping-uplink": "flapping_start",
               "stuck-modem": "modem_stuck", "no-coverage": "coverage_lost",
               "pmtu-blackhole": "mtu_dropped", "modem-vanishes": "modem_vanished",
               "registration-denied": "registration_denied", "dead-sim": "sim_refused",
               "nm-stuck-modem": "nm_modem_stuck", "uplink-failover": "switch_0",
               "stale-nat": "nat_renumbered", "stale-nat-restart": "nat_renumbered",
               "port-drift": "nat_forgot", "port-drift-restart": "nat_forgot",
               "modem-drops-ip": "address_lost",
               "agent-stuck": "agent_stuck", "node-ip-changed": "ip_changed",
               "control-uplink-outage": "outage_start"}
"""The mark where each scenario's fault begins; absent: the fault is there from boot."""
NO_AGENT_WAIT = 15.0
CONTROL_EVERY = 0.5

RESULT: dict[str, Any] = {}


class ProbedLab(Lab):
    """The runner's Lab plus a tunnel probe on edge-0 from the moment the world exists."""

    current: ProbedLab | None = None

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.wall0 = time.time() - (time.monotonic() - self.t0)
        edge = self.world.edges[0]
        self.probe = TunnelProbe(edge.ns, self.world.mqtt_port).start()
        self.control: list[tuple[float, bool]] = []
        """(wall, healthy) of edge-0's control path every 0.5 s, in a world with the
        stand-in K3s agent: Ready, its Lease renewed, its InternalIP the node's."""
        self.control_task = (asyncio.create_task(self._control(edge), name="bench.control")
                             if self.world.k3s else None)
        ProbedLab.current = self

    async def _control(self, edge: Any) -> None:
        from edgeheal.lab.control_faults import control_healthy

        while True:
            self.control.append((time.time(), control_healthy(self, edge)))
            await asyncio.sleep(CONTROL_EVERY)

    def control_outage(self, start: float, end: float) -> float | None:
        """Seconds of ``[start, end]`` (wall) in which the control path was not healthy."""
        if self.control_task is None:
            return None
        return CONTROL_EVERY * sum(1 for w, ok in self.control if start <= w <= end
                                   and not ok)

    async def until(self, predicate: Callable[[], bool], within: float, what: str) -> bool:
        if not self.world.with_agent:
            within = min(within, NO_AGENT_WAIT)
        return await super().until(predicate, within, what)


def wrap(scenario: Scenario, window: float) -> Scenario:
    async def run(lab: Lab) -> list[Expectation]:
        expectations = await scenario.run(lab)
        mark = FAULT_MARKS.get(scenario.name)
        start = lab.marks.get(mark, 0.0) if mark else 0.0
        if lab.now() < start + window:
            await lab.hold(start + window - lab.now())
        assert isinstance(lab, ProbedLab)
        edge = lab.world.edges[0]
        start_wall, end_wall = lab.wall0 + start, lab.wall0 + start + window
        stats = lab.world.collector_stats(edge)
        lost = [t for t in stats.get("lost_at", []) if start_wall <= t <= end_wall]
        await lab.probe.stop()
        if lab.control_task is not None:
            lab.control_task.cancel()
            await asyncio.gather(lab.control_task, return_exceptions=True)
        started = lab.marks.get("agent_started")
        doc = lab.world.status(edge) or {}
        actions = [f"{a.get('mode')}:{a.get('result')}" for a in doc.get("actions") or []
                   if isinstance(a, dict)]
        RESULT.update({
            "agent_started": started,
            "outage_after_agent_start": None if started is None or started <= start
            else lab.probe.outage_seconds(lab.wall0 + started, end_wall),
            "fault_at": start, "window": window,
            "outage_seconds": lab.probe.outage_seconds(start_wall, end_wall),
            "probes": sum(1 for w, _, _ in lab.probe.results if start_wall <= w <= end_wall),
            "lost": len(lost), "sent": stats.get("sent"),
            "restarts": len(lab.world.kube.deletions) if lab.world.kube else 0,
            "actions": actions,
            "control_outage_seconds": lab.control_outage(start_wall, end_wall),
            "agent_restarts": sum(k.restarts for k in lab.world.k3s.values())
            if lab.world.k3s else None})
        return expectations
    budget = scenario.budget + window + 120
    return dataclasses.replace(scenario, run=run, budget=budget)


def _terminate(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--window", type=float, required=True)
    parser.add_argument("--no-agent", action="store_true")
    parser.add_argument("--field", action="store_true",
                        help="the shipped defaults (K = 25 s) instead of the lab's tuning")
    parser.add_argument("--rebind", action="store_true",
                        help="the agent with [remediation.rebind] enabled = true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    runner.Lab = ProbedLab  # type: ignore[misc]
    workdir = Path(tempfile.mkdtemp(prefix="edgeheal-bench-onoff-"))
    scenario = wrap(SCENARIOS[args.scenario], args.window)
    if args.rebind and "[remediation.rebind]" not in scenario.agent_extra:
        scenario = dataclasses.replace(scenario,
                                       agent_extra=scenario.agent_extra + REBIND_ON)
    report = asyncio.run(runner.run_scenario(scenario, workdir, agent=not args.no_agent,
                                             live=False, quick=True,
                                             field=args.field))
    doc = {"scenario": args.scenario, "agent": not args.no_agent, "field": args.field,
           "rebind": "[remediation.rebind]" in scenario.agent_extra,
           **RESULT,
           "passed": report["passed"], "error": report["error"],
           "expectations": report["expectations"], "marks": report["marks"],
           "duration": report["duration_seconds"]}
    labkit.dump(args.out, doc)
    ok = bool(RESULT) and not report["error"]
    if ok:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"{args.scenario}: {report['error'] or 'no result'} (logs in {workdir})",
              file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
