"""The bundle's members: what each holds, and how each is read with what can be read *now*.

====================  =====================================================================
member                what it holds
====================  =====================================================================
``manifest.json``     what is in the archive, each member's size, what was cut or failed
                      (made by :mod:`edgeheal.tools.bundle.archive`)
``version.json``      edgeheal, Python, the kernel and the OS release, node, time
``config.json``       the effective configuration as ``check-config`` prints it (redacted)
``doctor.json``       ``doctor --json`` (no MTU probe: read-only, a few seconds)
``status.json``       the running agent's ``/status`` (or why it could not be read)
``metrics.txt``       the running agent's ``/metrics``
``history/*.json``    the remediation histories (Flannel's, the uplink's) as on disk
``outbox.json``       the alert outbox: counts, ages and kinds per kind; never a payload
``journal.txt``       the last lines of the agent's journal (or of ``--log-file``)
``diagnose.json``     with ``--diagnose SECONDS`` only: a short capture's verdict
====================  =====================================================================

With the agent down, ``/status`` and ``/metrics`` are an error line (the member's note) and
the histories and the outbox are read from the state directory; offline, doctor's network
rows fail within their own deadlines. Every outside call has a deadline. :func:`collect`
reads them all in archive order and passes each through
:func:`edgeheal.tools.bundle.redaction.scrub`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import platform
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeheal import __version__
from edgeheal.tools.bundle.redaction import known_secrets, scrub

if TYPE_CHECKING:
    from edgeheal.config import Config

log = logging.getLogger("edgeheal.bundle")

MAX_BYTES = 8 * 1024 * 1024
"""Default bound of the archive, bytes: a support ticket's attachment limit is usually
10-25 MB; a healthy node's bundle is well under 1 MB."""
MAX_MEMBER = 4 * 1024 * 1024
"""Bytes of one member at most before compression (a /metrics page is ~25 KB)."""
JOURNAL_LINES = 2000
"""Default number of journal lines (about an hour of a noisy agent at info level)."""
HTTP_TIMEOUT = 5.0
"""Seconds to connect to the agent and to wait for each read."""
DOCTOR_TIMEOUT = 60.0
"""Seconds the doctor may take in all (its own network calls have shorter deadlines)."""
JOURNAL_TIMEOUT = 30.0
"""Seconds ``journalctl`` may take."""


@dataclass(frozen=True, slots=True)
class Options:
    agent_url: str = ""
    """The agent's base URL (``http://127.0.0.1:9917``); empty: do not ask the agent."""
    journal_lines: int = JOURNAL_LINES
    journal_unit: str = "edgeheal.service"
    log_file: str = ""
    """Read the log's last lines from this file instead of the journal."""
    diagnose_seconds: float = 0.0
    """Also run a capture this long (0: not)."""
    max_bytes: int = MAX_BYTES
    config_path: str = ""
    """The file the configuration came from, for the manifest."""


@dataclass(slots=True)
class Member:
    name: str
    data: bytes
    note: str = ""
    """Why the member is not what was asked for ("agent not reachable: ..."), if it is not."""
    redactions: dict[str, int] = field(default_factory=dict)
    cut: bool = False


def json_bytes(doc: object) -> bytes:
    """A JSON member's bytes: indented, one newline at the end."""
    return (json.dumps(doc, indent=2, default=str) + "\n").encode()


def version_member(config: Config | None) -> Member:
    uname = platform.uname()
    doc: dict[str, Any] = {
        "edgeheal": __version__, "python": sys.version.split()[0],
        "executable": os.path.basename(sys.executable), "system": uname.system,
        "kernel": uname.release, "machine": uname.machine,
        "node": config.node if config is not None else platform.node(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with contextlib.suppress(OSError):
        doc["os_release"] = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    return Member("version.json", json_bytes(doc))


def config_member(config: Config | None, error: str) -> Member:
    if config is None:
        return Member("config.json", json_bytes({"error": error}), note=f"not loaded: {error}")
    from edgeheal.config import redacted

    return Member("config.json", json_bytes(redacted(config)))


async def doctor_member(config: Config | None) -> Member:
    if config is None:
        return Member("doctor.json", json_bytes({"error": "no configuration"}),
                      note="not run: the configuration did not load")
    try:
        from edgeheal.tools import doctor

        findings = await asyncio.wait_for(
            doctor.examine(config, doctor.System(), probe_mtu=False), DOCTOR_TIMEOUT)
        return Member("doctor.json", json_bytes(doctor.to_json(config, findings)))
    except (OSError, ImportError, asyncio.TimeoutError) as err:
        why = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        return Member("doctor.json", json_bytes({"error": why}), note=f"doctor failed: {why}")


def _http_get(url: str) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=HTTP_TIMEOUT) as resp:
        body: bytes = resp.read(MAX_MEMBER + 1)
    return body


async def agent_members(base: str) -> list[Member]:
    out = []
    for path, name in (("/status", "status.json"), ("/metrics", "metrics.txt")):
        if not base:
            out.append(Member(name, b"", note="not asked: no agent URL"))
            continue
        try:
            body = await asyncio.to_thread(_http_get, base + path)
        except urllib.error.HTTPError as err:  # /status answers 503 when not ready
            body = err.read(MAX_MEMBER + 1) if err.fp is not None else b""
            if not body:
                out.append(Member(name, b"", note=f"agent answered HTTP {err.code}"))
                continue
        except (OSError, ValueError) as err:
            reason = getattr(err, "reason", None) or err
            out.append(Member(name, b"", note=f"agent not reachable: {reason}"))
            continue
        out.append(Member(name, body))
    return out


def history_members(state_dir: Path) -> list[Member]:
    from edgeheal.agent.remediation.history import HISTORY_FILE
    from edgeheal.agent.remediation.uplink_actor import HISTORY_FILE as UPLINK_FILE

    out = []
    for file in (HISTORY_FILE, UPLINK_FILE):
        try:
            data = (state_dir / file).read_bytes()[:MAX_MEMBER]
        except FileNotFoundError:
            out.append(Member(f"history/{file}", b"", note="no such file (no rung yet)"))
            continue
        except OSError as err:
            out.append(Member(f"history/{file}", b"", note=f"cannot read: {err.strerror}"))
            continue
        out.append(Member(f"history/{file}", data))
    return out


def outbox_summary(path: Path, now: float) -> dict[str, Any]:
    """Rows per kind with the oldest and newest age, read-only; never a payload."""
    if not path.exists():
        return {"file": path.name, "present": False, "count": 0}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2.0)
    try:
        rows = db.execute("SELECT kind, COUNT(*), MIN(raised), MAX(raised) FROM outbox "
                          "GROUP BY kind ORDER BY kind").fetchall()
    finally:
        db.close()
    kinds = {str(kind): {"count": int(n), "oldest_age_seconds": round(now - float(lo), 1),
                         "newest_age_seconds": round(now - float(hi), 1)}
             for kind, n, lo, hi in rows}
    return {"file": path.name, "present": True,
            "count": sum(k["count"] for k in kinds.values()),
            "oldest_age_seconds": max((k["oldest_age_seconds"] for k in kinds.values()),
                                      default=None),
            "kinds": kinds}


