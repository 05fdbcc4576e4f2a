"""``edgeheal fleet hold --for 30m --reason TEXT`` / ``edgeheal fleet release`` /
``edgeheal fleet receive --listen HOST:PORT``.

Publishes (or clears) the retained fleet hold on ``<topic_prefix>/fleet/hold`` through the
broker of ``[alerts] target``, with that target's settings (host, port, TLS, username,
password file): the broker every agent of the fleet keeps a connection to. Every agent with
``[fleet] hold = true`` hears it at once (or when it next connects: the message is
retained), and its Flannel ladder skips with ``fleet_hold`` until ``until`` or a release
(:mod:`edgeheal.boundaries.mqtt.hold`, docs/remediation.md). Run it from any machine with
an edgeheal config for that broker; the broker's ACL decides who may write the topic.

``receive`` is the automatic hold: an Alertmanager webhook receiver that publishes the
hold while ``EdgehealHubFaultFleetwide`` fires and releases it when it resolves
(:mod:`edgeheal.tools.hold_receiver`, monitoring/alertmanager/fleet-hold.yaml). It runs
until SIGTERM or SIGINT (exit 0); 2 bad usage, 3 the address cannot be bound.

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
    receive = verbs.add_parser(
        "receive", help="Alertmanager webhook: hold while the hub-fault alert fires",
        description="Answer Alertmanager's webhook on POST /alertmanager: publish the "
        "fleet hold (reason: the alert's name, until: now + --for) while the alert fires, "
        "release it when it resolves.")
    receive.add_argument("--listen", default="127.0.0.1:9095", metavar="HOST:PORT",
                         help="where Alertmanager POSTs (default 127.0.0.1:9095)")
    receive.add_argument("--for", dest="duration", default="30m", metavar="DURATION",
                         help="each firing notification holds this long (default 30m; "
                         "keep the route's repeat_interval well under it)")
    receive.add_argument("--alert", default="EdgehealHubFaultFleetwide", metavar="NAME",
                         help="the alert that sets the hold (default %(default)s)")
    receive.add_argument("--token-file", default=None, metavar="PATH",
                         help="require Authorization: Bearer <the file's content> "
                         "(Alertmanager: http_config.authorization.credentials_file)")
    receive.set_defaults(func=run_receive)


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


def run_receive(args: argparse.Namespace) -> int:
    import logging
    import signal
    from pathlib import Path

    from edgeheal.base.log import setup
    from edgeheal.boundaries.mqtt import hold
    from edgeheal.config import parse_duration
    from edgeheal.settings import load
    from edgeheal.tools import hold_receiver

    config = load(getattr(args, "config", None))
    if not config.alerts.target:
        print("edgeheal: fleet: the configuration has no [alerts] target: no broker to "
              "publish the hold on", file=sys.stderr)
        return ExitCode.USAGE
    try:
        seconds = parse_duration(args.duration)
    except ValueError as err:
        print(f"edgeheal: fleet: --for: {err}", file=sys.stderr)
        return ExitCode.USAGE
    if not 60.0 <= seconds <= config.fleet.max_hold:
        print(f"edgeheal: fleet: --for must be 1m to [fleet] max_hold "
              f"({config.fleet.max_hold:g}s), got {seconds:g}s", file=sys.stderr)
        return ExitCode.USAGE
    if not args.alert or not args.alert.isprintable() or len(args.alert) > hold.MAX_REASON:
        print(f"edgeheal: fleet: --alert must be printable text of 1 to {hold.MAX_REASON} "
              "characters", file=sys.stderr)
        return ExitCode.USAGE
    token = ""
    if args.token_file:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            print(f"edgeheal: fleet: --token-file {args.token_file}: cannot read it "
                  f"({type(err).__name__})", file=sys.stderr)
            return ExitCode.USAGE
        if not token or not token.isprintable() or len(token) > 4096:
            print(f"edgeheal: fleet: --token-file {args.token_file}: want one line of "
                  "1 to 4096 printable characters", file=sys.stderr)
            return ExitCode.USAGE
    target = next(t for t in config.mqtt.targets if t.name == config.alerts.target)
    topic = hold.topic(config.alerts.topic_prefix.strip("/"))

    async def publish(payload: bytes) -> None:
        await _publish(target, config.node, topic, payload, "fleet-receive")

    receiver = hold_receiver.Receiver(publish, args.alert, seconds, token)
    setup(config.agent.log_level)
    logging.getLogger(__name__).info("fleet receive: publishing %s on %s", args.alert, topic)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await hold_receiver.serve(
            receiver, args.listen, stop,
            lambda name: print(f"fleet receive: listening on {name}{hold_receiver.PATH}, "
                               f"holding on {topic}", flush=True))

    try:
        asyncio.run(main())
    except (OSError, ValueError) as err:
        print(f"edgeheal: fleet: --listen {args.listen}: {err}", file=sys.stderr)
        return ExitCode.ENVIRONMENT if isinstance(err, OSError) else ExitCode.USAGE
    return ExitCode.OK


async def _publish(target: Any, node: str, topic: str, payload: bytes,
                   role: str = "fleet") -> None:
    import dataclasses

    from edgeheal.base import compat
    from edgeheal.boundaries.mqtt import MqttError
    from edgeheal.boundaries.mqtt.client import Connection

    # its own client id: the agent of this node keeps its session under the default one
    # (and the receiver's differs from the command's: neither takes the other's over)
    target = dataclasses.replace(target, client_id=f"edgeheal-{role}-{node}"[:64])
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
