"""Kubernetes (when ``[kubernetes]`` is configured): the credentials load, the API answers
``/version``, and a ``SelfSubjectAccessReview`` per permission the configured mode needs
says it is granted; a missing one is named as the RBAC rule to add.

What each mode needs (k3s-manifests/rbac.yaml grants exactly this):

==========================  ==========================================  ================
permission                  needed for                                  missing is
==========================  ==========================================  ================
get/list/watch/delete pods  ``pod`` (and ``auto``) remediation: find,    fail (``pod``),
in the Flannel namespace    delete and watch this node's Flannel pod    warn (``auto``)
create events in default    ``[kubernetes] events``                     warn
patch nodes/status          ``[kubernetes] node_condition``             warn
get this node's Lease in    the ``control`` check (``[control]``)       warn
kube-node-lease, get its
Node (by name)
==========================  ==========================================  ================

Every call has a short timeout and no retry: the doctor reports, it does not wait out an
outage.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from edgeheal.tools.doctor.finding import Finding, Result, fail, ok, skip, warn

if TYPE_CHECKING:
    from edgeheal.boundaries.kube import KubeClient
    from edgeheal.config import Config
    from edgeheal.tools.doctor.system import System

TIMEOUT = 5.0
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@dataclasses.dataclass(frozen=True, slots=True)
class Need:
    verb: str
    resource: str
    subresource: str
    namespace: str
    why: str
    missing: Result
    group: str = ""
    name: str = ""

    def describe(self) -> str:
        resource = self.resource + (f".{self.group}" if self.group else "") + (
            f"/{self.subresource}" if self.subresource else "")
        named = f" {self.name}" if self.name else ""
        where = f" in namespace {self.namespace}" if self.namespace else " (cluster-scoped)"
        return f"{self.verb} {resource}{named}{where}"


def needs(config: Config) -> list[Need]:
    from edgeheal.boundaries.kube import EVENT_NAMESPACE

    kube = config.kubernetes
    assert kube is not None  # noqa: S101 - only called when configured
    mode = config.remediation.mode
    wanted: list[Need] = []
    if mode in ("pod", "auto"):
        ns = config.remediation.pod.namespace
        level = Result.FAIL if mode == "pod" else Result.WARN
        wanted += [Need(v, "pods", "", ns, f"remediation mode {mode}", level)
                   for v in ("get", "list", "watch", "delete")]
    if kube.events:
        wanted.append(Need("create", "events", "", EVENT_NAMESPACE,
                           "[kubernetes] events", Result.WARN))
    if kube.node_condition:
        wanted.append(Need("patch", "nodes", "status", "", "[kubernetes] node_condition",
                           Result.WARN))
    if "control" in config.sections and config.control.enabled:
        from edgeheal.boundaries.kube.node import LEASE_NAMESPACE

        wanted += [Need("get", "leases", "", LEASE_NAMESPACE, "the control check",
                        Result.WARN, group="coordination.k8s.io", name=config.node),
                   Need("get", "nodes", "", "", "the control check", Result.WARN,
                        name=config.node)]
    return wanted


async def api(config: Config, system: System) -> list[Finding]:
    from edgeheal.boundaries.kube import KubeError

    kube = config.kubernetes
    if kube is None:
        return [skip("kubernetes", "no [kubernetes] section: the agent does not use the API")]
    settings = dataclasses.replace(kube, retries=0,
                                   request_timeout=min(TIMEOUT, kube.request_timeout))
    client = system.kube(settings)
    source = kube.kubeconfig or "the in-cluster service account"
    try:
        try:
            version = await client.request("GET", "/version", what="get /version")
        except KubeError as err:
            return [fail("kubernetes.api", str(err),
                         f"check the credentials in {source} (make them with `edgeheal "
                         "kubeconfig` from the agent's service-account token, never "
                         "k3s.yaml) and that the API server is reachable")]
        found = [ok("kubernetes.api", f"{source}: the API answers (Kubernetes "
                    f"{version.get('gitVersion', '?')})", version=version.get("gitVersion"))]
        found.append(await _rbac(config, client))
        return found
    finally:
        await client.close()


async def _rbac(config: Config, client: KubeClient) -> Finding:
    from edgeheal.boundaries.kube import KubeError

    name = "kubernetes.rbac"
    wanted = needs(config)
    if not wanted:
        return skip(name, "the configuration needs no permission")
    missing: list[Need] = []
    for need in wanted:
        attributes = {"verb": need.verb, "resource": need.resource, "group": need.group}
        if need.name:
            attributes["name"] = need.name
        if need.subresource:
            attributes["subresource"] = need.subresource
        if need.namespace:
            attributes["namespace"] = need.namespace
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes}}
        try:
            answer = await client.request(
                "POST", REVIEWS, what="create selfsubjectaccessreviews", body=body)
        except KubeError as err:
            return fail(name, f"cannot ask what is allowed: {err}",
                        "allow the agent's account to create selfsubjectaccessreviews "
                        "(every authenticated user may, unless the cluster changed "
                        "system:basic-user)")
        if not (answer.get("status") or {}).get("allowed"):
            missing.append(need)
    granted = [n.describe() for n in wanted if n not in missing]
    if not missing:
        return ok(name, f"allowed: {', '.join(granted)}", granted=granted)
    worst = Result.FAIL if any(n.missing is Result.FAIL for n in missing) else Result.WARN
    text = "; ".join(f"missing {n.describe()} (needed for {n.why})" for n in missing)
    fix = ("grant it: apply k3s-manifests/rbac.yaml for this node's service account (the "
           "Role in the Flannel namespace, the Role for events in default, the ClusterRole "
           "for nodes/status, and for the control check the node's Lease and Node roles)")
    detail = {"missing": [n.describe() for n in missing], "granted": granted}
    return (fail if worst is Result.FAIL else warn)(name, text, fix, **detail)
