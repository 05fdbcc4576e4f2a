"""``edgeheal fleet hold --for 30m --reason TEXT`` / ``edgeheal fleet release``.

Publishes (or clears) the retained fleet hold on ``<topic_prefix>/fleet/hold`` through the
broker of ``[alerts] target``, with that target's settings (host, port, TLS, username,
password file): the broker every agent of the fleet keeps a connection to. Every agent with
``[fleet] hold = true`` hears it at once (or when it next connects: the message is
retained), and its Flannel ladder skips with ``fleet_hold`` until ``until`` or a release
(:mod:`edgeheal.boundaries.mqtt.hold`, docs/remediation.md). Run it from any machine with
an edgeheal config for that broker; the broker's ACL decides who may write the topic.

Exit codes: 0 published (the broker's PUBACK came); 2 bad usage (no ``[alerts] target``,
a duration beyond ``[fleet] max_hold``, an empty or unprintable reason); 3 the broker
cannot be reached or refused.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import datetime, timedelta
from typing import Any

from edgeheal.model import ExitCode


def add_parser(sub: Any) -> None:
    p = sub.add_parser("fleet", help="hold or release every agent's Flannel restarts at once",
                       description="Publish or clear the retained fleet hold through the "
                       "[alerts] target's broker.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    hold = verbs.add_parser("hold", help="hold every agent's Flannel ladder for a while")
    hold.add_argument("--for", dest="duration", required=True, metavar="DURATION",
                      help='how long ("30m", "2h"); at most [fleet] max_hold')
    hold.add_argument("--reason", required=True, help="why (shown in every /status)")
    hold.add_argument("--by", default="", help="who (shown with the reason)")
    hold.set_defaults(func=run)
    release = verbs.add_parser("release", help="end the fleet hold now")
    release.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgeheal.base.compat import UTC
    from edgeheal.boundaries.mqtt import MqttError, hold
    from edgeheal.config import parse_duration
    from edgeheal.settings import load

    config = load(getattr(args, "config", None))
    if not config.alerts.target:
        print("edgeheal: fleet: the configuration has no [alerts] target: no broker to "
              "publish the hold on", file=sys.stderr)
        return ExitCode.USAGE
    target = next(t for t in config.mqtt.targets if t.name == config.alerts.target)
    topic = hold.topic(config.alerts.topic_prefix.strip("/"))
    payload = b""
    if args.verb == "hold":
        try:
            seconds = parse_duration(args.duration)
        except ValueError as err:
            print(f"edgeheal: fleet: --for: {err}", file=sys.stderr)
            return ExitCode.USAGE
        if not 60.0 <= seconds <= config.fleet.max_hold:
            print(f"edgeheal: fleet: --for must be 1m to [fleet] max_hold "
                  f"({config.fleet.max_hold:g}s), got {seconds:g}s", file=sys.stderr)
            return ExitCode.USAGE
        until = datetime.now(UTC) + timedelta(seconds=seconds)
        payload = hold.encode(args.reason, until, args.by)
        try:
            hold.parse(payload, datetime.now(UTC), config.fleet.max_hold)
        except hold.HoldRefused as err:  # what every agent would refuse, refused here first
            print(f"edgeheal: fleet: the hold would be refused: {err}", file=sys.stderr)
            return ExitCode.USAGE
    try:
        asyncio.run(_publish(target, config.node, topic, payload))
    except MqttError as err:
        print(f"edgeheal: fleet: {err.message}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    if args.verb == "hold":
        print(f"fleet hold set on {topic} until {until:%Y-%m-%dT%H:%M:%SZ}: {args.reason}")
    else:
        print(f"fleet hold released on {topic}")
    return ExitCode.OK


async def _publish(target: Any, node: str, topic: str, payload: bytes) -> None:
    import dataclasses

    from edgeheal.base import compat
    from edgeheal.boundaries.mqtt import MqttError
    from edgeheal.boundaries.mqtt.client import Connection

    # its own client id: the agent of this node keeps its session under the default one
    target = dataclasses.replace(target, client_id=f"edgeheal-fleet-{node}"[:64])
    conn = Connection(target, node, keepalive=30.0)
    try:
        async with compat.timeout(target.timeout):
            await conn.connect()
        async with compat.timeout(max(target.timeout, 5.0)):
            await conn.publish(topic, payload, retain=True)
    except compat.TimeoutErrors:
        raise MqttError("timeout", f"{target.host}:{target.port}: no answer within "
                        f"{target.timeout:g}s") from None
    finally:
        await conn.disconnect()
