"""The Kubernetes API boundary: this node's Flannel pods, Events on the Node, its condition.

Why a narrow module: the actor and the pod remedy need six calls, each of which must be
bounded, retried politely and reported precisely, and none of which may ever leak the
token. Everything about the API lives here, behind :class:`KubeClient` and its own
exceptions (:class:`KubeError`, :class:`KubePermissionError`, :class:`KubeConflict`,
:class:`KubeNotFound`).

Credentials: lightkube (imported lazily, only when ``[kubernetes]`` is configured) loads a
kubeconfig — client certificate or bearer token, custom CA, embedded ``*-data`` or files, as
K3s writes them — or the in-cluster service account (token file re-read on 401), and
builds the TLS-configured HTTP client. The calls themselves are plain REST on that client
because lightkube's ``delete`` cannot send ``DeleteOptions.preconditions`` and because one
request function gives every call the same timeout, retry and error policy:

- every call has ``[kubernetes] request_timeout``; a watch has an overall deadline;
- 429 is retried after ``Retry-After`` (capped), 5xx and transport errors/timeouts with
  exponential backoff and full jitter, at most ``[kubernetes] retries`` times;
- 401 and 403 are never retried: :class:`KubePermissionError` names the verb, resource and
  namespace that is missing (the RBAC rule to add), or says the credentials were rejected;
- the token is only ever inside the HTTP client's auth object: no log line, error or repr
  here contains a header. A transport error is described from its type, the errno or TLS
  reason under it and the call, never with ``str()`` of the HTTP library's exception: h11's
  ``Illegal header value b'Bearer <token>\\n'`` once carried a token into ``/status`` and the
  log (issue 17). A token is checked before it is used (:func:`token_problem`: one line of
  printable ASCII; a YAML block scalar ``token: |`` keeps a trailing newline, which kubectl
  does not strip either), and ``edgeheal check-config`` checks the kubeconfig the same way
  (:func:`check_kubeconfig`), naming the key, never the value.

Pod safety: :meth:`KubeClient.delete_pod` re-reads the pod and refuses unless it is still
on this node with the same uid (one already Terminating is left to finish, never deleted
again), then deletes with ``preconditions.uid`` so a pod that was
replaced in between is never deleted by mistake (409 -> :class:`KubeConflict`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import ssl
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from edgeheal.base.bare_import import skip_init
from edgeheal.model import rfc3339

if TYPE_CHECKING:
    from edgeheal.config import KubernetesSettings

log = logging.getLogger("edgeheal.kube")  # the name operators grep for

RETRY_AFTER_MAX = 30.0
"""Longest ``Retry-After`` honoured, seconds (a longer one is capped, not obeyed blindly)."""
BACKOFF_BASE = 0.2
BACKOFF_MAX = 8.0
EVENT_NAMESPACE = "default"
"""Where Node events go (as kubelet's do): Nodes are cluster-scoped."""
COMPONENT = "edgeheal"
QUIET_LOGGERS = ("httpcore2", "httpx2", "h11")
"""The HTTP library's loggers: its debug traces quote exceptions that quote request headers
(the bearer token), so they never log below WARNING once a client exists."""


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


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    ready: bool
    deleting: bool

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Pod:
        meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or ())
        return cls(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                   uid=str(meta.get("uid", "")), node=str(spec.get("nodeName") or ""),
                   phase=str(status.get("phase", "")), ready=ready,
                   deleting=bool(meta.get("deletionTimestamp")))


def _utcnow() -> datetime:
    return datetime.now(UTC)


# --- credentials ----------------------------------------------------------------------------

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
        if "token" in user and (problem := token_problem(user["token"])):
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
    import yaml  # type: ignore[import-untyped]  # noqa: PLC0415 - lightkube's dependency

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


