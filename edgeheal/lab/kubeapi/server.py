"""The test API server itself: :class:`FakeKube`. See the package docstring."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import json
import logging
import math
import re
import secrets
import ssl
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from edgeheal.lab.kubeapi import discovery, protobuf
from edgeheal.lab.kubeapi.selectors import (
    SelectorError,
    fields_match,
    labels_match,
    parse_fields,
    parse_labels,
)

log = logging.getLogger(__name__)

Obj = dict[str, Any]
USER: web.RequestKey[str] = web.RequestKey("user", str)
WATCHING: web.RequestKey[bool] = web.RequestKey("watching", bool)
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
"""The alphabet of ``generateName`` suffixes (no vowels, no look-alikes)."""
DISCOVERY_PATHS = ("/api", "/apis", "/version", "/openapi", "/healthz", "/livez", "/readyz")
"""Non-resource URLs every authenticated user may GET (``system:discovery``)."""
SELF_REVIEWS = {("authorization.k8s.io", "selfsubjectaccessreviews"),
                ("authorization.k8s.io", "selfsubjectrulesreviews"),
                ("authentication.k8s.io", "selfsubjectreviews")}
"""Resources every authenticated user may create (``system:basic-user``)."""


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
    query: str | None = None
    """A regular expression searched in the (encoded) query string."""
    call: Callable[[], object] | None = None
    """Run just before the request is handled (e.g. :meth:`FakeKube.compact`)."""

    def matches(self, request: web.Request) -> bool:
        return (self.times > 0 and (self.method is None or request.method == self.method)
                and (self.path is None or re.search(self.path, request.path) is not None)
                and (self.query is None
                     or re.search(self.query, request.query_string) is not None))


@dataclass(frozen=True, slots=True)
class Logged:
    method: str
    path: str
    query: str
    user: str
    status: int


@dataclass(frozen=True, slots=True)
class Attributes:
    """What one request asked to do, as the authorizer saw it (``resource`` carries the
    subresource: ``nodes/status``; non-resource requests have ``path`` instead)."""

    user: str
    verb: str
    resource: str = ""
    namespace: str | None = None
    name: str = ""
    group: str = ""
    path: str = ""
    allowed: bool = False


@dataclass(frozen=True, slots=True)
class Target:
    """A request path taken apart: ``/api/v1/namespaces/{ns}/{resource}/{name}/{sub}``."""

    group: str
    version: str
    resource: str
    namespace: str | None
    name: str
    subresource: str

    @property
    def full(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


TARGET: web.RequestKey[Target] = web.RequestKey("target", Target)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


@dataclass
class _DaemonSet:
    namespace: str
    name: str
    labels: dict[str, str]
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class _Watcher:
    resource: str
    namespace: str | None
    queue: asyncio.Queue[tuple[str, Obj]] = field(default_factory=asyncio.Queue)


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now() -> str:
    return _stamp(datetime.now(UTC))


def status_body(code: int, reason: str, message: str, **details: Any) -> Obj:
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def _status(code: int, reason: str, message: str, **details: Any) -> web.Response:
    return web.json_response(status_body(code, reason, message, **details), status=code)


def parse_path(path: str) -> Target | None:
    """The resource a path names, or None for a non-resource path (``/version``,
    ``/api``, a group's discovery document)."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    return Target(group, version, rest[0], namespace, rest[1] if len(rest) > 1 else "",
                  "/".join(rest[2:]))


def verb_of(method: str, target: Target, query: Any) -> str:
    if method == "GET":
        if target.name:
            return "get"
        return "watch" if query.get("watch") in ("true", "1") else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(
        method, "delete" if target.name else "deletecollection")


def forbidden_message(attrs: Attributes) -> tuple[str, Obj]:
    """The API server's wording (``responsewriters.forbiddenMessage`` + NewForbidden)."""
    if attrs.path:
        return (f'forbidden: User "{attrs.user}" cannot {attrs.verb} path "{attrs.path}"',
                {})
    where = (f' in the namespace "{attrs.namespace}"' if attrs.namespace
             else " at the cluster scope")
    base = attrs.resource.split("/")[0]
    qualified = f"{base}.{attrs.group}" if attrs.group else base
    subject = f'{qualified} "{attrs.name}"' if attrs.name else qualified
    details: Obj = {"kind": base, **({"name": attrs.name} if attrs.name else {}),
                    **({"group": attrs.group} if attrs.group else {})}
    return (f'{subject} is forbidden: User "{attrs.user}" cannot {attrs.verb} resource '
            f'"{attrs.resource}" in API group "{attrs.group}"{where}', details)


def _wire_time(value: Any, what: str) -> str:
    """A ``metav1.Time`` as the API server stores it: parsed as RFC 3339, kept to the
    second (a malformed one is the decoder's 400)."""
    try:
        return _stamp(discovery.parse_time(str(value)))
    except ValueError as err:
        raise ApiError(400, "BadRequest", f"{what}: parsing time {value!r} as RFC 3339: "
                       f"{err}") from err


