"""``edgeheal alert test [--count N]``: the operator's end-to-end check of the alert path.

Asks the running agent, over its root-only control socket (``<state_dir>/control.sock``),
to raise N alerts of kind ``agent.test``. They go through the whole pipeline — outbox,
ordered drain, QoS 1 publish to ``<prefix>/<node>/alerts`` — exactly like real alerts, so
a subscriber that sees them has proved the path. Prints the ids raised (one per line with
``--ids``), which is also how the tests inject alerts from outside.

The agent waits up to ``--wait`` seconds (default 5) for the broker's acknowledgements
(PUBACK) and the command says how many were **published** (acknowledged) and how many
are only **queued** (in the outbox, delivered when the broker is reachable): "published"
is never said of an alert the broker has not acknowledged.

Exit codes: 0 the agent raised them (published or queued, as printed); 2 bad usage or
configuration; 3 the agent is not running or the socket is not accessible (run as root).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edgeheal.model import ExitCode

MAX_COUNT = 1000
MAX_WAIT = 30.0


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_COUNT}, got {value}")
    return value


def _wait(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 <= value <= MAX_WAIT:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"expected 0 to {MAX_WAIT:g} seconds, got {text}")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser("alert", help="alerts: send test alerts through the running agent")
    inner = p.add_subparsers(dest="alert_command", metavar="ACTION")
    inner.required = True
    t = inner.add_parser("test", help="raise N test alerts (kind agent.test) end to end")
    t.add_argument("--count", type=_count, default=1, metavar="N",
                   help=f"how many test alerts to raise (1-{MAX_COUNT}, default 1)")
    t.add_argument("--wait", type=_wait, default=5.0, metavar="SECONDS",
                   help=f"wait this long for the broker's acknowledgements (0-{MAX_WAIT:g}, "
                   "default 5)")
    t.add_argument("--ids", action="store_true", help="print only the alert ids, one a line")
    t.add_argument("--json", action="store_true", help="print the agent's reply as JSON")
    t.set_defaults(func=run)
    k = inner.add_parser("kinds", help="print the closed table of alert kinds (Markdown)")
    k.add_argument("--enum", action="store_true",
                   help="print the alert schema's kind enum (JSON) instead")
    k.set_defaults(func=run_kinds)


def run_kinds(args: argparse.Namespace) -> int:
    """The generated half of docs/alerts.md and of the schema (a test keeps both in step)."""
    from edgeheal.agent.alerts import kinds

    print(json.dumps(kinds.schema_enum(), indent=2) if args.enum else kinds.markdown_table(),
          end="\n" if args.enum else "")
    return ExitCode.OK


def run(args: argparse.Namespace) -> int:
    from edgeheal.boundaries import control_socket as control
    from edgeheal.settings import load

    config = load(getattr(args, "config", None))
    try:
        result = control.call(config.agent.state_dir, "alert.test",
                              {"count": args.count, "wait": args.wait},
                              timeout=args.wait + 30.0)
    except control.ControlError as err:
        print(f"edgeheal: {err}", file=sys.stderr)
        return ExitCode.ENVIRONMENT if err.unreachable else ExitCode.USAGE
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif args.ids:
        print("\n".join(result.get("ids", [])))
    else:
        print(_summary(result))
    return ExitCode.OK


def _summary(result: dict[str, Any]) -> str:
    raised, published = result.get("raised"), result.get("published", 0)
    queued = result.get("queued", raised)
    target, topic = result.get("target"), result.get("topic")
    if not target:
        where = "kept in the outbox and the log ([alerts] target is empty)"
    elif published == raised:
        where = f"published to {topic} via {target} (acknowledged by the broker)"
    elif published:
        where = (f"{published} published to {topic} via {target}, {queued} queued (not "
                 f"acknowledged within {result.get('waited_seconds')}s)")
    else:
        where = (f"queued for {topic} via {target}: not acknowledged within "
                 f"{result.get('waited_seconds')}s, delivered when the broker is reachable "
                 "(see `edgeheal status`)")
    return f"raised {raised} test alert(s); {where}; outbox depth {result.get('outbox_depth')}"
