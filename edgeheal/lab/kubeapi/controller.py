"""The cluster's moving parts: the nodes, the DaemonSet controller and the kubelet.

Why: what the agent's pod remedy depends on is not the DELETE answer but what follows it
on a real cluster, and in what order. The kubelet keeps a deleted pod listed, Terminating,
until its container has stopped (never longer than its grace period), then removes it;
the DaemonSet controller no longer counts a Terminating pod, so it creates the replacement
on the same node at once, under a new name and uid, while the old one is still listed;
the replacement turns Running and Ready only when its container is up. A client that
waits for "the pod on my node" must tell these apart, so the stand-in plays them out
with their delays (``replace_delay``, ``stop_delay``, ``ready_delay``) as tasks, every
step a change through the store that watches see.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgeheal.lab.kubeapi.selectors import labels_match, parse_labels
from edgeheal.lab.kubeapi.store import Store
from edgeheal.lab.kubeapi.wire import NAME_CHARS, Obj, timestamp

log = logging.getLogger(__name__)


@dataclass
class _DaemonSet:
    namespace: str
    name: str
    labels: dict[str, str]
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))


class Controller(Store):
    """Nodes, pods and the controllers that move them (see the module docstring)."""

    def _setup_controller(self, *, ready_delay: float, replace_delay: float,
                          stop_delay: float, grace: int, version: str) -> None:
        self.ready_delay, self.replace_delay = ready_delay, replace_delay
        self.stop_delay, self.grace = stop_delay, grace
        self.version = version
        self._daemonsets: list[_DaemonSet] = []
        self.on_replace: list[Callable[[Obj, Obj], None]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    # --- the world, as a test arranges it -------------------------------------------------

    def add_node(self, name: str) -> Obj:
        index = len(self._store["nodes"]) + 10
        created = timestamp()
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

    def condition(self, node: str, kind: str) -> Obj | None:
        for cond in self.node(node)["status"]["conditions"]:
            if cond["type"] == kind:
                return dict(cond)
        return None

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
        pod["metadata"]["creationTimestamp"] = timestamp()
        self._put("pods", pod, "ADDED")
        return pod

    def terminating(self, namespace: str, node: str | None = None) -> list[Obj]:
        """The pods with a ``deletionTimestamp`` still listed (their grace period)."""
        return [p for p in self.pods(namespace, node) if p["metadata"].get("deletionTimestamp")]

    # --- pods as the API server stores them -----------------------------------------------

    def _node_ip(self, node: str) -> str:
        found = self._store["nodes"].get(("", node))
        addresses = (found or {}).get("status", {}).get("addresses") or [{}]
        return str(addresses[0].get("address", ""))

    def _pod_obj(self, namespace: str, name: str, node: str, labels: dict[str, str], *,
                 ready: bool, owner: _DaemonSet | None) -> Obj:
        meta: Obj = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                     "labels": dict(labels), "creationTimestamp": timestamp()}
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
        now = timestamp()
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

    # --- the controllers ------------------------------------------------------------------

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
