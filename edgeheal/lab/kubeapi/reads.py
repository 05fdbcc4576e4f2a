"""List and watch: how a client reads the cluster and then follows it.

Why: the agent finds its Flannel pod by a list and waits for the replacement by a watch,
and both fail in the field in ways a naive stand-in would never show. So lists take the
set-based label selectors and the pods' field selectors, and chunk with ``limit`` and an
opaque ``continue`` token that goes 410 ``Expired`` once its resourceVersion is compacted
away. A watch follows the API server's watch cache: without a resourceVersion it starts
with the current state as ADDED; from a resourceVersion it replays the changes since; one
older than the retained history is an in-stream ``ERROR`` carrying a 410 ``Expired``
Status (not an HTTP error: the stream has already begun); one newer than the store is a
504 ``ResourceVersionTooLarge``. ``timeoutSeconds`` ends it, ``allowWatchBookmarks`` adds
BOOKMARK events every ``bookmark_interval``, and ``sendInitialEvents`` (the streaming list)
closes the initial state with the ``k8s.io/initial-events-end`` bookmark. ``kubectl get``
asks for ``Table`` answers, in lists and watch frames alike.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import json
from collections.abc import Callable
from datetime import datetime

from aiohttp import web

from edgeheal.base import compat
from edgeheal.base.compat import UTC
from edgeheal.lab.kubeapi import discovery
from edgeheal.lab.kubeapi.selectors import (
    SelectorError,
    fields_match,
    labels_match,
    parse_fields,
    parse_labels,
)
from edgeheal.lab.kubeapi.store import Store, _Watcher
from edgeheal.lab.kubeapi.wire import (
    USER,
    WATCHING,
    ApiError,
    Logged,
    Obj,
    Target,
    parse_rv,
    status_body,
)


class Reads(Store):
    """The list and watch handlers (see the module docstring)."""

    bookmark_interval: float
    """Seconds between BOOKMARKs for watches that allow them."""
    requests: list[Logged]
    """The server's request log: a watch enters itself when it begins streaming."""

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

        since = parse_rv(query.get("resourceVersion", ""))
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
                                  "apiVersion": discovery.API_VERSIONS[target.resource],
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
            return frame("BOOKMARK", {"kind": discovery.KINDS[resource],
                                      "apiVersion": discovery.API_VERSIONS[resource],
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
                except compat.TimeoutErrors:
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