def outbox_member(state_dir: Path) -> Member:
    from edgeheal.agent.alerts.engine import OUTBOX_FILE

    try:
        return Member("outbox.json", json_bytes(outbox_summary(state_dir / OUTBOX_FILE,
                                                          time.time())))
    except sqlite3.Error as err:
        return Member("outbox.json", json_bytes({"file": OUTBOX_FILE, "error": str(err)}),
                      note=f"outbox not readable: {err}")


Runner = Callable[[list[str], float], "subprocess.CompletedProcess[bytes]"]


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, capture_output=True, timeout=timeout, check=False)


def journal_member(options: Options, run: Runner = _run) -> Member:
    lines = max(1, options.journal_lines)
    if options.log_file:
        try:
            with open(options.log_file, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - MAX_MEMBER))
                tail = f.read().splitlines(keepends=True)[-lines:]
        except OSError as err:
            return Member("journal.txt", b"", note=f"cannot read the log file: {err.strerror}")
        return Member("journal.txt", b"".join(tail))
    argv = ["journalctl", "--no-pager", "-o", "short-iso", "-u", options.journal_unit,
            "-n", str(lines)]
    try:
        proc = run(argv, JOURNAL_TIMEOUT)
    except FileNotFoundError:
        return Member("journal.txt", b"", note="journalctl not found (no systemd journal)")
    except (OSError, subprocess.TimeoutExpired) as err:
        return Member("journal.txt", b"", note=f"journalctl failed: {err}")
    said = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    note = (f"journalctl exited {proc.returncode}: {said[-1] if said else ''}".strip()
            if proc.returncode else "")
    return Member("journal.txt", proc.stdout, note=note)


async def diagnose_member(config: Config | None, seconds: float) -> Member:
    if config is None:
        return Member("diagnose.json", b"", note="not run: the configuration did not load")
    from edgeheal.tools import diagnose

    try:
        evidence, verdict = await asyncio.wait_for(
            diagnose.diagnose(config, interface=None, seconds=seconds), seconds + 30.0)
    except (diagnose.EnvironmentProblem, diagnose.DiagnoseError, OSError,
            asyncio.TimeoutError) as err:
        return Member("diagnose.json", json_bytes({"error": str(err) or type(err).__name__}),
                      note=f"diagnose failed: {err or type(err).__name__}")
    return Member("diagnose.json", json_bytes(diagnose.to_json(evidence, verdict)))


async def collect(config: Config | None, config_error: str, options: Options, *,
                  run: Runner = _run) -> list[Member]:
    """Every member, scrubbed, in archive order (the manifest is added by
    :func:`edgeheal.tools.bundle.archive.write`)."""
    from edgeheal.config import AgentSettings

    state_dir = Path(config.agent.state_dir if config is not None
                     else AgentSettings().state_dir)
    members = [version_member(config), config_member(config, config_error),
               await doctor_member(config), *await agent_members(options.agent_url),
               *history_members(state_dir), outbox_member(state_dir),
               await asyncio.to_thread(journal_member, options, run)]
    if options.diagnose_seconds > 0:
        members.append(await diagnose_member(config, options.diagnose_seconds))
    known = await asyncio.to_thread(known_secrets, config)
    for member in members:
        text, counts = scrub(member.data.decode("utf-8", "replace"), known)
        member.note, _ = scrub(member.note, known)
        member.data, member.redactions = text.encode(), counts
    return members


__all__ = ["JOURNAL_LINES", "MAX_BYTES", "MAX_MEMBER", "Member", "Options", "collect",
           "journal_member", "json_bytes"]
