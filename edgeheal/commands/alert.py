"""``edgeheal alert test [--count N]``: the operator's end-to-end check of the alert path.

Asks the running agent, over its root-only control socket (``<state_dir>/control.sock``),
to raise N alerts of kind ``agent.test``. They go through the whole pipeline — outbox,
ordered drain, QoS 1 publish to ``<prefix>/<node>/alerts`` — exactly like real alerts, so
a subscriber that sees them has proved the path. Prints the ids raised (one per line with
``--ids``), which is also how the tests inject alerts from outside.

Exit codes: 0 the agent raised them (delivery follows asynchronously); 2 bad usage or
configuration; 3 the agent is not running or the socket is not accessible (run as root).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edgeheal.model import ExitCode

MAX_COUNT = 1000


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_COUNT}, got {value}")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser("alert", help="alerts: send test alerts through the running agent")
    inner = p.add_subparsers(dest="alert_command", metavar="ACTION")
    inner.required = True
    t = inner.add_parser("test", help="raise N test alerts (kind agent.test) end to end")
    t.add_argument("--count", type=_count, default=1, metavar="N",
                   help=f"how many test alerts to raise (1-{MAX_COUNT}, default 1)")
    t.add_argument("--ids", action="store_true", help="print only the alert ids, one a line")
    t.add_argument("--json", action="store_true", help="print the agent's reply as JSON")
    t.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgeheal import control  # noqa: PLC0415
    from edgeheal.validation import load  # noqa: PLC0415

    config = load(getattr(args, "config", None))
    try:
        result = control.call(config.agent.state_dir, "alert.test", {"count": args.count})
    except control.ControlError as err:
        print(f"edgeheal: {err}", file=sys.stderr)
        return ExitCode.ENVIRONMENT if err.unreachable else ExitCode.USAGE
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif args.ids:
        print("\n".join(result.get("ids", [])))
    else:
        where = (f"published to {result.get('topic')} via {result.get('target')}"
                 if result.get("target") else "kept in the outbox and the log ([alerts] "
                 "target is empty)")
        print(f"raised {result.get('raised')} test alert(s); {where}; "
              f"outbox depth {result.get('outbox_depth')}")
    return ExitCode.OK
