"""``edgeheal lab``: reproduce the field incident on one machine and watch edgeheal heal it.

Exit codes as everywhere: 0 the scenario's expectations held, 1 one did not, 2 usage
(unknown scenario), 3 the environment lacks something (not root, a program missing).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from edgeheal.model import ExitCode


def add_parser(sub: Any) -> None:
    p = sub.add_parser("lab", help="reproduce the field incident in network namespaces",
                       description="Builds a cloud, a 4G carrier with a faulty NIC and edge "
                       "nodes in network namespaces, runs the real agent, injects a field "
                       "fault, and reports what happened. Needs root.")
    p.add_argument("--list", action="store_true", help="list the scenarios")
    p.add_argument("--scenario", default=None, help="scenario to run (default: "
                   "boot-with-offload)")
    p.add_argument("--edges", type=int, default=None, help="number of edge nodes")
    p.add_argument("--no-agent", action="store_true",
                   help="run without edgeheal (the baseline: what happens without it)")
    p.add_argument("--report", metavar="PATH", help="write the JSON report here")
    p.add_argument("--keep", action="store_true",
                   help="keep the working directory (logs of every process)")
    p.add_argument("--quiet", action="store_true", help="no live timeline")
    p.add_argument("--quick", action="store_true",
                   help="shortened long scenarios (lossy-link 90 s, flapping-uplink 3 flaps)")
    p.add_argument("--field", action="store_true",
                   help="field timings: WireGuard keepalive 25 s (Flannel's) and the agent "
                   "on its shipped defaults instead of the lab's fast tuning (slower)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgeheal.lab.netns import LabError, require_programs, require_root, sweep
    from edgeheal.lab.runner import render_summary, run_scenario, write_report
    from edgeheal.lab.scenarios import DEFAULT, SCENARIOS
    from edgeheal.lab.world import PROGRAMS

    if args.list:
        for name, scenario in SCENARIOS.items():
            print(f"{name:<20} {scenario.summary}")
        return ExitCode.OK
    name = args.scenario or DEFAULT
    if name not in SCENARIOS:
        print(f"edgeheal lab: no scenario {name!r}; known: {', '.join(SCENARIOS)}",
              file=sys.stderr)
        return ExitCode.USAGE
    scenario = SCENARIOS[name]
    if args.edges is not None and not 1 <= args.edges <= 50:
        print("edgeheal lab: --edges must be between 1 and 50", file=sys.stderr)
        return ExitCode.USAGE
    try:
        require_root()
        require_programs(*PROGRAMS)
    except LabError as err:
        print(f"edgeheal lab: {err}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    sweep()
    workdir = Path(tempfile.mkdtemp(prefix="edgeheal-lab-"))
    # SIGTERM behaves like Ctrl-C: unwind, and the world's teardown removes everything
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        report = asyncio.run(run_scenario(scenario, workdir, edges=args.edges,
                                          agent=False if args.no_agent else None,
                                          live=not args.quiet, quick=args.quick,
                                          field=args.field))
    except KeyboardInterrupt:
        print("edgeheal lab: interrupted; everything it made was removed", file=sys.stderr)
        return ExitCode.CONDITION_FALSE
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(render_summary(report))
    if args.keep:
        print(f"  logs: {workdir}")
    if args.report:
        write_report(report, Path(args.report))
        _plot(report, Path(args.report))
    if report["error"] and "LabError" in report["error"]:
        return ExitCode.ENVIRONMENT
    return ExitCode.OK if report["passed"] else ExitCode.CONDITION_FALSE


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _plot(report: dict[str, Any], path: Path) -> None:
    try:
        from edgeheal.lab.plot import timeline_svg
    except ImportError:
        return
    svg = path.with_suffix(".svg")
    svg.write_text(timeline_svg(report))
    print(f"  report: {path} (timeline picture: {svg})")
