"""``edgeheal bundle [-o PATH] [--max-size BYTES] [--lines N] [--diagnose SECONDS]``.

Writes one tar.gz for a support ticket (what is in it: :mod:`edgeheal.tools.bundle`): the
version and platform, ``doctor --json``, the running agent's ``/status`` and ``/metrics``,
the effective configuration redacted, the remediation histories, an outbox summary and the
journal's last lines, with every secret replaced. It works with the agent down (the agent's
members then say why they are empty) and offline, and with a configuration that does not
load (the defaults' state directory is read, and ``config.json`` holds the error). The
archive is created new (never overwritten), mode 0600, and prints its path and size; the
manifest lists what was cut, what failed and how many values were redacted.

Exit codes: 0 written; 2 bad usage (a size below 64 KiB, ``--lines`` out of range, a
``--url`` that is not http); 3 the archive cannot be created (it exists, the directory is
not writable).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from edgeheal.model import ExitCode

MAX_LINES = 100_000
MAX_DIAGNOSE = 60.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bundle", help="write a support bundle (tar.gz, secrets redacted)",
        description="Gather the version, doctor, /status, /metrics, the redacted "
        "configuration, the remediation histories, an outbox summary and the journal into "
        "one size-bounded tar.gz. Works with the agent down and offline.")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="archive to create (default: edgeheal-bundle-<node>-<UTC time>"
                   ".tar.gz in the current directory)")
    p.add_argument("--max-size", metavar="BYTES", type=int, default=None,
                   help="largest archive, bytes (default: 8 MiB)")
    p.add_argument("--lines", metavar="N", type=int, default=None,
                   help="journal lines to include (default: 2000)")
    p.add_argument("--unit", default="edgeheal.service", help="the agent's systemd unit")
    p.add_argument("--log-file", metavar="PATH", default="",
                   help="read the log's last lines from this file instead of the journal")
    p.add_argument("--url", help="agent base URL (default: the first [http] listen address)")
    p.add_argument("--no-agent", action="store_true", help="do not ask the running agent")
    p.add_argument("--diagnose", metavar="SECONDS", type=float, default=0.0,
                   help="also capture the tunnel's traffic this long (1-60 s; needs root)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgeheal.config import ConfigError
    from edgeheal.settings import load
    from edgeheal.tools.bundle.archive import BundleError, write
    from edgeheal.tools.bundle.members import JOURNAL_LINES, MAX_BYTES, Options, collect

    problem = _usage_problem(args)
    if problem:
        print(f"edgeheal: bundle: {problem}", file=sys.stderr)
        return ExitCode.USAGE
    config, config_error = None, ""
    try:
        config = load(getattr(args, "config", None))
    except ConfigError as err:
        config_error = str(err)
        print(f"edgeheal: bundle: the configuration does not load ({err}); bundling "
              "without it", file=sys.stderr)
    url = ""
    if not args.no_agent:
        from edgeheal.cli.status import _default_url

        try:
            url = _default_url(args) if config is not None or args.url is not None \
                else "http://127.0.0.1:9917"
        except (ValueError, ConfigError) as err:
            print(f"edgeheal: bundle: {err}", file=sys.stderr)
            return ExitCode.USAGE
    options = Options(
        agent_url=url, journal_lines=args.lines or JOURNAL_LINES,
        journal_unit=args.unit, log_file=args.log_file, diagnose_seconds=args.diagnose,
        max_bytes=args.max_size or MAX_BYTES,
        config_path=config.source if config is not None else "")
    node = config.node if config is not None else "node"
    path = Path(args.output or time.strftime(
        f"edgeheal-bundle-{_safe(node)}-%Y%m%dT%H%M%SZ.tar.gz", time.gmtime()))
    members = asyncio.run(collect(config, config_error, options))
    try:
        doc = write(members, path, options)
    except BundleError as err:
        print(f"edgeheal: bundle: {err}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    for member in doc["members"]:
        if member.get("note"):
            print(f"  {member['name']}: {member['note']}", file=sys.stderr)
    print(f"{path} ({doc['archive_bytes']} bytes)")
    return ExitCode.OK


def _usage_problem(args: argparse.Namespace) -> str:
    if args.max_size is not None and args.max_size < 64 * 1024:
        return f"--max-size must be at least 65536 bytes, got {args.max_size}"
    if args.lines is not None and not 1 <= args.lines <= MAX_LINES:
        return f"--lines must be 1 to {MAX_LINES}, got {args.lines}"
    if args.diagnose and not 1.0 <= args.diagnose <= MAX_DIAGNOSE:
        return f"--diagnose must be 1 to {MAX_DIAGNOSE:g} seconds, got {args.diagnose:g}"
    return ""


def _safe(name: str) -> str:
    """A node name made safe for a file name."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:63] or "node"
