"""``edgeheal offload apply [--dry-run]`` and ``edgeheal offload status``.

``apply`` is what the boot-time oneshot unit (``systemd/edgeheal-offload.service``) runs
before K3s starts: one pass of :func:`edgeheal.checks.offload.enforcer.apply` over the configured
interfaces, never waiting for an interface that is not there yet (the running agent fixes
it when it appears). ``status`` only reads. Both print one row per interface and feature.

Exit codes: 0 every configured feature is off afterwards (for ``status``: now); 1 some
feature is (or with ``--dry-run`` would stay) on, or ``require_interface = true`` and no
interface matches; 2 configuration error (e.g. an unknown feature name, which lists the
valid ones); 3 permission denied (changing features needs CAP_NET_ADMIN) or the kernel
could not be asked.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from edgeheal.model import ExitCode


def add_parser(sub: Any) -> None:
    p = sub.add_parser("offload", help="TX checksum offload: apply once, or show state")
    inner = p.add_subparsers(dest="offload_command", metavar="ACTION")
    inner.required = True
    a = inner.add_parser("apply", help="turn the configured features off now (boot unit)")
    a.add_argument("--dry-run", action="store_true",
                   help="change nothing; show what would be turned off")
    a.set_defaults(func=run)
    s = inner.add_parser("status", help="show the configured features' current state")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgeheal.boundaries.kernel.ethtool import Ethtool, EthtoolError
    from edgeheal.checks.offload.enforcer import apply
    from edgeheal.settings import load

    config = load(getattr(args, "config", None))
    settings = config.offload
    status = args.offload_command == "status"
    act = not status and not args.dry_run
    if not settings.interfaces:
        print("edgeheal: no [offload] interfaces configured; nothing to do")
        return ExitCode.OK
    try:
        with Ethtool() as source:
            report = apply(source, settings.interfaces, settings.features, act=act)
    except EthtoolError as err:
        print(f"edgeheal: {err}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    print(render(report, status=status, dry_run=not act and not status))
    for pattern in report.unmatched:
        print(f"edgeheal: no interface matches {pattern!r}"
              + ("" if report.interfaces or settings.require_interface
                 else " (the running agent fixes it when it appears)"), file=sys.stderr)
    return exit_code(report, require_interface=settings.require_interface)


def exit_code(report: Any, *, require_interface: bool) -> int:
    from edgeheal.checks.offload.enforcer import Outcome, problem_text

    for iface in report.interfaces:
        for r in iface.results:
            if r.outcome in (Outcome.FIXED_ON, Outcome.REFUSED):
                print(f"edgeheal: {problem_text(iface, r.feature, r.outcome.value)}",
                      file=sys.stderr)
        if iface.error:
            print(f"edgeheal: {iface.message}", file=sys.stderr)
    if report.permission_denied:
        return ExitCode.ENVIRONMENT
    if require_interface and not report.interfaces:
        return ExitCode.CONDITION_FALSE
    return ExitCode.OK if report.all_off else ExitCode.CONDITION_FALSE


def render(report: Any, *, status: bool = False, dry_run: bool = False) -> str:
    """The table: one row per interface and configured feature."""
    from edgeheal.checks.offload.enforcer import Outcome

    rows: list[tuple[str, ...]]
    if status:
        rows = [("INTERFACE", "FEATURE", "STATE", "RESULT")]
    else:
        rows = [("INTERFACE", "FEATURE", "BEFORE", "AFTER", "RESULT")]
    for iface in report.interfaces:
        for r in iface.results:
            before = r.before.render() if r.before is not None else "-"
            result = r.outcome.value
            if dry_run and r.outcome is Outcome.ON:
                result = "on (would turn off)"
            if iface.error == "permission_denied" and r.outcome is Outcome.ON:
                result = "on (permission denied)"
            if status:
                rows.append((iface.interface, r.feature, before, result))
            else:
                after = r.after.render() if r.after is not None else before
                rows.append((iface.interface, r.feature, before, after, result))
    if len(rows) == 1:
        return "no matching interface is present"
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True))
             + "  " + row[-1] for row in rows]
    if dry_run:
        lines.append("(dry run: nothing was changed)")
    return "\n".join(lines)
