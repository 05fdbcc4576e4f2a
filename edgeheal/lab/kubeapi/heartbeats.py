"""The node's heartbeats: its Lease renewed by a stand-in kubelet, its NodeStatus, and the
node lifecycle controller that turns a silent node's ``Ready`` to ``Unknown``.

Why: the ``control`` check tells a K3s agent that has lost its server from one that is
fine by the two heartbeats a real cluster keeps, so the stand-in plays them out as the
real components do (each behaviour from the source named):

- **the Lease** (``coordination.k8s.io/v1``, namespace ``kube-node-lease``, named after the
  node): kubelet's node lease controller (``k8s.io/component-helpers/apimachinery/lease/
  controller.go``, ``newLease``) creates it with ``holderIdentity`` = the node name,
  ``leaseDurationSeconds`` = ``nodeLeaseDurationSeconds`` (40 by default,
  ``pkg/kubelet/apis/config/v1beta1/defaults.go``) and an owner reference to the Node, and
  renews ``renewTime`` (a ``MicroTime``: microseconds on the wire) every
  ``leaseDuration * nodeLeaseRenewIntervalFraction`` = 0.25 x 40 = 10 s
  (``pkg/kubelet/kubelet.go``);
- **NodeStatus**: with leases, kubelet posts the Node's status only when it changed or
  every ``nodeStatusReportFrequency`` (5 min; ``pkg/kubelet/kubelet_node_status.go``,
  ``tryUpdateNodeStatus``): ``Ready`` True ``KubeletReady`` "kubelet is posting ready
  status", or False ``KubeletNotReady`` with the runtime's message;
- **the node lifecycle controller** (``pkg/controller/nodelifecycle/
  node_lifecycle_controller.go``, ``tryUpdateNodeHealth``): it notes *its own* time when it
  sees the lease's ``renewTime`` change (``probeTimestamp``), and when none came for
  ``nodeMonitorGracePeriod`` (40 s in v1.27, 50 s from v1.32) it sets every kubelet
  condition to ``Unknown``, reason ``NodeStatusUnknown``, "Kubelet stopped posting node
  status.", keeping the old ``lastHeartbeatTime``.

A test stops the kubelet's heartbeats (:meth:`Heartbeats.kubelet_stop`: the agent lost
its server, or is stuck), starts them again (:meth:`Heartbeats.kubelet_start`), has the
kubelet report itself not ready (:meth:`Heartbeats.kubelet_not_ready`), or changes the
node's addresses (:meth:`Heartbeats.set_addresses`). Time is compressible: the renew
interval and grace period are parameters (the lab's are seconds, not tens of seconds).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from datetime import datetime

from edgeheal.base.compat import UTC
from edgeheal.lab.kubeapi.controller import Controller
from edgeheal.lab.kubeapi.wire import Obj, stamp

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION = 40
"""kubelet's ``nodeLeaseDurationSeconds`` default."""
RENEW_FRACTION = 0.25
"""kubelet's ``nodeLeaseRenewIntervalFraction``."""


