"""Kubeconfig credentials, checked offline: no client, no lightkube, no network.

Why apart from the client: ``edgeheal check-config`` (:mod:`edgeheal.settings`) and the
doctor check a kubeconfig without ever talking to the API, and the client checks the token
it is about to send the same way; neither should pay for the other. A token is checked
before it is used (:func:`token_problem`: one line of printable ASCII; a YAML block scalar
``token: |`` keeps a trailing newline, which kubectl does not strip either), and
:func:`check_kubeconfig` checks the file as far as it can be checked offline, naming the key,
never the value (issue 17).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from typing import Any

from edgeheal.boundaries.kube.errors import KubeError

KUBECONFIG_MAX = 1 << 20
"""Largest kubeconfig read by :func:`check_kubeconfig`, bytes."""


def token_problem(token: object) -> str:
    """Why ``token`` cannot be sent as ``Authorization: Bearer <token>``, or ``""``. Never
    quotes the token."""
    if not isinstance(token, str):
        return "is not a string"
    if not token:
        return "is empty"
    if "\n" in token or "\r" in token:
        body = token.rstrip("\r\n")
        where = "ends with" if body and "\n" not in body and "\r" not in body else "contains"
        return (f"{where} a line break (a YAML block scalar such as `token: |` keeps the "
                "newline; write `token: <value>` on one line); the value is not shown")
    if any(c in " \t" for c in token):
        return "contains a space or tab; the value is not shown"
    if not all("!" <= c <= "~" for c in token):
        return ("contains a character that cannot go into an HTTP header (only printable "
                "ASCII); the value is not shown")
    return ""


def current_token_check() -> Callable[[object], str]:
    """:func:`token_problem` as the package ``edgeheal.boundaries.kube`` holds it now.

    Why not the name above: the hardening tests switch the check off by patching
    ``edgeheal.boundaries.kube.token_problem`` (to meet the HTTP library's own error, which
    quotes the header), as they did when the package was one module; both callers, this
    module's and the client's, read it from there so that one patch reaches them."""
    from edgeheal.boundaries import kube  # the package, initialised by now

    return kube.token_problem


def check_kubeconfig(path: str, context: str = "") -> None:
    """Check a kubeconfig file as far as it can be checked offline: YAML, the context, its
    user's token (:func:`token_problem`), and the files it names. Raise :class:`KubeError`
    naming the file and the key (``users[edgeheal].user.token``), never a value."""
    doc = _kubeconfig_document(path)

    def named(section: str, name: object) -> dict[str, Any]:
        for entry in doc.get(section) or ():
            if isinstance(entry, dict) and entry.get("name") == name:
                return entry
        raise KubeError(f"{path}: no entry named {_label(name)} under {section}")

    chosen = context or doc.get("current-context")
    if not chosen:
        raise KubeError(f"{path}: no current-context; set [kubernetes] context")
    ctx = named("contexts", chosen).get("context")
    if not isinstance(ctx, dict):
        raise KubeError(f"{path}: contexts[{_label(chosen)}].context is missing")
    cluster_key = f"clusters[{_label(ctx.get('cluster'))}].cluster"
    cluster = named("clusters", ctx.get("cluster")).get("cluster") or {}
    if not isinstance(cluster, dict) or not cluster.get("server"):
        raise KubeError(f"{path}: {cluster_key}.server is missing")
    files = [(f"{cluster_key}.certificate-authority", cluster.get("certificate-authority"))]
    if ctx.get("user") is not None:
        user = named("users", ctx.get("user")).get("user") or {}
        where = f"users[{_label(ctx.get('user'))}].user"
        if not isinstance(user, dict):
            raise KubeError(f"{path}: {where} is not a mapping")
        if "token" in user and (problem := current_token_check()(user["token"])):
            raise KubeError(f"{path}: {where}.token {problem}")
        files += [(f"{where}.{key}", user.get(key))
                  for key in ("tokenFile", "client-certificate", "client-key")]
    for key, name in files:
        if name is not None:
            full = os.path.join(os.path.dirname(path), str(name))  # as kubectl resolves it
            try:
                _read_regular(full, limit=0)
            except (OSError, ValueError) as err:
                why = err.strerror if isinstance(err, OSError) else str(err)
                raise KubeError(f"{path}: {key}: {_label(full)}: {why}") from None


def _kubeconfig_document(path: str) -> dict[str, Any]:
    import yaml  # type: ignore[import-untyped]  # lightkube's dependency

    try:
        data = _read_regular(path)
    except OSError as err:
        raise KubeError(f"{path}: cannot read: {err.strerror}") from None
    except ValueError as err:
        raise KubeError(f"{path}: {err}") from None
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as err:  # its text quotes the line: the token, perhaps
        mark = getattr(err, "problem_mark", None)
        line = f" on line {mark.line + 1}" if mark is not None else ""
        raise KubeError(f"{path}: not valid YAML{line}") from None
    except RecursionError:
        raise KubeError(f"{path}: not valid YAML (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise KubeError(f"{path}: not a kubeconfig (expected a YAML mapping)")
    return doc


def _label(name: object) -> str:
    """A kubeconfig's own name (context, user, file), made safe to print on one line."""
    text = str(name)
    return text if re.fullmatch(r"[\w.@:/+-]{1,200}", text) else repr(text[:60])


def _read_regular(path: str, *, limit: int = KUBECONFIG_MAX) -> bytes:
    """The first ``limit`` bytes of a regular file (``limit=0``: only check it opens);
    ValueError for anything but a regular file or a file larger than ``limit``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        if not limit:
            return b""
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            raise ValueError(f"larger than {limit >> 10} KiB")
        return data
    finally:
        os.close(fd)

