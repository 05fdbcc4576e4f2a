"""``edgeheal diagnose [--interface UPLINK] [--seconds N] [--json]``: one-command diagnosis.

Captures the tunnel's WireGuard UDP on the uplink for N seconds, reads the UDP checksum
counters, the uplink's TX checksum offload and the tunnel's peers, and prints a verdict in
plain words with the evidence (:mod:`edgeheal.tools.diagnose`; scapy is imported only by its
capture).

Exit codes: 0 the tunnel is healthy; 1 a problem was found (or nothing could be observed);
2 usage or configuration error (also: no uplink found, pass ``--interface``); 3 scapy is not
installed, CAP_NET_RAW is missing, or a WireGuard device cannot be read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from edgeheal.model import ExitCode


def _seconds(text: str) -> float:
    from edgeheal.config import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 600 s, got {text}")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "diagnose", help="capture the tunnel's traffic for a while and say what is wrong",
        description="Capture the WireGuard UDP of the configured tunnel interfaces on the "
        "uplink, read checksum counters, offload state and peer stats, and print a verdict.")
    p.add_argument("--interface", metavar="UPLINK",
                   help="interface to capture on (default: the [offload] interfaces match, "
                   "else the interface of the route to the peers' endpoints)")
    p.add_argument("--seconds", metavar="N", type=_seconds, default=None,
                   help="capture duration (default: longest peer keepalive + 5 s, at least "
                   "10 s)")
    p.add_argument("--json", action="store_true", help="print the evidence as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgeheal.settings import load
    from edgeheal.tools import diagnose

    config = load(getattr(args, "config", None))
    try:
        evidence, verdict = asyncio.run(diagnose.diagnose(
            config, interface=args.interface, seconds=args.seconds))
    except diagnose.EnvironmentProblem as err:
        print(f"edgeheal: diagnose: {err}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    except diagnose.DiagnoseError as err:
        print(f"edgeheal: diagnose: {err}", file=sys.stderr)
        return ExitCode.USAGE
    if args.json:
        print(json.dumps(diagnose.to_json(evidence, verdict), indent=2))
    else:
        print(diagnose.render(evidence, verdict))
    return ExitCode.CONDITION_FALSE if verdict.problem else ExitCode.OK
