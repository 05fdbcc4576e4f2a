"""No secret leaves the node: every member passes :func:`scrub` before it is archived.

The configuration holds *paths* to secrets (an MQTT password file, a TLS client key, a
kubeconfig with a token or a client key); the log may hold whatever a library once printed.
:func:`scrub` replaces first the exact values read from the files the configuration names
(:func:`known_secrets`: each password, each token, each key, and the base64 forms a
kubeconfig carries), then the shapes a secret takes wherever it comes from
(:data:`PATTERNS`: PEM private keys, ``Authorization``/``Bearer`` values, JWTs, WireGuard
``PrivateKey``/``PresharedKey`` lines and UAPI ``private_key=`` hex,
``password``/``token``/``secret`` assignments). The member names what was replaced by
:data:`REDACTED`, never the value. A file the configuration names is never copied into the
archive.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgeheal.config import Config

REDACTED = "<redacted>"
"""What a secret is replaced by (the member's ``redactions`` say how many of each kind)."""
SECRET_FILE_MAX = 256 * 1024
"""Bytes read of a file the configuration names, to learn the secrets in it."""
MIN_SECRET = 6
"""Shorter file contents are not searched for verbatim (every short word would match);
the patterns still apply."""

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


__all__ = ["PATTERNS", "REDACTED", "known_secrets", "scrub"]