class KubeClient:
    def __init__(self, settings: KubernetesSettings, *,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 rng: random.Random | None = None,
                 service_account: str | None = None,
                 wall: Callable[[], datetime] = _utcnow) -> None:
        """``service_account``: the in-cluster credentials directory (token, ca.crt,
        namespace; default Kubernetes's own mount point), used when no kubeconfig is set.
        ``wall``: the agent's one wall clock (UTC), for the timestamps written into Events
        and the Node condition."""
        self.settings = settings
        self._wall = wall
        self._service_account = service_account
        self._sleep = sleep
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self._http: Any = None
        self._config: Any = None

    # --- the connection ------------------------------------------------------------------

    def _client(self) -> Any:
        if self._http is None:
            import httpx2  # noqa: PLC0415

            # only the kubeconfig loader and the client adapter; lightkube's __init__ would
            # add its own clients and resources for nothing (docs/footprint.md)
            skip_init("lightkube")
            from lightkube.config import client_adapter  # noqa: PLC0415
            from lightkube.config.kubeconfig import KubeConfig  # noqa: PLC0415
            from lightkube.core.exceptions import ConfigError  # noqa: PLC0415

            for name in QUIET_LOGGERS:
                quiet = logging.getLogger(name)
                quiet.setLevel(max(logging.WARNING, quiet.getEffectiveLevel()))
            source = self.settings.kubeconfig or "in-cluster service account"
            try:
                if self.settings.kubeconfig:
                    kubeconfig = KubeConfig.from_file(self.settings.kubeconfig)
                else:
                    kubeconfig = (KubeConfig.from_service_account(self._service_account)
                                  if self._service_account
                                  else KubeConfig.from_service_account())
                config = kubeconfig.get(self.settings.context or None)
                if config is None:
                    raise KubeError(f"{source}: no current context; set "
                                    "[kubernetes] context", status=None)
                if config.user is None:
                    raise KubeError(f"{source}: context {config.context_name!r} has no user")
                if config.user.token is not None and not config.user.token_file \
                        and (problem := token_problem(config.user.token)):
                    raise KubeError(f"{source}: the token of context "
                                    f"{config.context_name!r} {problem}")
                params = client_adapter.ConnectionParams(
                    timeout=httpx2.Timeout(self.settings.request_timeout), trust_env=False)
                self._http = client_adapter.AsyncClient(config, params)
            except KubeError:
                raise
            except (ConfigError, KeyError) as err:
                # lightkube's own words, or a missing context/cluster/user name or
                # in-cluster environment variable: names, never values
                raise KubeError(f"cannot load Kubernetes credentials from {source}: "
                                f"{type(err).__name__}: {err}") from None
            except OSError as err:
                raise KubeError(f"cannot load Kubernetes credentials from {source}: "
                                f"{err.strerror or type(err).__name__}"
                                f"{f': {err.filename}' if err.filename else ''}") from None
            except Exception as err:  # yaml/msgspec/ssl/value errors may quote the file:
                # name the type, nothing more
                raise KubeError(f"cannot load Kubernetes credentials from {source}: "
                                f"{type(err).__name__}") from None
            self._config = config
        return self._http

    def _secret(self) -> str:
        """The inline token of the loaded kubeconfig ("" for none or a token file), to blank
        it should an answer quote it."""
        user = getattr(self._config, "user", None)
        token = getattr(user, "token", None)
        return token.strip() if isinstance(token, str) and len(token.strip()) >= 8 else ""

    async def close(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

    # --- one request, with the whole policy --------------------------------------------

    async def request(self, method: str, path: str, *, what: str,
                      params: Mapping[str, str] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      ) -> dict[str, Any]:
        """One API call; ``what`` is ``(verb, resource, namespace)`` rendered for errors."""
        import httpx2  # noqa: PLC0415

        http = self._client()
        headers = {"Accept": "application/json"}
        content = None
        if body is not None:
            content = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        attempt = 0
        while True:
            try:
                resp = await http.request(method, path, params=dict(params or {}),
                                          content=content, headers=headers)
            except httpx2.TimeoutException:
                problem: str = f"timed out after {self.settings.request_timeout:g}s"
                status, retry_after = None, None
                cause: Exception = KubeError(problem)
            except httpx2.TransportError as err:
                problem = _transport_problem(err)  # never str(err): it may quote a header
                status, retry_after = None, None
                cause = KubeError(problem)
            else:
                if resp.status_code < 300:
                    try:
                        data = resp.json() if resp.content else {}
                    except ValueError as err:
                        raise KubeError(f"{what}: the API answered {resp.status_code} with "
                                        "a body that is not JSON") from err
                    return data if isinstance(data, dict) else {"items": data}
                status = resp.status_code
                message = _status_message(resp, self._secret())
                if status in (401, 403):
                    raise _permission(status, what, message, self.settings.kubeconfig)
                if status == 404:
                    raise KubeNotFound(f"{what}: not found ({message})", status=404)
                if status == 409:
                    raise KubeConflict(f"{what}: conflict ({message})", status=409)
                if status != 429 and status < 500:
                    raise KubeError(f"{what}: the API answered {status}: {message}",
                                    status=status)
                problem = f"the API answered {status}: {message}"
                retry_after = _retry_after(resp) if status == 429 else None
                cause = KubeError(problem, status=status)
            if attempt >= self.settings.retries:
                raise KubeError(f"{what}: {problem} (gave up after {attempt + 1} attempts)",
                                status=status) from cause
            delay = (min(retry_after, RETRY_AFTER_MAX) if retry_after is not None
                     else self._rng.uniform(0, min(BACKOFF_MAX, BACKOFF_BASE * 2 ** attempt)))
            attempt += 1
            log.info("kubernetes: %s: %s; retry %d/%d in %.2fs", what, problem, attempt,
                     self.settings.retries, delay)
            await self._sleep(delay)

    # --- pods ------------------------------------------------------------------------------

    async def list_pods(self, namespace: str, label_selector: str, node: str,
                        ) -> tuple[list[Pod], str]:
        """This node's pods matching the selector, and the list's resourceVersion."""
        data = await self.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods",
            what=f"list pods in namespace {namespace}",
            params={"labelSelector": label_selector, "fieldSelector": f"spec.nodeName={node}"})
        pods = [Pod.from_json(item) for item in data.get("items") or ()]
        # The server filtered already; filter again so a lax server can never widen it.
        return ([p for p in pods if p.node == node],
                str((data.get("metadata") or {}).get("resourceVersion", "")))

    async def get_pod(self, namespace: str, name: str) -> Pod:
        data = await self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}",
                                  what=f"get pods in namespace {namespace}")
        return Pod.from_json(data)

    async def delete_pod(self, pod: Pod, node: str) -> Pod:
        """Delete ``pod`` only if it is still this node's, with the same uid."""
        current = await self.get_pod(pod.namespace, pod.name)
        if current.node != node:
            raise KubeConflict(f"pod {pod.ref} is on node {current.node!r}, not {node!r}: "
                               "not deleting another node's pod")
        if current.uid != pod.uid:
            raise KubeConflict(f"pod {pod.ref} was replaced (uid {current.uid} != "
                               f"{pod.uid}): not deleting it")
        if current.deleting:  # already Terminating: its replacement is on the way
            log.info("kubernetes: pod %s is already terminating; not deleting it again",
                     pod.ref)
            return current
        data = await self.request(
            "DELETE", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}",
            what=f"delete pods in namespace {pod.namespace}",
            body={"apiVersion": "v1", "kind": "DeleteOptions",
                  "preconditions": {"uid": pod.uid}})
        return Pod.from_json(data) if data.get("kind") == "Pod" else current

    async def watch_pods(self, namespace: str, label_selector: str, node: str,
                         resource_version: str, within: float,
                         ) -> AsyncIterator[tuple[str, Pod]]:
        """Stream (type, pod) events for this node's matching pods for ``within`` seconds."""
        import httpx2  # noqa: PLC0415

        http = self._client()
        params = {"watch": "true", "labelSelector": label_selector,
                  "fieldSelector": f"spec.nodeName={node}",
                  "timeoutSeconds": str(max(1, int(within))),
                  "allowWatchBookmarks": "false"}
        if resource_version:
            params["resourceVersion"] = resource_version
        what = f"watch pods in namespace {namespace}"
        timeouts = httpx2.Timeout(self.settings.request_timeout, read=within + 5.0)
        try:
            async with http.stream("GET", f"/api/v1/namespaces/{namespace}/pods",
                                   params=params, timeout=timeouts,
                                   headers={"Accept": "application/json"}) as resp:
                if resp.status_code >= 300:
                    await resp.aread()
                    message = _status_message(resp, self._secret())
                    if resp.status_code in (401, 403):
                        raise _permission(resp.status_code, what, message,
                                          self.settings.kubeconfig)
                    raise KubeError(f"{what}: the API answered {resp.status_code}: "
                                    f"{message}", status=resp.status_code)
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                        kind, obj = str(event["type"]), event["object"]
                    except (ValueError, KeyError, TypeError) as err:
                        raise KubeError(f"{what}: a watch event is not valid JSON") from err
                    if kind == "ERROR":
                        raise KubeError(f"{what}: {obj.get('message', 'watch error')}",
                                        status=obj.get("code"))
                    if kind == "BOOKMARK":
                        continue
                    pod = Pod.from_json(obj)
                    if pod.node == node:
                        yield kind, pod
        except httpx2.HTTPError as err:
            raise KubeError(f"{what}: {_transport_problem(err)}") from None

    async def wait_replacement(self, namespace: str, label_selector: str, node: str, *,
                               old_uid: str, within: float,
                               clock: Callable[[], float]) -> Pod:
        """Wait for a pod on ``node`` with a uid other than ``old_uid`` to be Running and
        Ready: list, then watch from that version; re-list if the watch ends early."""
        deadline = clock() + within
        last: Pod | None = None
        while (left := deadline - clock()) > 0:
            pods, version = await self.list_pods(namespace, label_selector, node)
            for pod in pods:
                if pod.uid != old_uid and not pod.deleting:
                    last = pod
                    if pod.ready and pod.phase == "Running":
                        return pod
            try:
                async with asyncio.timeout(left):
                    async for kind, pod in self.watch_pods(namespace, label_selector, node,
                                                           version, left):
                        if kind in ("ADDED", "MODIFIED") and pod.uid != old_uid \
                                and not pod.deleting:
                            last = pod
                            if pod.ready and pod.phase == "Running":
                                return pod
            except TimeoutError:
                break
            except KubePermissionError:
                raise
            except KubeError as err:
                log.info("kubernetes: %s; listing again", err)
                if err.status != 410:  # 410 Expired: the version is gone, re-list at once
                    await self._sleep(min(1.0, max(0.0, deadline - clock())))
        seen = (f"replacement {last.ref} is {last.phase or 'Pending'}, "
                f"{'ready' if last.ready else 'not ready'}") if last else "no replacement pod"
        raise KubeError(f"no Ready replacement for the Flannel pod on node {node} within "
                        f"{within:g}s ({seen})")

    # --- the Node ---------------------------------------------------------------------------

    async def node_event(self, node: str, reason: str, message: str, *,
                         warning: bool = False) -> None:
        """Record an Event on the Node, as kubelet does (namespace default, uid = name)."""
        now = rfc3339(self._wall())
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{node}.edgeheal.", "namespace": EVENT_NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": reason, "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT, "host": node},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": COMPONENT, "reportingInstance": node,
        }
        await self.request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events",
                           what=f"create events in namespace {EVENT_NAMESPACE}", body=body)

    async def set_node_condition(self, node: str, kind: str, healthy: bool | None,
                                 reason: str, message: str) -> None:
        """Set one Node condition with a strategic-merge patch of ``nodes/status`` (merged
        by ``type``, so kubelet's own conditions are untouched)."""
        now = rfc3339(self._wall())
        status = "Unknown" if healthy is None else ("True" if healthy else "False")
        body = {"status": {"conditions": [{
            "type": kind, "status": status, "reason": reason, "message": message[:1024],
            "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
        await self.request("PATCH", f"/api/v1/nodes/{node}/status",
                           what="patch nodes/status (cluster-scoped)", body=body,
                           content_type="application/strategic-merge-patch+json")


_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)\s+[^\s'\"]+")


def _status_message(resp: Any, secret: str = "") -> str:
    """The API's own words about a failed call, shortened, with anything shaped like a
    credential (``Bearer <token>``) and our own token blanked: a server or proxy may echo
    a header back."""
    try:
        data = resp.json()
    except ValueError:
        text = (resp.text or "").strip()[:200] or str(resp.reason_phrase)
    else:
        text = (str(data["message"])[:300] if isinstance(data, dict) and data.get("message")
                else str(resp.reason_phrase))
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
