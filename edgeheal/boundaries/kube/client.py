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
from edgeheal.boundaries.kube.answers import (
    BODY_MAX,
    ERROR_BODY_MAX,
    LIST_LIMIT,
    LIST_PAGES_MAX,
    KubeShapeError,
    decode,
    items,
    mapping,
    read_body,
    read_lines,
    text,
)
from edgeheal.boundaries.kube.credentials import current_token_check
from edgeheal.boundaries.kube.errors import (
    KubeConflict,
    KubeError,
    KubeNotFound,
    KubePermissionError,
    _permission,
    _redact,
    _retry_after,
    _status_message,
    _transport_problem,
)
from edgeheal.boundaries.kube.node import NodeCalls
from edgeheal.boundaries.kube.pod import Pod

if TYPE_CHECKING:
    from edgeheal.config import KubernetesSettings

log = logging.getLogger("edgeheal.kube")  # the name operators grep for

RETRY_AFTER_MAX = 30.0
"""Longest ``Retry-After`` honoured, seconds (a longer one is capped, not obeyed blindly)."""
ATTEMPT_FACTOR = 3
"""One attempt (connect, headers and the whole body) ends after this many
``request_timeout``: a server dripping a body byte by byte cannot hold a call for ever."""
BACKOFF_BASE = 0.2
BACKOFF_MAX = 8.0
QUIET_LOGGERS = ("httpcore2", "httpx2", "h11")
"""The HTTP library's loggers: its debug traces quote exceptions that quote request headers
(the bearer token), so they never log below WARNING once a client exists."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


class KubeClient(NodeCalls):
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
        """One API call; ``what`` is ``(verb, resource, namespace)`` rendered for errors.
        The answer must be a JSON object of at most :data:`~.answers.BODY_MAX` bytes."""
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
                async with compat.timeout(ATTEMPT_FACTOR * self.settings.request_timeout):
                    code, reply, answer = await self._exchange(
                        http, method, path, what, params=params, content=content,
                        headers=headers)
            except (httpx2.TimeoutException, *compat.TimeoutErrors):
                problem: str = f"timed out after {self.settings.request_timeout:g}s"
                status, retry_after = None, None
                cause: Exception = KubeError(problem)
            except httpx2.TransportError as err:
                problem = _transport_problem(err)  # never str(err): it may quote a header
                status, retry_after = None, None
                cause = KubeError(problem)
            else:
                status = code
                if code < 300:
                    data = decode(answer, what, "a body") if answer.strip() else {}
                    if not isinstance(data, dict):
                        raise KubeShapeError(f"{what}: the API answered {code} with a "
                                             "body that is not a JSON object")
                    return data
                message = _status_message(httpx2.Response(code, content=answer),
                                          self._secret())
                if code in (401, 403):
                    raise _permission(code, what, message, self.settings.kubeconfig)
                if code == 404:
                    raise KubeNotFound(f"{what}: not found ({message})", status=404)
                if code == 409:
                    raise KubeConflict(f"{what}: conflict ({message})", status=409)
                if code != 429 and code < 500:
                    raise KubeError(f"{what}: the API answered {code}: {message}",
                                    status=code)
                problem = f"the API answered {code}: {message}"
                retry_after = _retry_after(reply) if code == 429 else None
                cause = KubeError(problem, status=code)
            if attempt >= self.settings.retries:
                raise KubeError(f"{what}: {problem} (gave up after {attempt + 1} attempts)",
                                status=status) from cause
            delay = (min(retry_after, RETRY_AFTER_MAX) if retry_after is not None
                     else self._rng.uniform(0, min(BACKOFF_MAX, BACKOFF_BASE * 2 ** attempt)))
            attempt += 1
            log.info("kubernetes: %s: %s; retry %d/%d in %.2fs", what, problem, attempt,
                     self.settings.retries, delay)
            await self._sleep(delay)

    @staticmethod
    async def _exchange(http: Any, method: str, path: str, what: str, *,
                        params: Mapping[str, str] | None, content: bytes | None,
                        headers: Mapping[str, str]) -> tuple[int, Any, bytes]:
        """One attempt: (status, the response for its headers, the body read within the
        cap; an error answer's only as far as its message needs)."""
        async with http.stream(method, path, params=dict(params or {}), content=content,
                               headers=dict(headers)) as resp:
            failed = resp.status_code >= 300
            answer = await read_body(resp.aiter_bytes(), what,
                                     limit=ERROR_BODY_MAX if failed else BODY_MAX,
                                     declared=resp.headers.get("Content-Length"),
                                     truncate=failed)
            return resp.status_code, resp, answer

    # --- pods ------------------------------------------------------------------------------

    async def list_pods(self, namespace: str, label_selector: str, node: str,
                        ) -> tuple[list[Pod], str]:
        """This node's pods matching the selector, and the list's resourceVersion: asked
        for with both selectors, in pages of :data:`~.answers.LIST_LIMIT` (a lax server
        that ignores the selectors still cannot send one huge answer), at most
        :data:`~.answers.LIST_PAGES_MAX` of them."""
        what = f"list pods in namespace {namespace}"
        params = {"labelSelector": label_selector, "fieldSelector": f"spec.nodeName={node}",
                  "limit": str(LIST_LIMIT)}
        pods: list[Pod] = []
        version = ""
        for _page in range(LIST_PAGES_MAX):
            data = await self.request("GET", f"/api/v1/namespaces/{namespace}/pods",
                                      what=what, params=params)
            await asyncio.sleep(0)  # a page decoded: let the probes in before the next step
            for i, item in enumerate(items(data.get("items"), what, "items")):
                # The server filtered already; filter again so a lax server never widens
                # it, and read no further into another node's pod than its node name.
                where = f"{what}: items[{i}]"
                spec = mapping(mapping(item, where, "the pod", optional=False).get("spec"),
                               where, "spec")
                if text(spec.get("nodeName"), where, "spec.nodeName") == node:
                    pods.append(Pod.from_json(item, where))
            meta = mapping(data.get("metadata"), what, "metadata")
            version = version or text(meta.get("resourceVersion"), what,
                                      "metadata.resourceVersion")
            token = text(meta.get("continue"), what, "metadata.continue")
            if not token:
                return pods, version
            params = {**params, "continue": token}
        raise KubeError(f"{what}: the list did not end within {LIST_PAGES_MAX} pages of "
                        f"{LIST_LIMIT}; refused (is the API server ignoring "
                        "fieldSelector=spec.nodeName?)")

    async def get_pod(self, namespace: str, name: str) -> Pod:
        data = await self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}",
                                  what=f"get pods in namespace {namespace}")
        return Pod.from_json(data, f"get pod {namespace}/{name}")

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
        return (Pod.from_json(data, f"delete pod {pod.ref}") if data.get("kind") == "Pod"
                else current)

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
                    answer = await read_body(resp.aiter_bytes(), what, limit=ERROR_BODY_MAX,
                                             truncate=True)
                    message = _status_message(httpx2.Response(resp.status_code,
                                                              content=answer), self._secret())
                    if resp.status_code in (401, 403):
                        raise _permission(resp.status_code, what, message,
                                          self.settings.kubeconfig)
                    raise KubeError(f"{what}: the API answered {resp.status_code}: "
                                    f"{message}", status=resp.status_code)
                async for line in read_lines(resp.aiter_bytes(), what):
                    event = mapping(decode(line, what, "a watch event"), what, "an event",
                                    optional=False)
                    kind = text(event.get("type"), what, "an event's type")
                    obj = mapping(event.get("object"), what, "an event's object",
                                  optional=False)
                    if kind == "ERROR":
                        said = text(obj.get("message"), what, "the error's message")
                        code = obj.get("code")
                        raise KubeError(f"{what}: {_redact(said[:300], self._secret())}"
                                        if said else f"{what}: watch error",
                                        status=code if type(code) is int else None)
                    if kind == "BOOKMARK":
                        continue
                    pod = Pod.from_json(obj, f"{what}: a {kind} event")
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
