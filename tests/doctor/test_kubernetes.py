"""The Kubernetes checks against the test API server (a real HTTPS server, real kubeconfig,
SelfSubjectAccessReview answered from its permission table)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgeheal.lab.kubeapi import FakeKube
from edgeheal.tools.doctor import kubernetes
from edgeheal.tools.doctor.finding import Result
from tests.doctor.support import config, edge

NS = "kube-flannel"
USER = "system:serviceaccount:kube-flannel:edgeheal-edge-1"


@pytest.fixture
async def api() -> AsyncIterator[FakeKube]:
    server = FakeKube()
    server.add_node("edge-1")
    await server.start()
    try:
        yield server
    finally:
        await server.close()


def kube_config(api: FakeKube, tmp_path: Path, *, mode: str = "pod", token: str = "",
                allow: bool = True) -> str:
    creds = api.add_user(USER, token=token or None)
    if allow:
        api.allow_agent(creds.user, NS)
    path = api.write_kubeconfig(tmp_path / "kubeconfig", creds)
    return f'[kubernetes]\nkubeconfig = "{path}"\n[remediation]\nmode = "{mode}"\n'


async def test_an_agent_with_its_rbac_has_everything(api: FakeKube, tmp_path: Path) -> None:
    cfg = config(kube_config(api, tmp_path))
    first, rbac = await kubernetes.api(cfg, edge().system())
    assert first.result is Result.OK
    assert "the API answers" in first.found
    assert rbac.result is Result.OK, rbac.found
    assert "delete pods in namespace kube-flannel" in rbac.detail["granted"]
    reviews = [r for r in api.requests if "selfsubjectaccessreviews" in r.path]
    assert len(reviews) == 6  # get/list/watch/delete pods, create events, patch nodes/status


async def test_no_delete_right_fails_and_names_it(api: FakeKube, tmp_path: Path) -> None:
    cfg = config(kube_config(api, tmp_path))
    api.deny(USER, "delete", "pods", NS)
    _, rbac = await kubernetes.api(cfg, edge().system())
    assert rbac.result is Result.FAIL
    assert "missing delete pods in namespace kube-flannel (needed for remediation mode pod)" \
        in rbac.found
    assert rbac.detail["missing"] == ["delete pods in namespace kube-flannel"]
    assert "rbac.yaml" in rbac.fix


async def test_a_missing_optional_right_only_warns(api: FakeKube, tmp_path: Path) -> None:
    cfg = config(kube_config(api, tmp_path))
    api.deny(USER, "patch", "nodes/status", None)
    _, rbac = await kubernetes.api(cfg, edge().system())
    assert rbac.result is Result.WARN
    assert "patch nodes/status (cluster-scoped)" in rbac.found


async def test_the_k3s_service_mode_needs_no_pod_rights(api: FakeKube, tmp_path: Path) -> None:
    cfg = config(kube_config(api, tmp_path, mode="k3s-service", allow=False))
    api.allow(USER, "create", "events", "default")
    api.allow(USER, "patch", "nodes/status")
    _, rbac = await kubernetes.api(cfg, edge().system())
    assert rbac.result is Result.OK, rbac.found
    assert not any("pods" in g for g in rbac.detail["granted"])


async def test_rejected_credentials_fail_without_showing_the_token(
        api: FakeKube, tmp_path: Path) -> None:
    text = kube_config(api, tmp_path, token="s3cret-token-value")
    api.revoke(api.add_user(USER, token="s3cret-token-value"))
    (found,) = await kubernetes.api(config(text), edge().system())
    assert found.result is Result.FAIL
    assert found.check == "kubernetes.api"
    assert "s3cret" not in found.found + found.fix


async def test_no_kubernetes_section_is_a_skip() -> None:
    (found,) = await kubernetes.api(config(), edge().system())
    assert found.result is Result.SKIP


async def test_the_control_check_needs_its_lease_and_node_by_name(api: FakeKube,
                                                                 tmp_path: Path) -> None:
    control = '[control]\nservers = ["203.0.113.5:6443"]\n'
    cfg = config(control + kube_config(api, tmp_path))
    _, rbac = await kubernetes.api(cfg, edge().system())
    assert rbac.result is Result.OK, rbac.found
    assert f"get leases.coordination.k8s.io {cfg.node} in namespace kube-node-lease" \
        in rbac.detail["granted"]
    assert f"get nodes {cfg.node} (cluster-scoped)" in rbac.detail["granted"]
    api.deny(USER, "get", "leases.coordination.k8s.io", "kube-node-lease")
    _, rbac = await kubernetes.api(cfg, edge().system())
    assert rbac.result is Result.WARN
    assert "(needed for the control check)" in rbac.found
