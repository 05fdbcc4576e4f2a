"""A faithful, in-process HTTPS stand-in for the slice of the Kubernetes API edgeheal uses.

Why: no kube-apiserver can run on the test machines, and a mock of the client would test
nothing. This is a real HTTPS server (aiohttp, a throw-away CA from trustme) that the agent
reaches through a real kubeconfig file, implementing the used subset the way the API
server does, including its failure modes:

- **authentication**: bearer tokens and TLS client certificates (user = the certificate's
  CN, as K3s's client certs); anything else -> 401 ``Unauthorized`` Status;
- **authorization**: a permission table of ``(user, verb, resource, namespace)`` rows, like
  RBAC (``namespace=None`` = cluster-wide); missing -> 403 with the API server's wording;
- **pods** (``/api/v1/namespaces/{ns}/pods[/{name}]``): get, list and watch with label
  selectors (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``) and field selectors
  (``spec.nodeName``, ``metadata.name``, ``metadata.namespace``, ``status.phase``; others ->
  400); watch streams (``watch=true``, ``resourceVersion``, ``timeoutSeconds``) of ADDED /
  MODIFIED / DELETED JSON lines; DELETE with ``DeleteOptions.preconditions.uid`` (409 on a
  mismatch) returning the object with ``deletionTimestamp`` set;
- **a DaemonSet-like controller**: :meth:`FakeKube.add_daemonset` makes one pod per node; a
  deleted one is replaced after ``replace_delay`` by a pod with a new name and uid that turns
  Running and Ready after ``ready_delay``; ``on_replace`` callbacks see (old, new) pods —
  the WireGuard lab uses them to rebuild the stand-in Flannel's tunnel;
- **Events** (POST ``/api/v1/namespaces/{ns}/events``) and **Node status** (GET node, PATCH
  ``/api/v1/nodes/{name}/status``: strategic merge by condition ``type``, or JSON merge);
- **fault injection**: :meth:`FakeKube.fail` (e.g. 429 with ``Retry-After``, 500) and
  :meth:`FakeKube.slow` (a delay before answering), each for ``times`` matching requests.

Usage::

    api = FakeKube(ready_delay=0.5)
    api.add_node("edge-1"); api.add_node("edge-2")
    api.add_daemonset("kube-flannel", "kube-flannel-ds", {"app": "flannel"})
    creds = api.add_user("system:serviceaccount:kube-flannel:edgeheal", token="t0k")
    api.allow(creds.user, "list", "pods", "kube-flannel")
    url = await api.start()                    # https://127.0.0.1:<port>
    api.write_kubeconfig(tmp_path / "kubeconfig", creds)
    ...
    await api.close()

Inspect what happened through :attr:`FakeKube.requests`, :attr:`FakeKube.deletions`,
:attr:`FakeKube.events` and :meth:`FakeKube.node`. This is lab code: never imported by the
agent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import re
import secrets
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

Obj = dict[str, Any]
USER: web.RequestKey[str] = web.RequestKey("user", str)
WATCHING: web.RequestKey[bool] = web.RequestKey("watching", bool)


@dataclass(frozen=True, slots=True)
class Credentials:
    """How one user authenticates: a token, or a client certificate (PEM paths/bytes)."""

    user: str
    token: str = ""
    cert_pem: bytes = b""
    key_pem: bytes = b""


@dataclass
class Fault:
    status: int = 0
    delay: float = 0.0
    retry_after: float | None = None
    times: int = 1
    method: str | None = None
    path: str | None = None
    """A regular expression searched in the request path."""

    def matches(self, request: web.Request) -> bool:
        return (self.times > 0 and (self.method is None or request.method == self.method)
                and (self.path is None or re.search(self.path, request.path) is not None))


@dataclass(frozen=True, slots=True)
class Logged:
    method: str
    path: str
    query: str
    user: str
    status: int


@dataclass
class _DaemonSet:
    namespace: str
    name: str
    labels: dict[str, str]


@dataclass
class _Watcher:
    namespace: str | None
    kind: str
    queue: asyncio.Queue[tuple[str, Obj]] = field(default_factory=asyncio.Queue)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    return web.json_response(body, status=code)


class SelectorError(ValueError):
    pass


def parse_labels(selector: str) -> list[tuple[str, str, str]]:
    """``app=flannel,tier!=x,k,!j`` -> [(op, key, value)]."""
    out: list[tuple[str, str, str]] = []
    for raw in filter(None, (p.strip() for p in selector.split(","))):
        if m := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)", raw):
            out.append(("!=" if m.group(2) == "!=" else "=", m.group(1), m.group(3)))
        elif m := re.fullmatch(r"!\s*([\w./-]+)", raw):
            out.append(("!", m.group(1), ""))
        elif re.fullmatch(r"[\w./-]+", raw):
            out.append(("exists", raw, ""))
        else:
            raise SelectorError(f"unable to parse requirement: {raw!r}")
    return out


def labels_match(requirements: list[tuple[str, str, str]], labels: dict[str, str]) -> bool:
    for op, key, value in requirements:
        if (op == "=" and labels.get(key) != value) or (op == "!=" and labels.get(key) == value) \
                or (op == "exists" and key not in labels) or (op == "!" and key in labels):
            return False
    return True


POD_FIELDS = {"spec.nodeName": ("spec", "nodeName"), "metadata.name": ("metadata", "name"),
              "metadata.namespace": ("metadata", "namespace"),
              "status.phase": ("status", "phase")}


def parse_fields(selector: str) -> list[tuple[str, tuple[str, str], str]]:
    out = []
    for raw in filter(None, (p.strip() for p in selector.split(","))):
        m = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", raw)
        if not m:
            raise SelectorError(f"invalid field selector: {raw!r}")
        if m.group(1) not in POD_FIELDS:
            raise SelectorError(f'field label not supported: {m.group(1)}')
        out.append(("!=" if m.group(2) == "!=" else "=", POD_FIELDS[m.group(1)], m.group(3)))
    return out


def fields_match(requirements: list[tuple[str, tuple[str, str], str]], obj: Obj) -> bool:
    for op, (a, b), value in requirements:
        actual = str((obj.get(a) or {}).get(b) or "")
        if (actual == value) != (op == "="):
            return False
    return True


class FakeKube:
    """The test API server. See the module docstring."""

    def __init__(self, *, ready_delay: float = 0.3, replace_delay: float = 0.05,
                 server_names: tuple[str, ...] = ()) -> None:
        """``server_names``: extra addresses/names for the server certificate (e.g. the
        address edge namespaces reach it on); 127.0.0.1, ::1 and localhost always."""
        import trustme  # noqa: PLC0415 - lab dependency

        self.ready_delay, self.replace_delay = ready_delay, replace_delay
        self.ca = trustme.CA()
        self._server_cert = self.ca.issue_cert("127.0.0.1", "localhost", "::1",
                                               *server_names)
        self.nodes: dict[str, Obj] = {}
        self._pods: dict[tuple[str, str], Obj] = {}
        self._daemonsets: list[_DaemonSet] = []
        self.events: list[Obj] = []
        self.deletions: list[Obj] = []
        """Every pod deleted, as it was when deleted (``spec.nodeName``, uid, ...)."""
        self.deleted_by: list[str] = []
        """The user who made each deletion, parallel to :attr:`deletions`."""
        self.requests: list[Logged] = []
        self.on_replace: list[Callable[[Obj, Obj], None]] = []
        self._tokens: dict[str, str] = {}
        self._cert_users: set[str] = set()
        self._allowed: set[tuple[str, str, str, str | None]] = set()
        self._faults: list[Fault] = []
        self._watchers: list[_Watcher] = []
        self._rv = 100
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # --- the world ---------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def add_node(self, name: str) -> Obj:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": str(uuid.uuid4()),
                             "resourceVersion": self._next_rv(), "labels": {}},
                "status": {"conditions": [{"type": "Ready", "status": "True",
                                           "reason": "KubeletReady", "message": "ok"}]}}
        self.nodes[name] = node
        for ds in self._daemonsets:
            self._create_pod(ds, name, ready=True)
        return node

    def node(self, name: str) -> Obj:
        return self.nodes[name]

    def add_daemonset(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        ds = _DaemonSet(namespace, name, dict(labels))
        self._daemonsets.append(ds)
        for node in self.nodes:
            self._create_pod(ds, node, ready=True)

    def add_pod(self, namespace: str, name: str, node: str, labels: dict[str, str],
                *, ready: bool = True) -> Obj:
        """A pod no controller owns (it is not replaced when deleted)."""
        pod = self._pod_obj(namespace, name, node, labels, ready=ready, owner=None)
        self._put(pod, "ADDED")
        return pod

    def pods(self, namespace: str | None = None, node: str | None = None) -> list[Obj]:
        return [copy.deepcopy(p) for (ns, _), p in sorted(self._pods.items())
                if (namespace is None or ns == namespace)
                and (node is None or p["spec"].get("nodeName") == node)]

    def pod_on(self, namespace: str, node: str, selector: str = "app=flannel") -> Obj:
        """The one live pod matching ``selector`` on ``node``; LookupError when there is
        none (e.g. between a deletion and the replacement) or more than one."""
        wanted = parse_labels(selector)
        found = [p for p in self.pods(namespace, node)
                 if not p["metadata"].get("deletionTimestamp")
                 and labels_match(wanted, p["metadata"].get("labels") or {})]
        if len(found) != 1:
            raise LookupError(f"{len(found)} live pods {selector} in {namespace} on {node}")
        return found[0]

    def _pod_obj(self, namespace: str, name: str, node: str, labels: dict[str, str], *,
                 ready: bool, owner: str | None) -> Obj:
        meta: Obj = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                     "labels": dict(labels), "creationTimestamp": _now()}
        if owner:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                        "name": owner, "controller": True}]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": node, "containers": [{"name": "kube-flannel",
                                                           "image": "flannel"}]},
                "status": self._pod_status(ready)}

    @staticmethod
    def _pod_status(ready: bool) -> Obj:
        flag = "True" if ready else "False"
        return {"phase": "Running" if ready else "Pending",
                "conditions": [{"type": "Ready", "status": flag},
                               {"type": "ContainersReady", "status": flag}]}

    def _create_pod(self, ds: _DaemonSet, node: str, *, ready: bool) -> Obj:
        name = f"{ds.name}-{secrets.token_hex(3)[:5]}"
        pod = self._pod_obj(ds.namespace, name, node, ds.labels, ready=ready, owner=ds.name)
        self._put(pod, "ADDED")
        return pod

    def _put(self, obj: Obj, kind: str) -> None:
        obj["metadata"]["resourceVersion"] = self._next_rv()
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if kind == "DELETED":
            self._pods.pop(key, None)
        else:
            self._pods[key] = obj
        for watcher in self._watchers:
            if watcher.kind == "pods" and watcher.namespace in (None, key[0]):
                watcher.queue.put_nowait((kind, copy.deepcopy(obj)))

    def set_ready(self, namespace: str, name: str, ready: bool) -> None:
        pod = self._pods[(namespace, name)]
        pod["status"] = self._pod_status(ready)
        self._put(pod, "MODIFIED")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replace(self, ds: _DaemonSet, old: Obj) -> None:
        await asyncio.sleep(self.replace_delay)
        node = old["spec"]["nodeName"]
        new = self._create_pod(ds, node, ready=False)
        for callback in self.on_replace:
            try:
                callback(copy.deepcopy(old), copy.deepcopy(new))
            except Exception:
                log.exception("on_replace callback failed")
        await asyncio.sleep(self.ready_delay)
        key = (new["metadata"]["namespace"], new["metadata"]["name"])
        if key in self._pods:
            self.set_ready(*key, True)

    # --- users, permissions, faults ---------------------------------------------------

    def add_user(self, user: str, *, token: str | None = None, cert: bool = False,
                 ) -> Credentials:
        if cert:
            leaf = self.ca.issue_cert(f"{secrets.token_hex(4)}.users.invalid", common_name=user)
            self._cert_users.add(user)
            return Credentials(user, cert_pem=leaf.cert_chain_pems[0].bytes(),
                               key_pem=leaf.private_key_pem.bytes())
        token = token or secrets.token_urlsafe(24)
        self._tokens[token] = user
        return Credentials(user, token=token)

    def revoke(self, credentials: Credentials) -> None:
        self._tokens.pop(credentials.token, None)
        self._cert_users.discard(credentials.user)

    def allow(self, user: str, verb: str, resource: str, namespace: str | None = None) -> None:
        """Grant ``verb`` on ``resource`` (``pods``, ``events``, ``nodes``, ``nodes/status``)
        in ``namespace`` (None: every namespace / cluster-scoped)."""
        self._allowed.add((user, verb, resource, namespace))

    def allow_agent(self, user: str, namespace: str = "kube-flannel") -> None:
        """What k3s-manifests/rbac.yaml grants the agent."""
        for verb in ("get", "list", "watch", "delete"):
            self.allow(user, verb, "pods", namespace)
        self.allow(user, "create", "events", "default")
        self.allow(user, "patch", "events", "default")
        self.allow(user, "get", "nodes")
        self.allow(user, "patch", "nodes/status")

    def deny(self, user: str, verb: str, resource: str, namespace: str | None = None) -> None:
        self._allowed.discard((user, verb, resource, namespace))

    def fail(self, status: int, *, times: int = 1, retry_after: float | None = None,
             method: str | None = None, path: str | None = None) -> Fault:
        fault = Fault(status=status, retry_after=retry_after, times=times, method=method,
                      path=path)
        self._faults.append(fault)
        return fault

    def slow(self, delay: float, *, times: int = 1, method: str | None = None,
             path: str | None = None) -> Fault:
        fault = Fault(delay=delay, times=times, method=method, path=path)
        self._faults.append(fault)
        return fault

    def _permitted(self, user: str, verb: str, resource: str, namespace: str | None) -> bool:
        return ((user, verb, resource, namespace) in self._allowed
                or (user, verb, resource, None) in self._allowed)

    # --- kubeconfig --------------------------------------------------------------------

    def write_kubeconfig(self, path: Path, credentials: Credentials, *,
                         namespace: str = "default") -> Path:
        """A real kubeconfig as K3s writes them (CA and client cert as ``*-data``)."""
        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        user: Obj = {}
        if credentials.token:
            user["token"] = credentials.token
        else:
            user["client-certificate-data"] = b64(credentials.cert_pem)
            user["client-key-data"] = b64(credentials.key_pem)
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "fake", "cluster": {
                "server": self.url, "certificate-authority-data": b64(self.ca.cert_pem.bytes())}}],
            "users": [{"name": "edgeheal", "user": user}],
            "contexts": [{"name": "edgeheal", "context": {
                "cluster": "fake", "user": "edgeheal", "namespace": namespace}}],
            "current-context": "edgeheal",
        }
        import yaml  # type: ignore[import-untyped]  # noqa: PLC0415 - lightkube's dep

        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        path.chmod(0o600)
        return path

    # --- serving -----------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1") -> str:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_cert.configure_cert(ctx)
        self.ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_OPTIONAL
        app = web.Application(middlewares=[self._middleware])
        app.router.add_route("GET", "/api/v1/namespaces/{ns}/pods", self._list_pods)
        app.router.add_route("GET", "/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        app.router.add_route("DELETE", "/api/v1/namespaces/{ns}/pods/{name}",
                             self._delete_pod)
        app.router.add_route("POST", "/api/v1/namespaces/{ns}/events", self._post_event)
        app.router.add_route("GET", "/api/v1/nodes/{name}", self._get_node)
        app.router.add_route("PATCH", "/api/v1/nodes/{name}/status", self._patch_node_status)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, 0, ssl_context=ctx)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"https://{host}:{port}"
        return self.url

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for watcher in self._watchers:
            watcher.queue.put_nowait(("CLOSE", {}))
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._runner.cleanup(), 5.0)
            self._runner = None

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        user = self._authenticate(request)
        status = 500
        try:
            if user is None:
                status = 401
                return _status(401, "Unauthorized", "Unauthorized")
            request[USER] = user
            for fault in self._faults:
                if fault.matches(request):
                    fault.times -= 1
                    if fault.delay:
                        await asyncio.sleep(fault.delay)
                    if fault.status:
                        status = fault.status
                        injected = _status(fault.status, "TooManyRequests"
                                           if fault.status == 429 else "InternalError",
                                           f"injected {fault.status}")
                        if fault.retry_after is not None:
                            injected.headers["Retry-After"] = f"{fault.retry_after:g}"
                        return injected
                    break
            denied = self._authorize(request, user)
            if denied is not None:
                status = 403
                return denied
            resp: web.StreamResponse = await handler(request)
        except web.HTTPException as err:
            status = err.status
            raise
        else:
            status = resp.status
            return resp
        finally:
            if not request.get(WATCHING):  # a watch logged itself when it began streaming
                self.requests.append(Logged(request.method, request.path,
                                            request.query_string, user or "", status))

    def _authenticate(self, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return self._tokens.get(auth[len("Bearer "):])
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        if peer:
            for rdn in peer.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName" and value in self._cert_users:
                        return str(value)
        return None

    def _authorize(self, request: web.Request, user: str) -> web.Response | None:
        info = request.match_info
        ns = info.get("ns")
        name = info.get("name", "")
        path = request.path
        if "/events" in path:
            resource = "events"
        elif path.endswith("/status") and "/nodes/" in path:
            resource = "nodes/status"
        elif "/nodes/" in path:
            resource = "nodes"
        else:
            resource = "pods"
        verb = {"DELETE": "delete", "POST": "create", "PATCH": "patch", "PUT": "update"}.get(
            request.method, "get")
        if verb == "get" and not name:
            verb = "watch" if request.query.get("watch") in ("true", "1") else "list"
        if self._permitted(user, verb, resource, ns):
            return None
        base = resource.split("/")[0]
        sub = f'{base} "{name}"' if name else base
        scope = f' in the namespace "{ns}"' if ns else " at the cluster scope"
        return _status(403, "Forbidden",
                       f'{sub} is forbidden: User "{user}" cannot {verb} resource "{base}"'
                       + (f' subresource "{resource.split("/")[1]}"' if "/" in resource
                          else "") + f' in API group ""{scope}')

    # --- handlers ----------------------------------------------------------------------

    async def _list_pods(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info["ns"]
        try:
            labels = parse_labels(request.query.get("labelSelector", ""))
            fields = parse_fields(request.query.get("fieldSelector", ""))
        except SelectorError as err:
            return _status(400, "BadRequest", str(err))

        def selected(obj: Obj) -> bool:
            return (obj["metadata"]["namespace"] == ns
                    and labels_match(labels, obj["metadata"].get("labels") or {})
                    and fields_match(fields, obj))

        if request.query.get("watch") in ("true", "1"):
            return await self._watch(request, ns, selected)
        items = [copy.deepcopy(p) for p in self._pods.values() if selected(p)]
        return web.json_response({"apiVersion": "v1", "kind": "PodList",
                                  "metadata": {"resourceVersion": str(self._rv)},
                                  "items": items})

    async def _watch(self, request: web.Request, ns: str,
                     selected: Callable[[Obj], bool]) -> web.StreamResponse:
        timeout = float(request.query.get("timeoutSeconds", "300"))
        since = int(request.query.get("resourceVersion") or 0)
        watcher = _Watcher(ns, "pods")
        self._watchers.append(watcher)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        request[WATCHING] = True
        self.requests.append(Logged(request.method, request.path, request.query_string,
                                    request[USER], 200))
        if since == 0:  # no version: the current state as ADDED events first
            for pod in list(self._pods.values()):
                if selected(pod):
                    await resp.write(json.dumps({"type": "ADDED", "object": pod}).encode()
                                     + b"\n")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    kind, obj = await asyncio.wait_for(watcher.queue.get(), left)
                except TimeoutError:
                    break
                if kind == "CLOSE":
                    break
                if int(obj["metadata"]["resourceVersion"]) <= since or not selected(obj):
                    continue
                await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.remove(watcher)
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

    async def _get_pod(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        pod = self._pods.get(key)
        if pod is None:
            return _status(404, "NotFound", f'pods "{key[1]}" not found')
        return web.json_response(pod)

    async def _delete_pod(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        pod = self._pods.get(key)
        if pod is None:
            return _status(404, "NotFound", f'pods "{key[1]}" not found')
        options: Obj = {}
        if request.can_read_body:
            try:
                options = await request.json()
            except ValueError:
                return _status(400, "BadRequest", "DeleteOptions is not valid JSON")
        want = ((options or {}).get("preconditions") or {}).get("uid")
        uid = pod["metadata"]["uid"]
        if want is not None and want != uid:
            return _status(409, "Conflict",
                           f"Operation cannot be fulfilled on Pod \"{key[1]}\": Precondition "
                           f"failed: UID in precondition: {want}, UID in object meta: {uid}")
        pod["metadata"]["deletionTimestamp"] = _now()
        self._put(pod, "MODIFIED")
        answer = copy.deepcopy(pod)
        self._put(pod, "DELETED")
        self.deletions.append(copy.deepcopy(answer))
        self.deleted_by.append(request[USER])
        owner = (pod["metadata"].get("ownerReferences") or [{}])[0].get("name")
        for ds in self._daemonsets:
            if ds.namespace == key[0] and ds.name == owner:
                self._spawn(self._replace(ds, pod))
        return web.json_response(answer)

    async def _post_event(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        try:
            event = await request.json()
            involved = event["involvedObject"]
            if not (event.get("reason") and involved.get("kind") and involved.get("name")):
                raise KeyError("reason/involvedObject")
        except (ValueError, KeyError, TypeError) as err:
            return _status(422, "Invalid", f"Event is invalid: {err}")
        meta = event.setdefault("metadata", {})
        meta["namespace"] = ns
        meta["name"] = meta.get("name") or f"{meta.get('generateName', 'event.')}" \
            f"{secrets.token_hex(8)}"
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = self._next_rv()
        self.events.append(event)
        return web.json_response(event, status=201)

    async def _get_node(self, request: web.Request) -> web.Response:
        node = self.nodes.get(request.match_info["name"])
        if node is None:
            return _status(404, "NotFound", f'nodes "{request.match_info["name"]}" not found')
        return web.json_response(node)

    async def _patch_node_status(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        node = self.nodes.get(name)
        if node is None:
            return _status(404, "NotFound", f'nodes "{name}" not found')
        kind = request.content_type
        if kind not in ("application/strategic-merge-patch+json",
                        "application/merge-patch+json"):
            return _status(415, "UnsupportedMediaType",
                           f"the body of the request was in an unknown format: {kind}")
        try:
            patch = await request.json()
            conditions = patch["status"]["conditions"]
            if not isinstance(conditions, list) or not all("type" in c for c in conditions):
                raise TypeError("conditions must be a list of objects with a type")
        except (ValueError, KeyError, TypeError) as err:
            return _status(422, "Invalid", f"unsupported patch: {err}")
        if kind == "application/merge-patch+json":
            node["status"]["conditions"] = conditions
        else:
            by_type = {c["type"]: c for c in node["status"]["conditions"]}
            for cond in conditions:
                by_type[cond["type"]] = {**by_type.get(cond["type"], {}), **cond}
            node["status"]["conditions"] = list(by_type.values())
        node["metadata"]["resourceVersion"] = self._next_rv()
        return web.json_response(node)

    def condition(self, node: str, kind: str) -> Obj | None:
        for cond in self.nodes[node]["status"]["conditions"]:
            if cond["type"] == kind:
                return dict(cond)
        return None
