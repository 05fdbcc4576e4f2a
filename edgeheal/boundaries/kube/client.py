"""The Kubernetes API client: this node's Flannel pods, Events on the Node, its condition.

Why a narrow client: the actor and the pod remedy need six calls, each of which must be
bounded, retried politely and reported precisely, and none of which may ever leak the
token. lightkube (imported lazily, only when ``[kubernetes]`` is configured) loads a
kubeconfig — client certificate or bearer token, custom CA, embedded ``*-data`` or files, as
K3s writes them — or the in-cluster service account (token file re-read on 401), and
builds the TLS-configured HTTP client. The calls themselves are plain REST on that client
because lightkube's ``delete`` cannot send ``DeleteOptions.preconditions`` and because one
request function gives every call the same timeout, retry and error policy:

- every call has ``[kubernetes] request_timeout``; a watch has an overall deadline;
- 429 is retried after ``Retry-After`` (capped), 5xx and transport errors/timeouts with
  exponential backoff and full jitter, at most ``[kubernetes] retries`` times;
- 401 and 403 are never retried (:class:`~.errors.KubePermissionError`);
- the token is only ever inside the HTTP client's auth object: no log line, error or repr
  here contains a header (:mod:`.errors` describes failures without it), and a token is
  checked before it is used (:func:`~.credentials.token_problem`).

Pod safety: :meth:`KubeClient.delete_pod` re-reads the pod and refuses unless it is still
on this node with the same uid (one already Terminating is left to finish, never deleted
again), then deletes with ``preconditions.uid`` so a pod that was
replaced in between is never deleted by mistake (409 -> :class:`~.errors.KubeConflict`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from edgeheal.base import compat
from edgeheal.base.bare_import import skip_init
from edgeheal.base.compat import UTC
from edgeheal.boundaries.kube.credentials import current_token_check
from edgeheal.boundaries.kube.errors import (
    KubeConflict,
    KubeError,
    KubeNotFound,
    KubePermissionError,
    _permission,
    _retry_after,
    _status_message,
    _transport_problem,
)
from edgeheal.boundaries.kube.pod import Pod
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


def _utcnow() -> datetime:
    return datetime.now(UTC)


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
            import httpx2

            # only the kubeconfig loader and the client adapter; lightkube's __init__ would
            # add its own clients and resources for nothing (docs/footprint.md)
            skip_init("lightkube")
            from lightkube.config import client_adapter
            from lightkube.config.kubeconfig import KubeConfig
            from lightkube.core.exceptions import ConfigError

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
                        and (problem := current_token_check()(config.user.token)):
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
        import httpx2

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
        import httpx2

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
                async with compat.timeout(left):
                    async for kind, pod in self.watch_pods(namespace, label_selector, node,
                                                           version, left):
                        if kind in ("ADDED", "MODIFIED") and pod.uid != old_uid \
                                and not pod.deleting:
                            last = pod
                            if pod.ready and pod.phase == "Running":
                                return pod
            except compat.TimeoutErrors:
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

