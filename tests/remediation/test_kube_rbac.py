"""The agent's RBAC is derived from its code: every API call of :class:`KubeClient` runs
against the stand-in as a user allowed everything, the stand-in records the (verb,
resource, namespace) the authorizer saw, and that set must equal what
k3s-manifests/rbac.yaml grants — nothing missing, nothing granted and unused. A rule
limited by ``resourceNames`` must name every object the code asked for by name."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from edgeheal.boundaries.kube import KubeClient, Pod
from edgeheal.lab.kubeapi import FakeKube
from tests.remediation.conftest import NODE, NS, settings_for

MANIFESTS = Path(__file__).resolve().parents[2] / "k3s-manifests"
EVERYTHING = ("get", "list", "watch", "create", "update", "patch", "delete",
              "deletecollection")
RESOURCES = ("pods", "pods/status", "nodes", "nodes/status", "events", "namespaces",
             "leases.coordination.k8s.io")


async def _drain(kube: KubeClient) -> None:
    async for _ in kube.watch_pods(NS, "app=flannel", NODE, "", 1.0):
        pass


async def _delete(kube: KubeClient, api: FakeKube) -> None:
    await kube.delete_pod(Pod.from_json(api.pod_on(NS, NODE)), NODE)


async def _lease(kube: KubeClient, api: FakeKube) -> None:
    api.kubelet_start(NODE)  # the stand-in kubelet creates its Lease
    await kube.get_lease(NODE)


CALLS: dict[str, Callable[[KubeClient, FakeKube], Awaitable[Any]]] = {
    "list_pods": lambda kube, api: kube.list_pods(NS, "app=flannel", NODE),
    "get_pod": lambda kube, api: kube.get_pod(NS, api.pod_on(NS, NODE)["metadata"]["name"]),
    "watch_pods": lambda kube, api: _drain(kube),
    "delete_pod": _delete,
    "wait_replacement": lambda kube, api: kube.wait_replacement(
        NS, "app=flannel", NODE, old_uid="none", within=5.0, clock=time.monotonic),
    "node_event": lambda kube, api: kube.node_event(NODE, "Test", "rbac derivation"),
    "set_node_condition": lambda kube, api: kube.set_node_condition(
        NODE, "EdgeTunnelHealthy", True, "Test", "rbac derivation"),
    "get_lease": _lease,
    "get_node": lambda kube, api: kube.get_node(NODE),
}
"""One call of each of the client's API methods (``request`` is the plumbing under them,
``close`` makes no call)."""


Grant = tuple[str, str, "str | None"]


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def rules() -> list[tuple[Grant, frozenset[str]]]:
    """(verb, group-qualified resource, namespace) granted by rbac.yaml's Roles and
    ClusterRoles, each with its ``resourceNames`` (empty: any name)."""
    out: list[tuple[Grant, frozenset[str]]] = []
    for doc in yaml.safe_load_all((MANIFESTS / "rbac.yaml").read_text()):
        if doc and doc["kind"] in ("Role", "ClusterRole"):
            namespace = doc["metadata"].get("namespace") if doc["kind"] == "Role" else None
            for rule in doc["rules"]:
                (group,) = rule["apiGroups"]
                names = frozenset(rule.get("resourceNames") or ())
                out += [((verb, _qualified(resource, group), namespace), names)
                        for resource in rule["resources"] for verb in rule["verbs"]]
    return out


def granted() -> set[Grant]:
    return {grant for grant, _names in rules()}


def test_every_api_method_of_the_client_is_exercised() -> None:
    methods = {name for name, fn in inspect.getmembers(KubeClient)
               if not name.startswith("_") and (inspect.iscoroutinefunction(fn)
                                                or inspect.isasyncgenfunction(fn))}
    assert methods - {"request", "close"} == set(CALLS)


async def test_the_rbac_rules_are_exactly_the_requests_the_code_makes(
        api: FakeKube, tmp_path: Path) -> None:
    creds = api.add_user("everything")
    for verb in EVERYTHING:
        for resource in RESOURCES:
            api.allow(creds.user, verb, resource)
    kube = KubeClient(settings_for(api.write_kubeconfig(tmp_path / "kc", creds)))
    try:
        for call in CALLS.values():
            await call(kube, api)
    finally:
        await kube.close()
    mine = [a for a in api.authorized if a.user == creds.user]
    used = {(a.verb, _qualified(a.resource, a.group), a.namespace) for a in mine}
    assert used == granted()
    for grant, names in rules():
        asked = {a.name for a in mine
                 if (a.verb, _qualified(a.resource, a.group), a.namespace) == grant}
        assert not names or asked <= names, (grant, asked, names)
    assert any(names for _grant, names in rules())  # the name check checks something
    # the stand-in's own notion of the agent's grants (used by the lab) agrees
    agent = {(verb, resource, NS if where == "" else where)
             for verb, resource, where in FakeKube.AGENT_RULES}
    assert agent == granted()
