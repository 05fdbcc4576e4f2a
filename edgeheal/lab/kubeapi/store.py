"""The objects and their history: what etcd and the watch cache are to the API server.

Why this is its own part: every change, whoever makes it (a handler, the controller, a
test arranging a race), must go through one door, :meth:`Store._put`, that numbers it
with the next ``resourceVersion``, keeps it in a bounded history and hands it to the open
watches — as the API server does. That is what makes a watch resumable from a
resourceVersion, and what lets a test forget the history (:meth:`Store.compact`, as etcd
compaction does) to drive a client into the 410 ``Expired`` path on purpose.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from dataclasses import dataclass, field

from edgeheal.lab.kubeapi.wire import ApiError, Obj, Target


@dataclass
class _Watcher:
    resource: str
    namespace: str | None
    queue: asyncio.Queue[tuple[str, Obj]] = field(default_factory=asyncio.Queue)


class Store:
    """Pods, nodes, events and leases by ``(namespace, name)``, their changes, the open watches."""

    def _setup_store(self, history: int) -> None:
        self._store: dict[str, dict[tuple[str, str], Obj]] = {
            "pods": {}, "nodes": {}, "events": {}, "leases": {}}
        self._history: deque[tuple[int, str, str, Obj]] = deque(maxlen=history)
        self._compacted = 0
        self._watchers: list[_Watcher] = []
        self._rv = 100

    @property
    def nodes(self) -> dict[str, Obj]:
        return {name: node for (_, name), node in self._store["nodes"].items()}

    @property
    def events(self) -> list[Obj]:
        """Every Event created, oldest first."""
        return list(self._store["events"].values())

    def node(self, name: str) -> Obj:
        return self._store["nodes"][("", name)]

    def pods(self, namespace: str | None = None, node: str | None = None) -> list[Obj]:
        return [copy.deepcopy(p) for (ns, _), p in sorted(self._store["pods"].items())
                if (namespace is None or ns == namespace)
                and (node is None or p["spec"].get("nodeName") == node)]

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

    def _get(self, target: Target) -> Obj:
        obj = self._store[target.resource].get((target.namespace or "", target.name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{target.resource} "{target.name}" not found',
                           name=target.name, kind=target.resource)
        return obj

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
