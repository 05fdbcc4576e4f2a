"""Fault injection: the API server's bad moments, on demand and counted.

Why: the agent's client must survive what a loaded or restarting API server does — 429
``TooManyRequests`` with ``Retry-After`` (API Priority and Fairness), 500, 503 and 504
with the API server's own ``Status`` wording — and a race is only testable when it happens
at an exact moment. So a test arms a :class:`Fault` for the next ``times`` requests that
match a method, a path and a query: :meth:`Faults.fail` answers in place of the handler,
:meth:`Faults.slow` waits first, :meth:`Faults.before` runs a change just before the
request is handled (e.g. the pod recreated under the same name before a DELETE). Faults
act after authentication and before authorization, as a real server's overload does.

And what no real server sends but a broken proxy, a bug or an attacker in the path can
(issue 27): :meth:`Faults.answer` sends a fixed body of any shape (a JSON list where an
object belongs, nesting 100,000 deep, bytes that are not JSON), :meth:`Faults.stream`
streams chunks from a generator as they are made (a watch whose line never ends, tens of
megabytes without holding them), and :meth:`Faults.crowd` plays a lax server that ignores
``fieldSelector`` on a pod list with tens of thousands of pods on other nodes (honouring
``limit``/``continue``, or ignoring it too and sending them in one answer).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from edgeheal.lab.kubeapi.selectors import SelectorError, labels_match, parse_labels
from edgeheal.lab.kubeapi.wire import error_response

Chunks = Callable[[web.Request], Iterable[bytes]]
"""What a streamed fault sends: chunks made from the request, written as they come."""


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
    chunks: Chunks | None = None
    """The answer's body, streamed (with ``status``, default 200)."""

    def matches(self, request: web.Request) -> bool:
        return (self.times > 0 and (self.method is None or request.method == self.method)
                and (self.path is None or re.search(self.path, request.path) is not None)
                and (self.query is None
                     or re.search(self.query, request.query_string) is not None))



class Faults:
    """The armed faults, first match wins (see the module docstring)."""

    def _setup_faults(self) -> None:
        self._faults: list[Fault] = []

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

    def answer(self, body: bytes | object, *, status: int = 200, times: int = 1,
               method: str | None = None, path: str | None = None,
               query: str | None = None) -> Fault:
        """Answer matching requests with ``body`` (bytes as they are, anything else as
        JSON), whatever its shape, with ``status``."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.stream(lambda _request: (data,), status=status, times=times,
                           method=method, path=path, query=query)

    def stream(self, chunks: Chunks, *, status: int = 200, times: int = 1,
               method: str | None = None, path: str | None = None,
               query: str | None = None) -> Fault:
        """Answer matching requests by streaming ``chunks(request)`` (a watch or a list
        that never ends, or a huge one made as it is sent); stops when the client goes."""
        fault = Fault(status=status, chunks=chunks, times=times, method=method, path=path,
                      query=query)
        self._faults.append(fault)
        return fault

    def crowd(self, pods: int, *, paged: bool = True, times: int = 1_000_000,
              namespace: str | None = None) -> Fault:
        """Pod lists as a lax server answers them: ``fieldSelector`` ignored, so ``pods``
        pods on other nodes come before the real ones (the label selector still holds);
        ``paged``: ``limit``/``continue`` honoured, else everything in one answer."""
        def chunks(request: web.Request) -> Iterator[bytes]:
            yield from self._crowded(request, pods, paged=paged)

        where = rf"/namespaces/{re.escape(namespace)}/pods$" if namespace else r"/pods$"
        return self.stream(chunks, times=times, method="GET", path=where,
                           query=r"^(?!.*watch=(true|1))")

    def _crowded(self, request: web.Request, pods: int, *, paged: bool) -> Iterator[bytes]:
        store: dict[str, dict[str, dict[str, Any]]] = self._store  # type: ignore[attr-defined]
        try:
            labels = parse_labels(request.query.get("labelSelector", ""))
            start = (int(json.loads(base64.urlsafe_b64decode(request.query["continue"])))
                     if request.query.get("continue") else 0)
        except (SelectorError, ValueError, TypeError, binascii.Error):
            start = pods + len(store["pods"]) + 1  # a bad token: an empty page
        limit = int(request.query.get("limit") or 0) if paged else 0
        scoped = re.search(r"/namespaces/([^/]+)/pods$", request.path)
        real = [o for o in store["pods"].values()
                if labels_match(labels, o["metadata"].get("labels") or {})
                and (scoped is None or o["metadata"].get("namespace") == scoped.group(1))]
        total = pods + len(real)
        end = min(total, start + limit) if limit > 0 else total
        meta: dict[str, Any] = {"resourceVersion": "1"}
        if end < total:
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(end).encode()).decode()
        yield b'{"kind":"PodList","apiVersion":"v1","metadata":' + json.dumps(meta).encode() \
            + b',"items":['
        batch: list[bytes] = []
        for i in range(start, end):
            obj = _stranger(i) if i < pods else real[i - pods]
            batch.append(json.dumps(obj).encode())
            if len(batch) == 500:
                yield (b"," if i >= start + 500 else b"") + b",".join(batch)
                batch = []
        if batch:
            yield (b"," if end - start > len(batch) else b"") + b",".join(batch)
        yield b"]}"

    async def _inject(self, request: web.Request) -> web.StreamResponse | None:
        """Play the first fault matching ``request``: the answer in place of the
        handler's, or None to go on."""
        for fault in self._faults:
            if fault.matches(request):
                fault.times -= 1
                if fault.call is not None:
                    fault.call()
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.chunks is not None:
                    return await self._streamed(request, fault)
                if fault.status:
                    return self._injected(fault)
                break
        return None

    @staticmethod
    async def _streamed(request: web.Request, fault: Fault) -> web.StreamResponse:
        assert fault.chunks is not None  # noqa: S101 - checked by the caller
        resp = web.StreamResponse(status=fault.status or 200,
                                  headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        try:
            for chunk in fault.chunks(request):
                await resp.write(chunk)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client gave up (refused the answer): what the test wants
        return resp

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
        injected = error_response(fault.status, reason, message, **details)
        if fault.retry_after is not None:
            injected.headers["Retry-After"] = f"{fault.retry_after:g}"
        return injected


def _stranger(i: int) -> dict[str, Any]:
    """Pod ``i`` of a crowd: a Flannel pod on another node, about as big as a real one."""
    name = f"kube-flannel-ds-crowd{i:06d}"
    return {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "kube-flannel", "uid": f"crowd-{i:032d}",
                     "resourceVersion": str(i + 1), "labels": {"app": "flannel",
                                                               "tier": "node"},
                     "creationTimestamp": "2026-01-01T00:00:00Z",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                          "name": "kube-flannel-ds", "controller": True,
                                          "uid": "crowd-daemonset"}]},
        "spec": {"nodeName": f"crowd-node-{i:06d}", "containers": [
            {"name": "kube-flannel", "image": "ghcr.io/flannel-io/flannel:v0.26.7",
             "args": ["--ip-masq", "--kube-subnet-mgr"],
             "resources": {"requests": {"cpu": "100m", "memory": "50Mi"}}}]},
        "status": {"phase": "Running", "podIP": f"10.{i >> 16 & 255}.{i >> 8 & 255}."
                                                 f"{i & 255}",
                   "conditions": [{"type": t, "status": "True",
                                   "lastTransitionTime": "2026-01-01T00:00:05Z"}
                                  for t in ("Initialized", "Ready", "ContainersReady",
                                            "PodScheduled")]},
    }
