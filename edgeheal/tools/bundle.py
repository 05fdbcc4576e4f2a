"""``edgeheal bundle``: everything support asks for, in one size-bounded archive, no secret.

Why: field support asks the same five questions of every node (which version, what does
``doctor`` say, what is ``/status``, what did the ladders do, what did the log say), and the
answers live in five places. This module gathers them once, into members of one tar.gz
(:func:`collect`, then :func:`write`), each made with what can be read *now*: with the agent
down, ``/status`` and ``/metrics`` are an error line and the histories and the outbox are read
from the state directory; offline, doctor's network rows fail within their own deadlines.

====================  =====================================================================
member                what it holds
====================  =====================================================================
``manifest.json``     what is in the archive, each member's size, what was cut or failed
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

**No secret leaves the node.** The configuration holds *paths* to secrets (an MQTT
password file, a TLS client key, a kubeconfig with a token or a client key); the log may hold
whatever a library once printed. Every member passes :func:`scrub` before it is archived:
first the exact values read from the files the configuration names (:func:`known_secrets`:
each password, each token, each key, and the base64 forms a kubeconfig carries), then the
shapes a secret takes wherever it comes from (:data:`PATTERNS`: PEM private keys,
``Authorization``/``Bearer`` values, JWTs, WireGuard ``PrivateKey``/``PresharedKey`` lines
and UAPI ``private_key=`` hex, ``password``/``token``/``secret`` assignments). The member
names what was replaced by :data:`REDACTED`, never the value. A file the configuration names
is never copied into the archive.

**Bounded.** The archive is at most ``max_bytes`` (8 MiB by default): members are added in
the order of the table, each cut to what is left of the budget (the journal keeps its last
lines), and the manifest says which were cut. Every outside call has a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import os
import platform
import re
import sqlite3
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeheal import __version__

if TYPE_CHECKING:
    from edgeheal.config import Config

log = logging.getLogger("edgeheal.bundle")

REDACTED = "<redacted>"
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
SECRET_FILE_MAX = 256 * 1024
"""Bytes read of a file the configuration names, to learn the secrets in it."""
MIN_SECRET = 6
"""Shorter file contents are not searched for verbatim (every short word would match);
the patterns still apply."""
_TAR_OVERHEAD = 2048
"""Bytes a member adds to the tar stream beyond its data (header and padding), generously."""

PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("pem private key", re.compile(
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
        re.DOTALL)),
    ("authorization header", re.compile(
        r"(?i)(\bauthorization\b[\"']?\s*[:=]\s*[\"']?)"
        r"(?!(?:bearer\s+|basic\s+)?<redacted>)(?:bearer\s+|basic\s+)?[^\s\"',;]+")),
    ("bearer value", re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{4,}")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")),
    ("wireguard key line", re.compile(
        r"(?i)(\b(?:private|preshared)[ _-]?key\b[\"']?\s*[:=]\s*[\"']?)"
        r"(?!\(hidden\))[A-Za-z0-9+/=]{16,}")),
    ("secret assignment", re.compile(
        r"(?i)(\b[\w-]*(?:password|passwd|token|secret|client-key-data|psk)[\w-]*\b[\"']?"
        r"\s*[:=]\s*[\"']?)(?!<redacted>)[^\s\"',;]+")),
    ("credentials in a URL", re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s/:@]+:)[^\s/@]+(?=@)")),
)
"""What a secret looks like wherever it comes from: (name, pattern). A pattern's first group,
when it has one, is kept (the key's name), the rest becomes :data:`REDACTED`."""
_NAMES_A_FILE = re.compile(r"(?i)_?file[\"']?\s*[:=]\s*[\"']?$")
"""A kept key that names a file (``password_file``, ``tokenFile``): its value is a path."""


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


class BundleError(Exception):
    """The archive cannot be written (the message names the path or the bound)."""


# -- secrets ---------------------------------------------------------------------------------


def _read_small(path: str) -> str:
    """A regular file's first :data:`SECRET_FILE_MAX` bytes as text, or "" if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.read(fd, SECRET_FILE_MAX).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _kubeconfig_secrets(text: str) -> set[str]:
    """Tokens, passwords and key data of a kubeconfig, and the files its tokens name."""
    found: set[str] = set()
    try:
        import yaml  # type: ignore[import-untyped]  # lightkube's dependency

        doc = yaml.safe_load(text)
    except Exception:  # an unreadable file only loses the exact-value pass; patterns stay
        return found
    users = doc.get("users") if isinstance(doc, dict) else None
    for entry in users if isinstance(users, list) else []:
        user = entry.get("user") if isinstance(entry, dict) else None
        if not isinstance(user, dict):
            continue
        for key in ("token", "password", "client-key-data"):
            value = user.get(key)
            if isinstance(value, str) and value.strip():
                found.add(value.strip())
                if key == "client-key-data":
                    with contextlib.suppress(ValueError):
                        found.add(base64.b64decode(value, validate=False).decode().strip())
        token_file = user.get("tokenFile")
        if isinstance(token_file, str) and token_file:
            found.add(_read_small(token_file).strip())
    return found


def known_secrets(config: Config | None) -> set[str]:
    """The exact secret values the files named by ``config`` hold (a password file, a TLS
    client key, a kubeconfig's tokens and keys), each line of a multi-line one too."""
    if config is None:
        return set()
    found: set[str] = set()
    for target in config.mqtt.targets:
        if target.password_file:
            found.add(_read_small(target.password_file).strip())
        if target.key_file:
            found.add(_read_small(target.key_file).strip())
    if config.kubernetes is not None and config.kubernetes.kubeconfig:
        found |= _kubeconfig_secrets(_read_small(config.kubernetes.kubeconfig))
    lines = {line.strip() for value in found for line in value.splitlines()}
    return {v for v in found | lines if len(v) >= MIN_SECRET and "-----" not in v}


def scrub(text: str, known: Iterable[str] = ()) -> tuple[str, dict[str, int]]:
    """``text`` with every known secret and every secret-shaped value replaced by
    :data:`REDACTED`; and how many of each kind were replaced."""
    counts: dict[str, int] = {}
    for value in sorted(set(known), key=len, reverse=True):
        if value and value in text:
            counts["known value"] = counts.get("known value", 0) + text.count(value)
            text = text.replace(value, REDACTED)
    for name, pattern in PATTERNS:
        def repl(match: re.Match[str], name: str = name) -> str:
            keep = match.group(1) if match.re.groups else ""
            if keep and _NAMES_A_FILE.search(keep):
                return match.group(0)  # "password_file": a path, not the secret
            counts[name] = counts.get(name, 0) + 1
            return (keep or "") + REDACTED
        text = pattern.sub(repl, text)
    return text, counts


# -- the members -----------------------------------------------------------------------------


def _json(doc: object) -> bytes:
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
    return Member("version.json", _json(doc))


def config_member(config: Config | None, error: str) -> Member:
    if config is None:
        return Member("config.json", _json({"error": error}), note=f"not loaded: {error}")
    from edgeheal.config import redacted

    return Member("config.json", _json(redacted(config)))


async def doctor_member(config: Config | None) -> Member:
    if config is None:
        return Member("doctor.json", _json({"error": "no configuration"}),
                      note="not run: the configuration did not load")
    try:
        from edgeheal.tools import doctor

        findings = await asyncio.wait_for(
            doctor.examine(config, doctor.System(), probe_mtu=False), DOCTOR_TIMEOUT)
        return Member("doctor.json", _json(doctor.to_json(config, findings)))
    except (OSError, ImportError, asyncio.TimeoutError) as err:
        why = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        return Member("doctor.json", _json({"error": why}), note=f"doctor failed: {why}")


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
        return Member("outbox.json", _json(outbox_summary(state_dir / OUTBOX_FILE,
                                                          time.time())))
    except sqlite3.Error as err:
        return Member("outbox.json", _json({"file": OUTBOX_FILE, "error": str(err)}),
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
        return Member("diagnose.json", _json({"error": str(err) or type(err).__name__}),
                      note=f"diagnose failed: {err or type(err).__name__}")
    return Member("diagnose.json", _json(diagnose.to_json(evidence, verdict)))


async def collect(config: Config | None, config_error: str, options: Options, *,
                  run: Runner = _run) -> list[Member]:
    """Every member, scrubbed, in archive order (the manifest is added by :func:`write`)."""
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


# -- the archive -----------------------------------------------------------------------------


def _fit(members: list[Member], budget: int) -> None:
    """Cut members, in order, to what is left of ``budget`` bytes (the journal keeps its
    tail, the others their head)."""
    left = budget
    for member in members:
        room = max(0, min(left - _TAR_OVERHEAD, MAX_MEMBER))
        if len(member.data) > room:
            member.cut = True
            if member.name == "journal.txt":
                tail = member.data[len(member.data) - room:]
                nl = tail.find(b"\n")
                member.data = tail[nl + 1:] if 0 <= nl < len(tail) - 1 else tail
            else:
                member.data = member.data[:room]
        left -= len(member.data) + _TAR_OVERHEAD


def manifest(members: list[Member], options: Options) -> dict[str, Any]:
    return {"edgeheal": __version__, "config": options.config_path,
            "max_bytes": options.max_bytes,
            "members": [{"name": m.name, "bytes": len(m.data),
                         **({"note": m.note} if m.note else {}),
                         **({"cut": True} if m.cut else {}),
                         **({"redacted": m.redactions} if m.redactions else {})}
                        for m in members]}


def write(members: list[Member], path: Path, options: Options) -> dict[str, Any]:
    """Write the archive to ``path`` (created new, mode 0600) and return its manifest;
    :class:`BundleError` if it cannot be."""
    if options.max_bytes < 64 * 1024:
        raise BundleError(f"--max-size {options.max_bytes} is below 64 KiB: too small for "
                          "even the manifest and the version")
    reserve = 16 * 1024  # the manifest (~3 KB), the tar end blocks, gzip over stored blocks
    _fit(members, options.max_bytes - reserve)
    doc = manifest(members, options)
    root = path.name.removesuffix(".tar.gz").removesuffix(".tgz") or "edgeheal-bundle"
    buf = io.BytesIO()
    stamp = time.time()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for member in [Member("manifest.json", _json(doc)), *members]:
            if not member.data and member.note:
                continue  # the manifest says why it is empty
            info = tarfile.TarInfo(f"{root}/{member.name}")
            info.size, info.mtime, info.mode = len(member.data), int(stamp), 0o600
            tar.addfile(info, io.BytesIO(member.data))
    data = buf.getvalue()
    if len(data) > options.max_bytes:  # cannot happen: the budget leaves room for gzip
        raise BundleError(f"the archive would be {len(data)} bytes, over --max-size "
                          f"{options.max_bytes}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise BundleError(f"{path}: already exists (not overwritten)") from None
    except OSError as err:
        raise BundleError(f"{path}: cannot create: {err.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    doc["archive_bytes"] = len(data)
    return doc


__all__ = ["MAX_BYTES", "PATTERNS", "REDACTED", "BundleError", "Member", "Options",
           "collect", "known_secrets", "scrub", "write"]
