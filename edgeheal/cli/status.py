"""``edgeheal status [--url URL] [--json]``: a running agent's ``/status`` as a table.

The URL defaults to the first ``[http] listen`` address (a wildcard address is read on
loopback). Only ``http://`` and ``https://`` URLs are read, without proxies (the agent is
local) and without following redirects; the answer is read up to :data:`MAX_BODY` bytes.
Whatever comes back, the command answers with a table or one clear line, never a
traceback, and nothing it prints can move the terminal's cursor (control characters from
the document are escaped).

Exit codes: 0 the agent is ready; 1 it answered and is not ready; 2 bad usage (a URL that
is not http(s), a bad configuration); 3 the agent cannot be reached, or what it answered is
not a status document (not JSON, not an object, ``ready`` not true/false, ``checks`` not
an object of objects).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from edgeheal.model import ExitCode

MAX_BODY = 4 * 1024 * 1024
"""Bytes of ``/status`` read at most (a real one is a few KB)."""
TIMEOUT = 5.0
"""Seconds to connect and to wait for each read."""
MAX_CELL = 80
"""Characters of one table cell (a message is cut there)."""


class StatusError(Exception):
    """The agent answered something that is not a status document."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="show a running agent's /status")
    p.add_argument("--url", help="agent base URL (default: the first [http] listen address)")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        base = _default_url(args)
    except ValueError as err:
        print(f"edgeheal: {err}", file=sys.stderr)
        return ExitCode.USAGE
    url = base + "/status"
    shown = _shown(url)
    try:
        body = _fetch(url)
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        print(f"edgeheal: cannot read {shown}: {_clean(str(reason), 200)}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    try:
        doc = parse_status(body)
    except StatusError as err:
        print(f"edgeheal: {shown} is not an edgeheal status: {err}", file=sys.stderr)
        return ExitCode.ENVIRONMENT
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(render_status(doc))
    return ExitCode.OK if doc["ready"] else ExitCode.CONDITION_FALSE


def _default_url(args: argparse.Namespace) -> str:
    """The base URL to read; ValueError for one that is not http(s)."""
    if args.url is not None:  # even "": an empty --url is a mistake, not the default
        url = str(args.url).rstrip("/")
        if not url.isprintable() or any(c.isspace() for c in url):
            raise ValueError("--url must not contain spaces or control characters")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url must be an http:// or https:// URL with a host, got "
                             f"scheme {parts.scheme or 'none'!r}"
                             + ("" if parts.hostname else " and no host"))
        try:
            _ = parts.port
        except ValueError:
            raise ValueError("--url has a port that is not a number in 0-65535") from None
        return url
    from edgeheal.config import ConfigError, split_hostport
    from edgeheal.settings import load

    listen = "127.0.0.1:9917"
    try:
        listen = load(getattr(args, "config", None)).http.listen[0]
    except ConfigError:
        if getattr(args, "config", None):
            raise
    host, port = split_hostport(listen)
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - a listen address, not a bind
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse redirects (the signature below is urllib's)."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,  # noqa: PLR0917
                         newurl: str) -> None:
        raise urllib.error.HTTPError(req.full_url, code, f"redirected ({code}); the agent "
                                     "never redirects", headers, fp)


def _fetch(url: str) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    with opener.open(url, timeout=TIMEOUT) as resp:
        body: bytes = resp.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise ValueError(f"the answer is over {MAX_BODY} bytes")
    return body


def parse_status(body: bytes) -> dict[str, Any]:
    """The status document in ``body``; StatusError saying what is wrong with it."""
    try:
        doc = json.loads(body)
    except RecursionError:
        raise StatusError("JSON nested too deeply") from None
    except ValueError as err:  # also not UTF-8, or an integer too long to convert
        raise StatusError(f"not JSON ({_clean(str(err), 120)})") from None
    if not isinstance(doc, dict):
        raise StatusError(f"expected a JSON object, got {type(doc).__name__}")
    if not isinstance(doc.get("ready"), bool):
        raise StatusError('"ready" is missing or not true/false')
    checks = doc.get("checks", {})
    if not isinstance(checks, dict) or not all(isinstance(c, dict) for c in checks.values()):
        raise StatusError('"checks" is not an object of objects')
    actions = doc.get("actions", [])
    if not isinstance(actions, list) or not all(isinstance(a, dict) for a in actions):
        raise StatusError('"actions" is not a list of objects')
    return doc


def render_status(doc: Mapping[str, Any]) -> str:
    """The table ``edgeheal status`` prints, from a document :func:`parse_status` took."""
    uptime = doc.get("uptime_seconds")
    up = (f"{uptime:.0f}s" if isinstance(uptime, int | float) and not isinstance(uptime, bool)
          and math.isfinite(uptime) else "?")
    lines = [f"node {_clean(doc.get('node'))}  edgeheal {_clean(doc.get('version'))}  "
             f"up {up}  {'READY' if doc.get('ready') is True else 'NOT READY'}", ""]
    rows = [("CHECK", "STATE", "REASON", "SINCE", "MESSAGE")]
    for name, check in (doc.get("checks") or {}).items():
        rows.append((_clean(name) + (" *" if check.get("required") is True else ""),
                     _clean(check.get("state", "")), _clean(check.get("reason", "")),
                     _clean(check.get("since", "")), _clean(check.get("message", ""))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True))
                     + "  " + row[4])
    lines.append("(* required: gates /readyz)")
    for action in doc.get("actions") or []:
        lines.append(f"action {_clean(action.get('time'))} {_clean(action.get('action'))} "
                     f"{_clean(action.get('result'))}: {_clean(action.get('reason'))}")
    return "\n".join(lines + _warnings(doc))


def _warnings(doc: Mapping[str, Any]) -> list[str]:
    """What the agent cannot do as it should (each field checked: the document is not
    trusted): state files of a newer format, another client with our client id."""
    out = []
    state_files = doc.get("state_files")
    newer = state_files.get("newer") if isinstance(state_files, dict) else None
    for item in newer if isinstance(newer, list) else []:
        if isinstance(item, dict):
            out.append(f"state file {_clean(item.get('file'))} is in format "
                       f"{_clean(item.get('format'))}, newer than this agent reads (up to "
                       f"{_clean(item.get('known_format'))}): left untouched, that state is "
                       "kept in memory")
    alerts = doc.get("alerts")
    taken = alerts.get("session_taken_over") if isinstance(alerts, dict) else None
    if isinstance(taken, dict) and taken.get("duplicate_client_id") is True:
        out.append(f"alert broker: another client uses client id "
                   f"{_clean(taken.get('client_id'))} ({_clean(taken.get('total'))} session "
                   "takeovers): two agents with one node_name?")
    return out


def _clean(value: object, limit: int = MAX_CELL) -> str:
    """One printable line: control characters escaped, cut at ``limit`` characters."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _shown(url: str) -> str:
    """``url`` without any user:password part, for messages."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
