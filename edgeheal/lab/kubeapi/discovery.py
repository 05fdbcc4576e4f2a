"""What the stand-in serves about itself: ``/version``, the discovery documents (``/api``,
``/apis``, one ``APIResourceList`` per group version) and the server-side ``Table`` rendering
``kubectl get`` asks for (``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``).

Only the resources and verbs the stand-in really implements are announced, so a client's
discovery never promises what the server then refuses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from edgeheal.base.compat import UTC

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Resource:
    group: str
    name: str
    """The plural, with the subresource for one (``nodes/status``)."""
    kind: str
    namespaced: bool
    verbs: tuple[str, ...]
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    version: str = "v1"

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = (
    Resource("", "events", "Event", True, ("create", "get", "list", "watch"), "event",
             ("ev",)),
    Resource("", "nodes", "Node", False, ("get", "list", "watch"), "node", ("no",)),
    Resource("", "nodes/status", "Node", False, ("get", "patch")),
    Resource("", "pods", "Pod", True, ("delete", "get", "list", "watch"), "pod", ("po",),
             ("all",)),
    Resource("coordination.k8s.io", "leases", "Lease", True, ("get", "list", "watch"),
             "lease"),
    Resource("authentication.k8s.io", "selfsubjectreviews", "SelfSubjectReview", False,
             ("create",), "selfsubjectreview"),
    Resource("authorization.k8s.io", "selfsubjectaccessreviews", "SelfSubjectAccessReview",
             False, ("create",), "selfsubjectaccessreview"),
    Resource("authorization.k8s.io", "selfsubjectrulesreviews", "SelfSubjectRulesReview",
             False, ("create",), "selfsubjectrulesreview"),
)
KINDS = {r.name: r.kind for r in RESOURCES if "/" not in r.name}
API_VERSIONS = {r.name: r.group_version for r in RESOURCES if "/" not in r.name}
GROUPS = tuple(sorted({r.group for r in RESOURCES if r.group}))


def find(group: str, version: str, name: str) -> Resource | None:
    for resource in RESOURCES:
        if (resource.group, resource.version, resource.name) == (group, version, name):
            return resource
    return None


def version_info(git_version: str) -> Obj:
    major, minor = git_version.lstrip("v").split(".")[:2]
    return {"major": major, "minor": minor, "emulationMajor": major, "emulationMinor": minor,
            "minCompatibilityMajor": major, "minCompatibilityMinor": str(int(minor) - 1),
            "gitVersion": git_version, "gitCommit": "0" * 40, "gitTreeState": "clean",
            "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
            "platform": "linux/amd64"}


def api_versions(address: str) -> Obj:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                            "serverAddress": address}]}


def _group(name: str) -> Obj:
    gv = {"groupVersion": f"{name}/v1", "version": "v1"}
    return {"name": name, "versions": [gv], "preferredVersion": gv}


def api_groups() -> Obj:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in GROUPS]}


def api_group(name: str) -> Obj | None:
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name)} if name in GROUPS else None


def resource_list(group: str, version: str) -> Obj | None:
    found = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
    if not found:
        return None
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": found[0].group_version,
            "resources": [{"name": r.name, "singularName": r.singular, "namespaced":
                           r.namespaced, "kind": r.kind, "verbs": list(r.verbs),
                           **({"shortNames": list(r.short_names)} if r.short_names else {}),
                           **({"categories": list(r.categories)} if r.categories else {})}
                          for r in found]}


# --- Table -----------------------------------------------------------------------------

def wants_table(accept: str) -> str | None:
    """The ``meta.k8s.io`` version of the Table ``accept`` asks for first, if any."""
    for part in accept.split(","):
        params = dict(p.strip().partition("=")[::2] for p in part.split(";")[1:])
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" \
                and params.get("v") in ("v1", "v1beta1"):
            return params["v"]
    return None


def human_duration(seconds: float) -> str:
    """``k8s.io/apimachinery/pkg/util/duration.HumanDuration``: the AGE column."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    return f"{hours // 24}d" if hours < 24 * 365 * 2 else f"{hours // 24 // 365}y"


def parse_time(stamp: str) -> datetime:
    """An RFC 3339 timestamp as Go's ``time.RFC3339`` reads it (fractions allowed)."""
    then = datetime.fromisoformat(stamp.replace("Z", "+00:00").replace("z", "+00:00"))
    if then.tzinfo is None:
        raise ValueError(f"no time zone in {stamp!r}")
    return then.astimezone(UTC)


def _age(stamp: str | None, now: datetime) -> str:
    if not stamp:
        return "<unknown>"
    return human_duration((now - parse_time(stamp)).total_seconds())


def _column(name: str, description: str, *, priority: int = 0, kind: str = "string",
            fmt: str = "") -> Obj:
    return {"name": name, "type": kind, "format": fmt, "description": description,
            "priority": priority}


_NAME_COLUMN = _column("Name", "Name must be unique within a namespace.", fmt="name")
COLUMNS: dict[str, list[Obj]] = {
    "pods": [_NAME_COLUMN,
             _column("Ready", "The aggregate readiness state of this pod for accepting "
                     "traffic."),
             _column("Status", "The aggregate status of the containers in this pod."),
             _column("Restarts", "The number of times the containers in this pod have been "
                     "restarted and when the last container in this pod has restarted."),
             _column("Age", "CreationTimestamp is a timestamp representing the server time "
                     "when this object was created."),
             _column("IP", "IP address allocated to the pod.", priority=1),
             _column("Node", "Name of the Node this pod is scheduled on.", priority=1),
             _column("Nominated Node", "Name of the Node the pod is nominated to.",
                     priority=1),
             _column("Readiness Gates", "The readiness gates of this pod.", priority=1)],
    "nodes": [_NAME_COLUMN,
              _column("Status", "The status of the node"),
              _column("Roles", "The roles of the node"),
              _column("Age", "CreationTimestamp of the node."),
              _column("Version", "Kubelet Version reported by the node."),
              _column("Internal-IP", "List of internal IPs of the node.", priority=1),
              _column("External-IP", "List of external IPs of the node.", priority=1),
              _column("OS-Image", "OS image reported by the node.", priority=1),
              _column("Kernel-Version", "Kernel version reported by the node.", priority=1),
              _column("Container-Runtime", "Container runtime reported by the node.",
                      priority=1)],
    "leases": [_NAME_COLUMN, _column("Holder", "The holder identity of the lease."),
               _column("Age", "CreationTimestamp is a timestamp representing the server "
                       "time when this object was created.")],
    "events": [_column("Last Seen", "Time when last event from this group was observed."),
               _column("Type", "Type of this event (Normal, Warning), new types could be "
                       "added in the future."),
               _column("Reason", "Reason why this event was generated."),
               _column("Object", "The object that this event is about."),
               _column("Message", "A human-readable description of the status of this "
                       "operation.")],
}


def _pod_cells(pod: Obj, now: datetime) -> list[Any]:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    ready = sum(1 for c in containers if c.get("ready"))
    reason = status.get("reason") or status.get("phase") or "Unknown"
    for c in containers:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
    if meta.get("deletionTimestamp"):
        reason = "Terminating"
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    return [meta["name"], f"{ready}/{len(spec.get('containers') or [])}", reason,
            str(restarts), _age(meta.get("creationTimestamp"), now),
            status.get("podIP") or "<none>", spec.get("nodeName") or "<none>",
            status.get("nominatedNodeName") or "<none>", "<none>"]


def _node_cells(node: Obj, now: datetime) -> list[Any]:
    meta, status = node["metadata"], node.get("status") or {}
    ready = next((c["status"] for c in status.get("conditions") or ()
                  if c.get("type") == "Ready"), "Unknown")
    state = "Ready" if ready == "True" else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(k.rpartition("/")[2] for k in meta.get("labels") or {}
                   if k.startswith("node-role.kubernetes.io/")) or ["<none>"]
    info = status.get("nodeInfo") or {}

    def address(kind: str) -> str:
        return next((a["address"] for a in status.get("addresses") or ()
                     if a.get("type") == kind), "<none>")

    return [meta["name"], state, ",".join(roles), _age(meta.get("creationTimestamp"), now),
            info.get("kubeletVersion", ""), address("InternalIP"), address("ExternalIP"),
            info.get("osImage", "<unknown>"), info.get("kernelVersion", "<unknown>"),
            info.get("containerRuntimeVersion", "<unknown>")]


def _event_cells(event: Obj, now: datetime) -> list[Any]:
    involved = event.get("involvedObject") or {}
    return [_age(event.get("lastTimestamp") or event["metadata"].get("creationTimestamp"),
                 now), event.get("type", ""), event.get("reason", ""),
            f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
            event.get("message", "")]


def _lease_cells(lease: Obj, now: datetime) -> list[Any]:
    spec = lease.get("spec") or {}
    return [lease["metadata"]["name"], spec.get("holderIdentity") or "",
            _age(lease["metadata"].get("creationTimestamp"), now)]


_CELLS = {"pods": _pod_cells, "nodes": _node_cells, "events": _event_cells,
          "leases": _lease_cells}


def table(resource: str, objects: Iterable[Obj], *, version: str, resource_version: str,
          include: str, now: datetime, headers: bool = True) -> Obj:
    """The ``meta.k8s.io`` Table of ``objects``; ``include`` is the ``includeObject``
    parameter (``None``, ``Metadata`` (default), ``Object``)."""
    rows = []
    for obj in objects:
        row: Obj = {"cells": _CELLS[resource](obj, now)}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata",
                             "apiVersion": f"meta.k8s.io/{version}",
                             "metadata": obj["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": f"meta.k8s.io/{version}",
            "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": COLUMNS[resource] if headers else [], "rows": rows}
