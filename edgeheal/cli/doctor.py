"""``edgeheal doctor [--json] [--probe-mtu]``: is this node set up to stay connected?

Runs every check of :mod:`edgeheal.tools.doctor` once (a few seconds; read-only) and prints a
table — check, ok/warn/fail/skip, what was found, how to fix it — or, with ``--json``, the
document of ``schemas/doctor.schema.json``. An MTU mismatch is the first row.

Exit codes: 0 nothing fails (warnings and skips allowed); 1 some check fails; 2 usage or
configuration error (an invalid config stops before any check, as ``check-config``
reports it); 3 the doctor cannot run (rtnetlink cannot be opened, pyroute2 missing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from edgeheal.model import ExitCode


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "doctor", help="check that this node is set up to stay connected (read-only)",
        description="Check WireGuard, MTU, offload, time, state, brokers, Kubernetes "
        "permissions and the service, and say how to fix what is wrong. Read-only.")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--probe-mtu", action="store_true",
                   help="also send a few unfragmentable ICMP echo requests through each "
                   "tunnel to find the largest packet that really passes (up to ~25 s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgeheal.settings import load
    from edgeheal.tools import doctor

    config = load(getattr(args, "config", None))
    try:
        findings = asyncio.run(doctor.examine(config, doctor.System(),
                                              probe_mtu=args.probe_mtu))
    except (OSError, ImportError) as err:
        print(f"edgeheal: doctor: cannot run: {err}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    if args.json:
        print(json.dumps(doctor.to_json(config, findings), indent=2))
    else:
        print(doctor.render(findings))
    return ExitCode.CONDITION_FALSE if doctor.exit_code(findings) else ExitCode.OK