def _parse_rv(raw: str) -> int | None:
    if raw in ("", "0"):
        return None
    if not re.fullmatch(r"[0-9]+", raw):
        raise ApiError(400, "BadRequest", f"invalid resource version: {raw!r}: a "
                       "resourceVersion is an unsigned integer")
    return int(raw)


class FakeKube:
    """The test API server. See the package docstring."""

    def __init__(self, *, ready_delay: float = 0.3, replace_delay: float = 0.05,
                 stop_delay: float = 0.3, grace: int = 30,
                 server_names: tuple[str, ...] = (), version: str = "v1.33.5+k3s1",
                 history: int = 1000, bookmark_interval: float = 60.0) -> None:
        """``server_names``: extra addresses/names for the server certificate (e.g. the
        address edge namespaces reach it on); 127.0.0.1, ::1 and localhost always.
        ``ready_delay``: how long a replacement pod takes to turn Running and Ready;
        ``replace_delay``: how soon the DaemonSet controller creates it; ``stop_delay``:
        how long a deleted pod stays Terminating (its container exits on SIGTERM; never
        longer than the grace period); ``grace``: the pods' terminationGracePeriodSeconds;
        ``history``: how many changes a watch can resume from (older: 410 Expired);
        ``bookmark_interval``: seconds between BOOKMARKs for watches that allow them."""
        import trustme  # noqa: PLC0415 - lab dependency

        self.ready_delay, self.replace_delay = ready_delay, replace_delay
        self.stop_delay, self.grace = stop_delay, grace
        self.version, self.bookmark_interval = version, bookmark_interval
        self.ca = trustme.CA()
        self._server_cert = self.ca.issue_cert("127.0.0.1", "localhost", "::1",
                                               *server_names)
        self._store: dict[str, dict[tuple[str, str], Obj]] = {
            "pods": {}, "nodes": {}, "events": {}}
        self._history: deque[tuple[int, str, str, Obj]] = deque(maxlen=history)
        self._compacted = 0
        self._daemonsets: list[_DaemonSet] = []
        self.deletions: list[Obj] = []
        """Every pod deletion accepted (not dry-run), as the pod was then."""
        self.deleted_by: list[str] = []
        """The user who made each deletion, parallel to :attr:`deletions`."""
        self.requests: list[Logged] = []
        self.authorized: list[Attributes] = []
        """Every resource request's attributes and the authorizer's answer, in order."""
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

    @property
    def nodes(self) -> dict[str, Obj]:
        return {name: node for (_, name), node in self._store["nodes"].items()}

    @property
    def events(self) -> list[Obj]:
        """Every Event created, oldest first."""
        return list(self._store["events"].values())

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _put(self, resource: str, obj: Obj, kind: str) -> None:
        """Store a change, number it, remember it for watches resuming, tell watchers."""
        rv = self._next_rv()
        obj["metadata"]["resourceVersion"] = rv
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if kind == "DELETED":
            self._store[resource].pop(key, None)
        else:
            self._store[resource][key] = obj
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0][0]
        snapshot = copy.deepcopy(obj)
        self._history.append((int(rv), resource, kind, snapshot))
        for watcher in self._watchers:
            if watcher.resource == resource and watcher.namespace in (None, key[0]):
                watcher.queue.put_nowait((kind, snapshot))

    def compact(self) -> None:
        """Forget every change so far, as etcd compaction does: a watch from an older
        resourceVersion gets an ``ERROR`` event with a 410 ``Expired`` Status."""
        self._compacted = self._rv
        self._history.clear()

    def expire_watches(self) -> None:
        """End every open watch with an in-stream 410 ``Expired`` (the watch cache was
        re-initialised)."""
        self.compact()
        for watcher in self._watchers:
            watcher.queue.put_nowait(("EXPIRE", {}))

    def add_node(self, name: str) -> Obj:
        index = len(self._store["nodes"]) + 10
        created = _now()
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": str(uuid.uuid4()),
                             "creationTimestamp": created,
                             "labels": {"kubernetes.io/hostname": name,
                                        "kubernetes.io/os": "linux",
                                        "kubernetes.io/arch": "amd64"}},
                "spec": {"podCIDR": f"10.42.{index}.0/24"},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True",
                                    "reason": "KubeletReady",
                                    "message": "kubelet is posting ready status",
                                    "lastHeartbeatTime": created,
                                    "lastTransitionTime": created}],
                    "addresses": [{"type": "InternalIP", "address": f"192.0.2.{index}"},
                                  {"type": "Hostname", "address": name}],
                    "capacity": {"cpu": "2", "memory": "4015852Ki", "pods": "110"},
                    "allocatable": {"cpu": "2", "memory": "4015852Ki", "pods": "110"},
                    "nodeInfo": {"kubeletVersion": self.version,
                                 "kubeProxyVersion": self.version,
                                 "osImage": "Debian GNU/Linux 12 (bookworm)",
                                 "kernelVersion": "6.1.0-26-amd64",
                                 "containerRuntimeVersion": "containerd://1.7.23-k3s2",
                                 "operatingSystem": "linux", "architecture": "amd64",
                                 "machineID": "", "systemUUID": "", "bootID": ""}}}
        self._put("nodes", node, "ADDED")
        for ds in self._daemonsets:
            self._create_pod(ds, name, ready=True)
        return node

    def node(self, name: str) -> Obj:
        return self._store["nodes"][("", name)]

    def add_daemonset(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        ds = _DaemonSet(namespace, name, dict(labels))
        self._daemonsets.append(ds)
        for node in self.nodes:
            self._create_pod(ds, node, ready=True)

    def add_pod(self, namespace: str, name: str, node: str, labels: dict[str, str],
                *, ready: bool = True) -> Obj:
        """A pod no controller owns (it is not replaced when deleted)."""
        pod = self._pod_obj(namespace, name, node, labels, ready=ready, owner=None)
        self._put("pods", pod, "ADDED")
        return pod

    def pods(self, namespace: str | None = None, node: str | None = None) -> list[Obj]:
        return [copy.deepcopy(p) for (ns, _), p in sorted(self._store["pods"].items())
                if (namespace is None or ns == namespace)
                and (node is None or p["spec"].get("nodeName") == node)]

    def pod_on(self, namespace: str, node: str, selector: str = "app=flannel") -> Obj:
        """The one live (not Terminating) pod matching ``selector`` on ``node``;
        LookupError when there is none (e.g. between a deletion and the replacement) or
        more than one."""
        wanted = parse_labels(selector)
        found = [p for p in self.pods(namespace, node)
                 if not p["metadata"].get("deletionTimestamp")
                 and labels_match(wanted, p["metadata"].get("labels") or {})]
        if len(found) != 1:
            raise LookupError(f"{len(found)} live pods {selector} in {namespace} on {node}")
        return found[0]

    def recreate(self, namespace: str, name: str) -> Obj:
        """The pod deleted and created again under the same name (a new uid), at once: the
        race a uid precondition exists for."""
        old = self._store["pods"][(namespace, name)]
        self._put("pods", old, "DELETED")
        pod = copy.deepcopy(old)
        pod["metadata"]["uid"] = str(uuid.uuid4())
        pod["metadata"]["creationTimestamp"] = _now()
        self._put("pods", pod, "ADDED")
        return pod

    def terminating(self, namespace: str, node: str | None = None) -> list[Obj]:
        """The pods with a ``deletionTimestamp`` still listed (their grace period)."""
        return [p for p in self.pods(namespace, node) if p["metadata"].get("deletionTimestamp")]

    def _node_ip(self, node: str) -> str:
        found = self._store["nodes"].get(("", node))
        addresses = (found or {}).get("status", {}).get("addresses") or [{}]
        return str(addresses[0].get("address", ""))

    def _pod_obj(self, namespace: str, name: str, node: str, labels: dict[str, str], *,
                 ready: bool, owner: _DaemonSet | None) -> Obj:
        meta: Obj = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                     "labels": dict(labels), "creationTimestamp": _now()}
        if owner:
            meta["generateName"] = f"{owner.name}-"
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                        "name": owner.name, "uid": owner.uid,
                                        "controller": True, "blockOwnerDeletion": True}]
        ip = self._node_ip(node)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": node, "hostNetwork": True, "restartPolicy": "Always",
                         "terminationGracePeriodSeconds": self.grace,
                         "schedulerName": "default-scheduler", "serviceAccountName": "flannel",
                         "priorityClassName": "system-node-critical",
                         "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                         "containers": [{"name": "kube-flannel", "image":
                                         "ghcr.io/flannel-io/flannel:v0.26.7",
                                         "imagePullPolicy": "IfNotPresent",
                                         "resources": {}}]},
                "status": {"hostIP": ip, "podIP": ip, "podIPs": [{"ip": ip}],
                           "qosClass": "BestEffort", "startTime": meta["creationTimestamp"],
                           **self._pod_status(ready)}}

    @staticmethod
    def _pod_status(ready: bool, *, stopped: bool = False) -> Obj:
        flag = "True" if ready else "False"
        now = _now()
        if stopped:
            state: Obj = {"terminated": {"exitCode": 0, "reason": "Completed",
                                         "finishedAt": now}}
        elif ready:
            state = {"running": {"startedAt": now}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        return {"phase": "Running" if ready or stopped else "Pending",
                "conditions": [{"type": t, "status": flag, "lastProbeTime": None,
                                "lastTransitionTime": now}
                               for t in ("Initialized", "Ready", "ContainersReady",
                                         "PodScheduled")],
                "containerStatuses": [{"name": "kube-flannel", "ready": ready,
                                       "started": ready, "restartCount": 0, "state": state,
                                       "lastState": {},
                                       "image": "ghcr.io/flannel-io/flannel:v0.26.7",
                                       "imageID": ""}]}

    def _create_pod(self, ds: _DaemonSet, node: str, *, ready: bool) -> Obj:
        name = f"{ds.name}-{''.join(secrets.choice(NAME_CHARS) for _ in range(5))}"
        pod = self._pod_obj(ds.namespace, name, node, ds.labels, ready=ready, owner=ds)
        self._put("pods", pod, "ADDED")
        return pod

    def set_ready(self, namespace: str, name: str, ready: bool) -> None:
        pod = self._store["pods"][(namespace, name)]
        pod["status"].update(self._pod_status(ready))
        self._put("pods", pod, "MODIFIED")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replace(self, ds: _DaemonSet, old: Obj) -> None:
        """The DaemonSet controller: a Terminating pod no longer counts, so a new one is
        created on its node at once (while the old one is still listed)."""
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
        if key in self._store["pods"] and not \
                self._store["pods"][key]["metadata"].get("deletionTimestamp"):
            self.set_ready(*key, True)

    async def _terminate(self, key: tuple[str, str], uid: str, after: float) -> None:
        """The kubelet: the container stops, the pod turns not Ready, then it is removed."""
        await asyncio.sleep(after)
        pod = self._store["pods"].get(key)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        pod["status"].update(self._pod_status(False, stopped=True))
        self._put("pods", pod, "MODIFIED")
        self._put("pods", pod, "DELETED")

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
        in ``namespace`` (None: every namespace / cluster-scoped), like an RBAC rule."""
        self._allowed.add((user, verb, resource, namespace))

    AGENT_RULES: tuple[tuple[str, str, str | None], ...] = (
        ("get", "pods", ""), ("list", "pods", ""), ("watch", "pods", ""),
        ("delete", "pods", ""), ("create", "events", "default"),
        ("patch", "nodes/status", None))
    """What k3s-manifests/rbac.yaml grants the agent, as (verb, resource, namespace);
    ``""`` is the Flannel namespace (tests/remediation/test_manifests.py keeps it equal)."""

    def allow_agent(self, user: str, namespace: str = "kube-flannel") -> None:
        """Grant :attr:`AGENT_RULES`."""
        for verb, resource, where in self.AGENT_RULES:
            self.allow(user, verb, resource, namespace if where == "" else where)

    def deny(self, user: str, verb: str, resource: str, namespace: str | None = None) -> None:
        self._allowed.discard((user, verb, resource, namespace))

    def fail(self, status: int, *, times: int = 1, retry_after: float | None = None,
             method: str | None = None, path: str | None = None,
             query: str | None = None) -> Fault:
        fault = Fault(status=status, retry_after=retry_after, times=times, method=method,
                      path=path, query=query)
        self._faults.append(fault)
        return fault

    def slow(self, delay: float, *, times: int = 1, method: str | None = None,
             path: str | None = None, query: str | None = None) -> Fault:
        fault = Fault(delay=delay, times=times, method=method, path=path, query=query)
        self._faults.append(fault)
        return fault

    def before(self, call: Callable[[], object], *, times: int = 1, method: str | None = None,
               path: str | None = None, query: str | None = None) -> Fault:
        """Run ``call`` just before matching requests are handled (a race made exact)."""
        fault = Fault(call=call, times=times, method=method, path=path, query=query)
        self._faults.append(fault)
        return fault

    def permitted(self, user: str, verb: str, resource: str, namespace: str | None) -> bool:
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
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
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
                    if fault.call is not None:
                        fault.call()
                    if fault.delay:
                        await asyncio.sleep(fault.delay)
                    if fault.status:
                        status = fault.status
                        return self._injected(fault)
                    break
            denied = self._authorize(request, user)
            if denied is not None:
                status = 403
                return denied
            try:
                resp: web.StreamResponse = await handler(request)
            except ApiError as err:
                resp = _status(err.code, err.reason, err.message, **err.details)
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

    @staticmethod
    def _injected(fault: Fault) -> web.Response:
        reasons = {429: ("TooManyRequests", "Too many requests, please try again later."),
                   500: ("InternalError", "Internal error occurred: injected"),
                   503: ("ServiceUnavailable", "the server is currently unable to handle "
                         "the request"),
                   504: ("Timeout", "the server was unable to return a response in the "
                         "time allotted, but may still be processing the request")}
        reason, message = reasons.get(fault.status, ("InternalError",
                                                     f"injected {fault.status}"))
        details = ({"retryAfterSeconds": math.ceil(fault.retry_after)}
                   if fault.retry_after is not None else {})
        injected = _status(fault.status, reason, message, **details)
        if fault.retry_after is not None:
            injected.headers["Retry-After"] = f"{fault.retry_after:g}"
        return injected

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
        target = parse_path(request.path)
        if target is None:
            verb = request.method.lower()
            allowed = verb == "get" and any(request.path == p or request.path.startswith(
                p + "/") for p in DISCOVERY_PATHS)
            attrs = Attributes(user, verb, path=request.path, allowed=allowed)
        else:
            request[TARGET] = target
            verb = verb_of(request.method, target, request.query)
            allowed = ((target.group, target.resource) in SELF_REVIEWS and verb == "create"
                       ) or self.permitted(user, verb, target.full, target.namespace)
            attrs = Attributes(user, verb, target.full, target.namespace, target.name,
                               target.group, allowed=allowed)
            self.authorized.append(attrs)
        if allowed:
            return None
        message, details = forbidden_message(attrs)
        return _status(403, "Forbidden", message, **details)

    # --- routing -----------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        target = request.get(TARGET)
        if target is None:
            return self._non_resource(request)
        resource = discovery.find(target.group, target.version, target.full)
        if resource is None:
            raise ApiError(404, "NotFound", "the server could not find the requested "
                           "resource")
        if resource.namespaced and target.name and target.namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested "
                           "resource")
        if not resource.namespaced and target.namespace is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested "
                           "resource")
        verb = verb_of(request.method, target, request.query)
        if verb not in resource.verbs:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method "
                           "on the requested resource")
        if target.group:
            return await self._review(request, target)
        if verb in ("list", "watch"):
            return await self._list(request, target, watch=verb == "watch")
        if verb == "get":
            return self._answer(request, target.resource, self._get(target))
        if verb == "delete":
            return await self._delete_pod(request, target)
        if verb == "create":
            return await self._post_event(request, target)
        return await self._patch_node_status(request, target)

    def _non_resource(self, request: web.Request) -> web.Response:
        path = request.path.rstrip("/") or "/"
        if path == "/version":
            return web.json_response(discovery.version_info(self.version))
        if path == "/api":
            return web.json_response(discovery.api_versions(request.host))
        if path == "/apis":
            return web.json_response(discovery.api_groups())
        parts = path.strip("/").split("/")
        found: Obj | None = None
        if parts == ["api", "v1"]:
            found = discovery.resource_list("", "v1")
        elif parts[0] == "apis" and len(parts) == 2:
            found = discovery.api_group(parts[1])
        elif parts[0] == "apis" and len(parts) == 3:
            found = discovery.resource_list(parts[1], parts[2])
        elif path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if found is None:
            raise ApiError(404, "NotFound", "the server could not find the requested "
                           "resource")
        return web.json_response(found)

    def _get(self, target: Target) -> Obj:
        obj = self._store[target.resource].get((target.namespace or "", target.name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{target.resource} "{target.name}" not found',
                           name=target.name, kind=target.resource)
        return obj

    def _answer(self, request: web.Request, resource: str, obj: Obj,
                status: int = 200) -> web.Response:
        version = discovery.wants_table(request.headers.get("Accept", ""))
        if version is None:
            return web.json_response(obj, status=status)
        return web.json_response(discovery.table(
            resource, [obj], version=version,
            resource_version=obj["metadata"].get("resourceVersion", ""),
            include=request.query.get("includeObject", "Metadata"), now=datetime.now(UTC)),
            status=status)

    # --- list and watch ----------------------------------------------------------------

    async def _list(self, request: web.Request, target: Target, *,
                    watch: bool) -> web.StreamResponse:
        query = request.query
        try:
            labels = parse_labels(query.get("labelSelector", ""))
            fields = parse_fields(query.get("fieldSelector", ""), target.resource)
        except SelectorError as err:
            raise ApiError(400, "BadRequest", str(err)) from err
        namespace = target.namespace

        def selected(obj: Obj) -> bool:
            meta = obj["metadata"]
            return ((namespace is None or meta.get("namespace") == namespace)
                    and labels_match(labels, meta.get("labels") or {})
                    and fields_match(fields, obj))

        since = _parse_rv(query.get("resourceVersion", ""))
        if since is not None and since > self._rv:
            raise ApiError(504, "Timeout", f"Too large resource version: {since}, current: "
                           f"{self._rv}", causes=[{"reason": "ResourceVersionTooLarge",
                                                   "message": "Too large resource version"}],
                           retryAfterSeconds=1)
        if watch:
            return await self._watch(request, target.resource, namespace, selected, since)
        items = sorted((o for o in self._store[target.resource].values() if selected(o)),
                       key=lambda o: (o["metadata"].get("namespace", ""),
                                      o["metadata"]["name"]))
        list_rv, start = str(self._rv), 0
        if token := query.get("continue"):
            list_rv, start = self._continue_from(token)
        meta: Obj = {"resourceVersion": list_rv}
        limit = int(query.get("limit") or 0)
        page = items[start:start + limit] if limit > 0 else items[start:]
        if limit > 0 and start + limit < len(items):
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": int(list_rv), "start": start + limit}).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        table = discovery.wants_table(request.headers.get("Accept", ""))
        if table is not None:
            body = discovery.table(target.resource, page, version=table,
                                   resource_version=list_rv,
                                   include=query.get("includeObject", "Metadata"),
                                   now=datetime.now(UTC))
            body["metadata"].update(meta)
            return web.json_response(body)
        return web.json_response({"kind": f"{discovery.KINDS[target.resource]}List",
                                  "apiVersion": "v1",
                                  "metadata": meta, "items": [copy.deepcopy(o) for o in page]})

    def _continue_from(self, token: str) -> tuple[str, int]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            rv, start = int(data["rv"]), int(data["start"])
        except (ValueError, KeyError, TypeError, binascii.Error) as err:
            raise ApiError(400, "BadRequest", "continue key is not valid: "
                           f"{type(err).__name__}") from err
        if rv < self._compacted:
            raise ApiError(410, "Expired", "The provided continue parameter is too old to "
                           "display a consistent list result. You can start a new list "
                           "without the continue parameter.")
        return str(rv), start

    def _expired(self, since: int) -> Obj:
        return status_body(410, "Expired",
                           f"too old resource version: {since} ({self._compacted})")

    async def _watch(  # noqa: PLR0915 - one stream's whole life, read top to bottom
            self, request: web.Request, resource: str, namespace: str | None,
            selected: Callable[[Obj], bool], since: int | None) -> web.StreamResponse:
        query = request.query
        try:
            timeout = float(query.get("timeoutSeconds") or 1800)
        except ValueError as err:
            raise ApiError(400, "BadRequest", "timeoutSeconds: not a number") from err
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        initial = query.get("sendInitialEvents") in ("true", "1")
        if initial and not (bookmarks and query.get("resourceVersionMatch") == "NotOlderThan"):
            raise ApiError(422, "Invalid", "sendInitialEvents needs allowWatchBookmarks=true "
                           "and resourceVersionMatch=NotOlderThan")
        table = discovery.wants_table(request.headers.get("Accept", ""))

        def frame(kind_: str, obj: Obj) -> bytes:
            if table is not None and kind_ in ("ADDED", "MODIFIED", "DELETED"):
                obj = discovery.table(resource, [obj], version=table,
                                      resource_version=obj["metadata"]["resourceVersion"],
                                      include=query.get("includeObject", "Metadata"),
                                      now=datetime.now(UTC))
            return json.dumps({"type": kind_, "object": obj}).encode() + b"\n"

        def bookmark(**annotations: str) -> bytes:
            meta: Obj = {"resourceVersion": str(self._rv)}
            if annotations:
                meta["annotations"] = annotations
            return frame("BOOKMARK", {"kind": discovery.KINDS[resource], "apiVersion": "v1",
                                      "metadata": meta})

        # Registering and reading the history happen without an await in between: no
        # change can fall between the replay and the live stream.
        watcher = _Watcher(resource, namespace)
        self._watchers.append(watcher)
        if since is None or initial:
            backlog = [("ADDED", copy.deepcopy(o)) for o in self._store[resource].values()
                       if selected(o)]
            expired = None
        elif since < self._compacted:
            backlog, expired = [], self._expired(since)
        else:
            backlog = [(k, o) for rv, r, k, o in self._history
                       if r == resource and rv > since and selected(o)]
            expired = None
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await resp.prepare(request)
            request[WATCHING] = True
            self.requests.append(Logged(request.method, request.path, request.query_string,
                                        request[USER], 200))
            if expired is not None:
                await resp.write(frame("ERROR", expired))
                return resp
            for kind_, obj in backlog:
                await resp.write(frame(kind_, obj))
            if initial:
                await resp.write(bookmark(**{"k8s.io/initial-events-end": "true"}))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while (left := deadline - loop.time()) > 0:
                wait = min(left, self.bookmark_interval) if bookmarks else left
                try:
                    kind_, obj = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks:
                        await resp.write(bookmark())
                    continue
                if kind_ == "CLOSE":
                    break
                if kind_ == "EXPIRE":
                    await resp.write(frame("ERROR", self._expired(
                        int(obj.get("since", self._compacted - 1)))))
                    break
                if selected(obj):
                    await resp.write(frame(kind_, obj))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.remove(watcher)
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

    # --- pods --------------------------------------------------------------------------

    @staticmethod
    async def _body(request: web.Request) -> Obj:
        if not request.can_read_body:
            return {}
        raw = await request.read()
        kind = request.content_type
        if raw.strip() and not (kind in ("application/json", "application/octet-stream")
                                or (kind.startswith("application/") and kind.endswith("+json"))):
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an "
                           "unknown format - accepted media types include: application/json")
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as err:
            raise ApiError(400, "BadRequest", f"the body of the request is not valid "
                           f"JSON: {err}") from err
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of the request must be an object")
        return body

    @staticmethod
    def _dry_run(request: web.Request, options: Obj) -> bool:
        values = request.query.getall("dryRun", []) + list(options.get("dryRun") or [])
        for value in values:
            if value != "All":
                raise ApiError(400, "BadRequest", f'Invalid dry run value: "{value}"; '
                               'the only valid value is "All"')
        return bool(values)

    async def _delete_pod(self, request: web.Request, target: Target) -> web.Response:
        options = await self._body(request)
        dry_run = self._dry_run(request, options)
        pod = self._get(target)
        name = target.name
        raw_grace = request.query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
        try:
            asked = None if raw_grace is None else int(raw_grace)
        except (TypeError, ValueError) as err:
            raise ApiError(400, "BadRequest", f"gracePeriodSeconds: {raw_grace!r} is not "
                           "an integer") from err
        if asked is not None and asked < 0:
            raise ApiError(422, "Invalid", f"DeleteOptions.meta.k8s.io is invalid: "
                           f"gracePeriodSeconds: Invalid value: {asked}: must be >= 0")
        policy = request.query.get("propagationPolicy", options.get("propagationPolicy"))
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError(422, "Invalid", f"DeleteOptions.meta.k8s.io is invalid: "
                           f"propagationPolicy: Unsupported value: {policy!r}")
        conditions = options.get("preconditions") or {}
        meta = pod["metadata"]
        for field_, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            want = conditions.get(field_)
            if want is not None and want != meta[field_]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods '
                               f'"{name}": Precondition failed: {label} in precondition: '
                               f'{want}, {label} in object meta: {meta[field_]}',
                               name=name, kind="pods")
        spec_grace = int(pod["spec"].get("terminationGracePeriodSeconds", self.grace))
        grace = spec_grace if asked is None else asked
        if not pod["spec"].get("nodeName") or pod["status"].get("phase") in ("Failed",
                                                                             "Succeeded"):
            grace = 0
        now = datetime.now(UTC)
        answer = copy.deepcopy(pod)
        pending = meta.get("deletionTimestamp")
        if pending:
            # already Terminating: only a shorter grace period changes anything
            left = (datetime.strptime(pending, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                    - now).total_seconds()
            if grace >= max(0.0, left) and grace != 0:
                if not dry_run:
                    self._record_deletion(request, answer)
                return self._answer(request, "pods", answer)
        answer["metadata"]["deletionTimestamp"] = _stamp(now + timedelta(seconds=grace))
        answer["metadata"]["deletionGracePeriodSeconds"] = grace
        if dry_run:
            return self._answer(request, "pods", answer)
        self._record_deletion(request, answer)
        meta["deletionTimestamp"] = answer["metadata"]["deletionTimestamp"]
        meta["deletionGracePeriodSeconds"] = grace
        key = (target.namespace or "", name)
        if grace == 0:
            self._put("pods", pod, "DELETED")
        else:
            self._put("pods", pod, "MODIFIED")
            self._spawn(self._terminate(key, meta["uid"], min(float(grace), self.stop_delay)))
        answer = copy.deepcopy(pod)
        if not pending:
            owner = (meta.get("ownerReferences") or [{}])[0].get("name")
            for ds in self._daemonsets:
                if ds.namespace == key[0] and ds.name == owner:
                    self._spawn(self._replace(ds, answer))
        return self._answer(request, "pods", answer)

    def _record_deletion(self, request: web.Request, pod: Obj) -> None:
        self.deletions.append(copy.deepcopy(pod))
        self.deleted_by.append(request[USER])

    # --- events ------------------------------------------------------------------------

    async def _post_event(self, request: web.Request, target: Target) -> web.Response:
        ns = target.namespace or ""
        event = await self._body(request)
        dry_run = self._dry_run(request, {})
        involved = event.get("involvedObject")
        problems = []
        if not isinstance(involved, dict):
            problems.append("involvedObject: Required value")
            involved = {}
        if not event.get("reason"):
            problems.append("reason: Required value")
        if not involved.get("kind") or not involved.get("name"):
            problems.append("involvedObject.kind, involvedObject.name: Required value")
        if not involved.get("namespace") and ns not in ("", "default"):
            problems.append(f"involvedObject.namespace: Invalid value: \"\": does not match "
                            f"event.namespace {ns!r}")
        if event.get("type") not in (None, "Normal", "Warning"):
            problems.append(f"type: Unsupported value: {event.get('type')!r}")
        meta = event.setdefault("metadata", {})
        if meta.get("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does "
                           "not match the namespace sent on the request")
        if not meta.get("name") and not meta.get("generateName"):
            problems.append("metadata.name: Required value: name or generateName is required")
        if problems:
            raise ApiError(422, "Invalid", f'Event "{meta.get("name", "")}" is invalid: '
                           + ", ".join(problems), kind="Event")
        for stamp in ("firstTimestamp", "lastTimestamp"):
            if event.get(stamp):
                event[stamp] = _wire_time(event[stamp], f"Event.{stamp}")
        meta["namespace"] = ns
        if not meta.get("name"):
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(NAME_CHARS) for _ in range(5))
        if ("events" in self._store and (ns, meta["name"]) in self._store["events"]):
            raise ApiError(409, "AlreadyExists", f'events "{meta["name"]}" already exists',
                           name=meta["name"], kind="events")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        event.setdefault("apiVersion", "v1")
        event.setdefault("kind", "Event")
        if not dry_run:
            self._put("events", event, "ADDED")
        return web.json_response(event, status=201)

    # --- nodes -------------------------------------------------------------------------

    async def _patch_node_status(self, request: web.Request, target: Target) -> web.Response:
        node = self._get(target)
        kind = request.content_type
        if kind not in ("application/strategic-merge-patch+json",
                        "application/merge-patch+json"):
            raise ApiError(415, "UnsupportedMediaType",
                           f"the body of the request was in an unknown format - accepted "
                           f"media types include: application/strategic-merge-patch+json, "
                           f"application/merge-patch+json (got {kind})")
        patch = await self._body(request)
        try:
            conditions = patch["status"]["conditions"]
            if not isinstance(conditions, list) or not all(
                    isinstance(c, dict) and "type" in c for c in conditions):
                raise TypeError("conditions must be a list of objects with a type")
        except (KeyError, TypeError) as err:
            raise ApiError(422, "Invalid", f"unsupported patch: {err}") from err
        for cond in conditions:
            for stamp in ("lastHeartbeatTime", "lastTransitionTime"):
                if cond.get(stamp):
                    cond[stamp] = _wire_time(cond[stamp], f"NodeCondition.{stamp}")
        if self._dry_run(request, {}):
            return web.json_response(node)
        if kind == "application/merge-patch+json":
            node["status"]["conditions"] = conditions
        else:
            by_type = {c["type"]: c for c in node["status"]["conditions"]}
            for cond in conditions:
                by_type[cond["type"]] = {**by_type.get(cond["type"], {}), **cond}
            node["status"]["conditions"] = list(by_type.values())
        self._put("nodes", node, "MODIFIED")
        return web.json_response(node)

    def condition(self, node: str, kind: str) -> Obj | None:
        for cond in self.node(node)["status"]["conditions"]:
            if cond["type"] == kind:
                return dict(cond)
        return None

    # --- self reviews ------------------------------------------------------------------

    def _groups(self, user: str) -> list[str]:
        if user.startswith("system:serviceaccount:"):
            namespace = user.split(":")[2]
            return ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                    "system:authenticated"]
        return ["system:authenticated"]

    async def _review(self, request: web.Request, target: Target) -> web.Response:
        user = request[USER]
        if request.content_type == "application/vnd.kubernetes.protobuf":
            try:
                body = protobuf.decode_review(await request.read())
            except (protobuf.ProtobufError, UnicodeDecodeError) as err:
                raise ApiError(400, "BadRequest", f"the body of the request is not a "
                               f"valid protobuf object: {err}") from err
        else:
            body = await self._body(request)
        spec = body.get("spec") or {}
        if target.resource == "selfsubjectreviews":
            return web.json_response({
                "kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": None},
                "status": {"userInfo": {"username": user, "groups": self._groups(user)}}},
                status=201)
        if target.resource == "selfsubjectrulesreviews":
            namespace = spec.get("namespace") or ""
            rules = sorted({(verb, resource) for u, verb, resource, ns in self._allowed
                            if u == user and ns in (None, namespace)})
            resources: dict[str, list[str]] = {}
            for verb, resource in rules:
                resources.setdefault(resource, []).append(verb)
            status: Obj = {
                "resourceRules": [{"verbs": ["create"], "apiGroups": [g],
                                   "resources": [r]} for g, r in sorted(SELF_REVIEWS)]
                + [{"verbs": verbs, "apiGroups": [""], "resources": [resource]}
                   for resource, verbs in sorted(resources.items())],
                "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": [
                    p + suffix for p in DISCOVERY_PATHS for suffix in ("", "/*")]}],
                "incomplete": False}
        else:
            attributes = spec.get("resourceAttributes")
            plain = spec.get("nonResourceAttributes")
            if attributes:
                resource = attributes.get("resource", "")
                if attributes.get("subresource"):
                    resource += "/" + attributes["subresource"]
                group = attributes.get("group", "")
                verb = attributes.get("verb", "")
                allowed = ((group, resource) in SELF_REVIEWS and verb == "create") or (
                    group == "" and self.permitted(user, verb, resource,
                                                   attributes.get("namespace") or None))
            elif plain:
                allowed = plain.get("verb") == "get" and any(
                    plain.get("path", "") == p or str(plain.get("path", "")).startswith(
                        p + "/") for p in DISCOVERY_PATHS)
            else:
                raise ApiError(422, "Invalid", "SelfSubjectAccessReview.authorization.k8s.io "
                               '"" is invalid: spec.resourceAttributes: Invalid value: '
                               '"null": exactly one of nonResourceAttributes or '
                               "resourceAttributes must be specified")
            status = {"allowed": allowed}
            if allowed:
                status["reason"] = "allowed by the stand-in's permission table"
        kind = ("SelfSubjectRulesReview" if target.resource == "selfsubjectrulesreviews"
                else "SelfSubjectAccessReview")
        return web.json_response({"kind": kind, "apiVersion": "authorization.k8s.io/v1",
                                  "metadata": {"creationTimestamp": None}, "spec": spec,
                                  "status": status}, status=201)
