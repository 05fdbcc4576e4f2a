"""The client's calls about this node: an Event on the Node, one Node condition, and the
two heartbeats the ``control`` check reads (the node's Lease, the Node's ``Ready``).

Why apart from the pod calls: they are the reporting half of the client (what
``kubectl describe node`` shows of edgeheal) and its reading of the control plane's view
of this node, use cluster-scoped, ``default``- and ``kube-node-lease``-namespace
permissions of their own, and go through the one :meth:`KubeClient.request` like every
other call, which :class:`NodeCalls` leaves to the client. The reads keep only the few
fields the check decides on (:class:`Lease`, :class:`NodeView`): a Node object is several
kB (``status.images``) and none of the rest is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from edgeheal.boundaries.kube.answers import items, mapping, text
from edgeheal.model import rfc3339

EVENT_NAMESPACE = "default"
"""Where Node events go (as kubelet's do): Nodes are cluster-scoped."""
COMPONENT = "edgeheal"
LEASE_NAMESPACE = "kube-node-lease"
"""Where kubelet keeps each node's heartbeat Lease (named after the node)."""
PUBLIC_IP = "flannel.alpha.coreos.com/public-ip"
PUBLIC_IP_OVERWRITE = "flannel.alpha.coreos.com/public-ip-overwrite"


@dataclass(frozen=True, slots=True)
class Lease:
    """The node's heartbeat as the API server holds it."""

    holder: str
    duration: int
    """``leaseDurationSeconds`` (kubelet: 40)."""
    renew_time: str
    """``renewTime`` as written (compared for change, never against a clock)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any], what: str) -> Lease:
        spec = mapping(data.get("spec"), what, "spec")
        duration = spec.get("leaseDurationSeconds")
        return cls(text(spec.get("holderIdentity"), what, "spec.holderIdentity"),
                   duration if type(duration) is int and duration > 0 else 40,
                   text(spec.get("renewTime"), what, "spec.renewTime"))


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the control check reads of the Node: ``Ready`` and the node's addresses."""

    ready: str
    """``True``, ``False``, ``Unknown`` (``""``: no Ready condition)."""
    ready_reason: str
    ready_message: str
    internal_ips: tuple[str, ...]
    external_ips: tuple[str, ...]
    public_ip: str
    """Flannel's ``public-ip`` annotation ("" without one, or when an operator overrode it
    with ``public-ip-overwrite``: then it need not be a local address)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any], what: str) -> NodeView:
        meta = mapping(data.get("metadata"), what, "metadata")
        notes = mapping(meta.get("annotations"), what, "metadata.annotations")
        status = mapping(data.get("status"), what, "status")
        ready = reason = message = ""
        for i, raw in enumerate(items(status.get("conditions"), what, "status.conditions")):
            cond = mapping(raw, what, f"status.conditions[{i}]", optional=False)
            if cond.get("type") == "Ready":
                ready = text(cond.get("status"), what, "the Ready condition's status")
                reason = text(cond.get("reason"), what, "the Ready condition's reason")
                message = text(cond.get("message"), what, "the Ready condition's message")
        found: dict[str, list[str]] = {"InternalIP": [], "ExternalIP": []}
        for i, raw in enumerate(items(status.get("addresses"), what, "status.addresses")):
            address = mapping(raw, what, f"status.addresses[{i}]", optional=False)
            kind = text(address.get("type"), what, f"status.addresses[{i}].type")
            if kind in found:
                found[kind].append(text(address.get("address"), what,
                                        f"status.addresses[{i}].address"))
        public = "" if notes.get(PUBLIC_IP_OVERWRITE) else text(
            notes.get(PUBLIC_IP), what, f"the {PUBLIC_IP} annotation")
        return cls(ready, reason[:200], message[:300], tuple(found["InternalIP"]),
                   tuple(found["ExternalIP"]), public)


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

    async def get_lease(self, node: str) -> Lease:
        """The node's heartbeat Lease (``kube-node-lease/<node>``)."""
        data = await self.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node}",
            what=f"get leases.coordination.k8s.io in namespace {LEASE_NAMESPACE}")
        return Lease.from_json(data, f"lease {LEASE_NAMESPACE}/{node}")

    async def get_node(self, node: str) -> NodeView:
        """This node's ``Ready`` condition and addresses."""
        data = await self.request("GET", f"/api/v1/nodes/{node}",
                                  what="get nodes (cluster-scoped)")
        return NodeView.from_json(data, f"node {node}")

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