def micro_time(when: datetime | None = None) -> str:
    """A ``metav1.MicroTime`` on the wire (``RFC3339Micro``)."""
    return (when or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Kubelet:
    node: str
    renew: float
    """Seconds between renewals (``leaseDuration * 0.25`` on a real node)."""
    grace: float
    """The lifecycle controller's ``nodeMonitorGracePeriod``, seconds."""
    posting: bool = True
    task: asyncio.Task[None] | None = None


class Heartbeats(Controller):
    """Leases, the stand-in kubelet and the node lifecycle controller (module docstring)."""

    def _setup_heartbeats(self) -> None:
        self._store.setdefault("leases", {})
        self._kubelets: dict[str, _Kubelet] = {}

    def lease(self, node: str) -> Obj:
        return copy.deepcopy(self._store["leases"][(LEASE_NAMESPACE, node)])

    def kubelet_start(self, node: str, *, renew: float = LEASE_DURATION * RENEW_FRACTION,
                      grace: float = 40.0, duration: int = LEASE_DURATION) -> None:
        """Start (or resume) ``node``'s kubelet heartbeats: the lease is created if
        missing and renewed every ``renew`` seconds; the lifecycle controller watches it
        with ``grace``. Resuming posts ``Ready`` True again at once, as kubelet does when
        its status changed."""
        kubelet = self._kubelets.get(node)
        if kubelet is None:
            kubelet = self._kubelets[node] = _Kubelet(node, renew, grace)
        kubelet.posting = True
        if (LEASE_NAMESPACE, node) not in self._store["leases"]:
            meta = self.node(node)["metadata"]
            self._put("leases", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": node, "namespace": LEASE_NAMESPACE,
                             "uid": meta["uid"][::-1],
                             "creationTimestamp": stamp(datetime.now(UTC)),
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                                  "name": node, "uid": meta["uid"]}]},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": duration,
                         "renewTime": micro_time()}}, "ADDED")
        self._renew(node)
        self._post_ready(node, True, "KubeletReady", "kubelet is posting ready status")
        if kubelet.task is None or kubelet.task.done():
            kubelet.task = asyncio.get_running_loop().create_task(self._beat(kubelet))
            self._tasks.add(kubelet.task)
            kubelet.task.add_done_callback(self._tasks.discard)

    def kubelet_stop(self, node: str) -> None:
        """The kubelet stops reaching the server (the agent lost it, or is stuck): no
        renewal, no status; the lifecycle controller marks the node ``Unknown`` after
        its grace period."""
        self._kubelets[node].posting = False

    def kubelet_not_ready(self, node: str, message: str) -> None:
        """The kubelet reports the node not ready (renewing the lease all the while)."""
        self._post_ready(node, False, "KubeletNotReady", message)

    def set_addresses(self, node: str, internal: str, external: str = "") -> None:
        """The Node's InternalIP (and ExternalIP) as kubelet reports them after a restart
        (``--node-ip``), and Flannel's ``public-ip`` annotation following InternalIP."""
        obj = self.node(node)
        addresses = [{"type": "InternalIP", "address": internal}]
        if external:
            addresses.append({"type": "ExternalIP", "address": external})
        addresses.append({"type": "Hostname", "address": node})
        obj["status"]["addresses"] = addresses
        obj["metadata"].setdefault("annotations", {})[
            "flannel.alpha.coreos.com/public-ip"] = internal
        self._put("nodes", obj, "MODIFIED")

    # --- the parts that move ------------------------------------------------------------

    def _renew(self, node: str) -> None:
        lease = self._store["leases"][(LEASE_NAMESPACE, node)]
        lease["spec"]["renewTime"] = micro_time()
        self._put("leases", lease, "MODIFIED")

    def _post_ready(self, node: str, ready: bool, reason: str, message: str) -> None:
        obj = self.node(node)
        now = stamp(datetime.now(UTC))
        status = "True" if ready else "False"
        for cond in obj["status"]["conditions"]:
            if cond["type"] == "Ready":
                if cond["status"] != status:
                    cond["lastTransitionTime"] = now
                cond.update(status=status, reason=reason, message=message,
                            lastHeartbeatTime=now)
        self._put("nodes", obj, "MODIFIED")

    async def _beat(self, kubelet: _Kubelet) -> None:
        loop = asyncio.get_running_loop()
        probe = loop.time()  # the controller's own time of the last renewal it saw
        while True:
            await asyncio.sleep(min(kubelet.renew, kubelet.grace / 4))
            if kubelet.posting:
                self._renew(kubelet.node)
                probe = loop.time()
            elif loop.time() - probe >= kubelet.grace:
                self._lapse(kubelet.node)

    def _lapse(self, node: str) -> None:
        """``tryUpdateNodeHealth``: every kubelet condition ``Unknown``, once."""
        obj = self.node(node)
        now = stamp(datetime.now(UTC))
        changed = False
        for cond in obj["status"]["conditions"]:
            if cond["type"] in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure") \
                    and cond["status"] != "Unknown":
                cond.update(status="Unknown", reason="NodeStatusUnknown",
                            message="Kubelet stopped posting node status.",
                            lastTransitionTime=now)
                changed = True
        if changed:
            self._put("nodes", obj, "MODIFIED")
