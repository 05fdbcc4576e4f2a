"""The ``edgeheal`` command. One exit-code table for every command (``model.ExitCode``):

====  ==================================================================================
0     success; the checked condition holds (healthy, ready, every feature off)
1     the checked condition is false (not ready, a feature still on, an expectation missed)
2     usage or configuration error (systemd does not restart on it)
3     the environment is missing something (agent unreachable, privilege or program)
====  ==================================================================================

A reader that stops early (``edgeheal check-config | head``) closes the pipe: the command
then ends quietly with 141 (128 + SIGPIPE, what a shell reports for other programs),
without a traceback.

Command groups beyond the spine live in ``edgeheal/cli/<group>.py`` (``add_parser``
and ``run``), imported only to build the parser; their heavy imports happen in ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys

from edgeheal import __version__
from edgeheal.config import ConfigError, redacted, reference
from edgeheal.model import ExitCode
from edgeheal.settings import load

log = logging.getLogger("edgeheal")

EXIT_BROKEN_PIPE = 128 + 13
"""The reader of standard output went away (SIGPIPE's number, as shells report it)."""

COMMAND_GROUPS = ("status", "offload", "alert", "remediation", "lab", "diagnose", "doctor",
                  "bundle", "fleet")
CONFIG_HELP = "configuration file (default: $EDGEHEAL_CONFIG or /etc/edgeheal/edgeheal.toml)"


def build_parser(groups: tuple[str, ...] = COMMAND_GROUPS) -> argparse.ArgumentParser:
    """``groups``: the command groups to offer besides ``run`` and ``check-config``."""
    parser = argparse.ArgumentParser(
        prog="edgeheal", description="Keeps a K3s edge node's Flannel WireGuard tunnel healthy.")
    parser.add_argument("--version", action="version", version=f"edgeheal {__version__}")
    parser.add_argument("--config", metavar="PATH", help=CONFIG_HELP)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", help=CONFIG_HELP, default=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("run", parents=[common], help="run the agent (what systemd starts)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("check-config", parents=[common],
                       help="validate the configuration and print it, secrets redacted")
    p.add_argument("--reference", action="store_true",
                   help="print the configuration reference (Markdown) instead")
    p.set_defaults(func=cmd_check_config)
    for group in groups:
        try:
            module = importlib.import_module(f"edgeheal.cli.{group}")
        except ModuleNotFoundError as err:
            if err.name != f"edgeheal.cli.{group}":
                raise
            continue
        module.add_parser(sub)
    _accept_config_everywhere(sub)
    return parser


def _accept_config_everywhere(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Every (sub)command takes ``--config`` after its name, too."""
    for leaf in sub.choices.values():
        if not any("--config" in a.option_strings for a in leaf._actions):
            leaf.add_argument("--config", metavar="PATH", help=CONFIG_HELP,
                              default=argparse.SUPPRESS)
        for action in leaf._actions:
            if isinstance(action, argparse._SubParsersAction):
                _accept_config_everywhere(action)


def main(argv: list[str] | None = None) -> int:
    from edgeheal.base import log as logsetup

    logsetup.setup(os.environ.get("EDGEHEAL_LOG_LEVEL", "info"))
    parser = build_parser(() if runs_agent(sys.argv[1:] if argv is None else argv)
                          else COMMAND_GROUPS)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0) and ExitCode.USAGE
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe is found here, not at interpreter exit
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except ConfigError as err:
        print(f"edgeheal: configuration error: {err}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        return ExitCode.CONDITION_FALSE
    return code


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush finds no broken pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def runs_agent(argv: list[str]) -> bool:
    """The command line is ``edgeheal [--config PATH] run ...`` (no help or version asked
    before ``run``): the parser then needs no other command group, and the agent does not
    keep their modules for its whole life (docs/footprint.md: 0.1 MB of its RSS; building
    the parser alone, 16 MB instead of 25 MB peak and 0.11 s instead of 0.18 s)."""
    words = iter(argv)
    for word in words:
        if word == "--config":
            next(words, None)
        elif not word.startswith("-"):
            return word == "run"
        elif not word.startswith("--config="):
            return False
    return False


def cmd_run(args: argparse.Namespace) -> int:
    config = load(args.config)
    from edgeheal.agent.supervisor import run_forever
    from edgeheal.base import log as logsetup

    logsetup.setup(os.environ.get("EDGEHEAL_LOG_LEVEL", config.agent.log_level))
    try:
        run_forever(config)
    except PermissionError as err:
        log.error("permission denied: %s (run as root or with CAP_NET_ADMIN)", err)
        return ExitCode.ENVIRONMENT
    except OSError as err:
        log.error("cannot start: %s", err)
        return ExitCode.ENVIRONMENT
    return ExitCode.OK


def cmd_check_config(args: argparse.Namespace) -> int:
    if args.reference:
        print(reference_markdown())
        return ExitCode.OK
    config = load(args.config, check_files=True)
    print(f"# {config.source}: valid", file=sys.stderr)
    print(json.dumps(redacted(config), indent=2))
    return ExitCode.OK


def reference_markdown() -> str:
    lines = ["# Configuration reference", "",
             "Generated from the settings' docstrings by "
             "`edgeheal check-config --reference`; do not edit by hand.", "",
             "The file is TOML, by default `/etc/edgeheal/edgeheal.toml` (`--config PATH` or "
             "`$EDGEHEAL_CONFIG` override it). Durations accept `\"20s\"`, `\"2m\"`, `\"1h\"`, "
             "`\"500ms\"`, `\"1d\"` or a number of seconds, each within the range its row "
             "gives (`nan`, `inf` or a negative value never is). Unknown keys are errors "
             "(exit 2), so a typo never silently falls back to a default. The file itself must "
             "be a regular file of at most 1 MiB of UTF-8. Every check section (`[offload]`, "
             "`[wireguard]`, each `[[mqtt.targets]]`) also takes the common keys `enabled`, "
             "`interval`, `timeout`, `fail_after`, `recover_after`, `retry_interval`, "
             "`required`.", ""]
    section = None
    for key, default, text in reference():
        head = key.rsplit(".", 1)[0] if "." in key else ""
        if head != section:
            section = head
            lines += ["", f"## `[{head}]`", "", "| key | default | meaning |",
                      "|---|---|---|"]
        lines.append(f"| `{key}` | `{default}` | {text.replace('|', '/')} |")
    return "\n".join(lines)
