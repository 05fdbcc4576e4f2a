"""What a failed Kubernetes API call raises, and how it is described without a credential.

Why a module of its own: the offline kubeconfig check (:mod:`.credentials`) and the client
(:mod:`.client`) raise the same exceptions, and a caller that only checks a file must not
load the client to catch them. The describing helpers live here too because they are the
one place where an answer or a transport error becomes text: a transport error is described
from its type, the errno or TLS reason under it and the call, never with ``str()`` of the
HTTP library's exception (h11's ``Illegal header value b'Bearer <token>\\n'`` once carried a
token into ``/status`` and the log, issue 17), and the API's own message is shortened with
anything shaped like a credential blanked. 401 and 403 become a
:class:`KubePermissionError` that names the RBAC rule to add, or says the credentials were
rejected.
"""

from __future__ import annotations

import re
import ssl
from typing import Any


class KubeError(Exception):
    """A Kubernetes API call failed; the message names the call, never a credential."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubePermissionError(KubeError):
    """401/403: a configuration problem (credentials or RBAC), not worth retrying."""


class KubeConflict(KubeError):
    """409: a precondition (the pod's uid) did not hold."""


class KubeNotFound(KubeError):
    """404: the object is gone."""



def _transport_problem(err: BaseException) -> str:
    """Describe an HTTP transport error without ``str(err)``, which may quote a request
    header (the bearer token): its type, and the errno or TLS reason found under it."""
    name = type(err).__name__
    detail = {
        "LocalProtocolError": "the request is not valid HTTP (a credential with a line break "
                              "or another character a header cannot hold?)",
        "RemoteProtocolError": "the server's answer is not valid HTTP, or it closed the "
                               "connection",
        "ConnectError": "cannot connect to the API server",
        "ReadError": "the connection failed while reading",
        "WriteError": "the connection failed while writing",
        "CloseError": "the connection failed while closing",
        "ProxyError": "the proxy refused the connection",
        "UnsupportedProtocol": "the server URL's scheme is not http or https",
    }.get(name, "transport error")
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLCertVerificationError):
            detail += f": TLS: {cause.verify_message}"
            break
        if isinstance(cause, ssl.SSLError):
            detail += f": TLS: {cause.reason or type(cause).__name__}"
            break
        if isinstance(cause, OSError) and cause.strerror:
            detail += f": {cause.strerror}"
            break
        cause = cause.__cause__ or cause.__context__
    return f"{name}: {detail}"

_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)\s+[^\s'\"]+")


def _status_message(resp: Any, secret: str = "") -> str:
    """The API's own words about a failed call, shortened, with anything shaped like a
    credential (``Bearer <token>``) and our own token blanked: a server or proxy may echo
    a header back."""
    try:
        data = resp.json()
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the decoder
        text = (resp.text or "").strip()[:200] or str(resp.reason_phrase)
    else:
        text = (str(data["message"])[:300] if isinstance(data, dict) and data.get("message")
                else str(resp.reason_phrase))
    return _redact(text, secret)


def _redact(text: str, secret: str = "") -> str:
    """``text`` with our own token and anything shaped like a credential blanked."""
    if secret:
        text = text.replace(secret, "<redacted>")
    return _CREDENTIAL.sub(lambda m: f"{m.group(1)} <redacted>", text)


def _retry_after(resp: Any) -> float | None:
    raw = resp.headers.get("Retry-After")
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


def _permission(status: int, what: str, message: str, kubeconfig: str) -> KubePermissionError:
    source = kubeconfig or "the in-cluster service account"
    if status == 401:
        return KubePermissionError(
            f"{what}: unauthorized (401): the API server rejected the credentials from "
            f"{source} (expired or revoked token, or a client certificate it does not "
            "trust); regenerate it with `edgeheal kubeconfig`", status=401)
    return KubePermissionError(
        f"{what}: forbidden (403): the agent's account lacks the permission to {what}; add "
        f"it to its Role (see k3s-manifests/rbac.yaml). The API said: {message}", status=403)
