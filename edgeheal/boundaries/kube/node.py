"""The client's calls about this node: an Event on the Node, and one Node condition.

Why apart from the pod calls: they are the reporting half of the client (what
``kubectl describe node`` shows of edgeheal), use cluster-scoped and ``default``-namespace
permissions of their own, and go through the one :meth:`KubeClient.request` like every
other call, which :class:`NodeCalls` leaves to the client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from edgeheal.model import rfc3339

EVENT_NAMESPACE = "default"
"""Where Node events go (as kubelet's do): Nodes are cluster-scoped."""
COMPONENT = "edgeheal"


class NodeCalls:
    """Mixed into :class:`~edgeheal.boundaries.kube.client.KubeClient`."""

    _wall: Callable[[], datetime]

    async def request(self, method: str, path: str, *, what: str,
                      params: Mapping[str, str] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      ) -> dict[str, Any]:
        raise NotImplementedError  # the client's own, with its timeout, retry and errors

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

