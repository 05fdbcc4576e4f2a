"""Every manifest in k3s-manifests/ validates offline against the Kubernetes schemas (the
``kubernetes-validate`` package bundles them), and says what the docs promise.

The validator and YAML are dev extras: a missing one is an import error, not a skip. For a
version it lacks, ``kubernetes_validate`` falls back to the newest older schemas it has, so
each validation asserts the version it really used: a claimed version without its own
schemas fails instead of passing against another release's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions, major_minor

MANIFESTS = Path(__file__).resolve().parents[2] / "k3s-manifests"
VERSIONS = ("1.30.0", "1.33.0")
"""The oldest release with ValidatingAdmissionPolicy v1 (K3s v1.30), and a recent one: the
versions docs/remediation.md claims."""


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def all_documents() -> list[tuple[str, int, dict[str, Any]]]:
    return [(path.name, i, doc) for path in sorted(MANIFESTS.glob("*.yaml"))
            for i, doc in enumerate(documents(path.name))]


def test_the_expected_manifests_exist() -> None:
    names = {p.name for p in MANIFESTS.glob("*.yaml")}
    assert {"rbac.yaml", "collector-example.yaml", "flannel-wireguard.yaml",
            "admission-policy.yaml"} <= names


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "index", "doc"), all_documents(),
                         ids=[f"{n}#{i}-{d['kind']}" for n, i, d in all_documents()])
def test_every_manifest_validates_against_the_schemas(name: str, index: int,
                                                      doc: dict[str, Any],
                                                      version: str) -> None:
    used = kubernetes_validate.validate(doc, version, strict=True)
    assert used == major_minor(version), f"no {version} schemas: validated against {used}"


def test_every_claimed_version_has_its_own_schemas() -> None:
    bundled = {major_minor(v) for v in all_versions()}
    assert {major_minor(v) for v in VERSIONS} <= bundled


def test_a_kind_without_a_schema_is_an_error_not_a_pass() -> None:
    unknown = {"apiVersion": "example.org/v1", "kind": "Nothing", "metadata": {"name": "x"}}
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(unknown, VERSIONS[0], strict=True)


def test_a_broken_manifest_is_caught() -> None:
    """The validator is not a no-op: a typo'd field fails strict validation."""
    (sa, *_rest) = documents("rbac.yaml")
    broken = {**sa, "metadata": {**sa["metadata"], "namspace": "x"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def test_the_flannel_role_is_exactly_the_least_privilege() -> None:
    roles = {d["metadata"]["name"]: d for d in documents("rbac.yaml")
             if d["kind"] in ("Role", "ClusterRole")}
    flannel = roles["edgeheal-restart-flannel"]
    assert flannel["metadata"]["namespace"] == "kube-flannel"
    assert flannel["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                 "verbs": ["get", "list", "watch", "delete"]}]
    verbs = {(r, v) for role in roles.values() for rule in role["rules"]
             for r in rule["resources"] for v in rule["verbs"]}
    assert verbs == {("pods", "get"), ("pods", "list"), ("pods", "watch"),
                     ("pods", "delete"), ("events", "create"), ("events", "patch"),
                     ("nodes", "get"), ("nodes/status", "patch")}
    assert not any("*" in str(role["rules"]) for role in roles.values())


def test_the_token_secret_belongs_to_the_service_account() -> None:
    docs = documents("rbac.yaml")
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert (secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
            == sa["metadata"]["name"])


def test_the_collector_probes_follow_the_rules() -> None:
    (deployment,) = documents("collector-example.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ready = container["readinessProbe"]["httpGet"]
    assert (ready["host"], ready["port"]) == ("127.0.0.1", 9917)
    assert ready["path"] in ("/readyz", "/probe/broker-tunnel")
    live = container["livenessProbe"]
    assert "httpGet" not in live
    assert "tcpSocket" not in live
    assert "grpc" not in live


def test_flannel_uses_wireguard_with_a_20s_keepalive() -> None:
    (cm,) = documents("flannel-wireguard.yaml")
    net = json.loads(cm["data"]["net-conf.json"])
    assert net["Backend"] == {"Type": "wireguard", "PersistentKeepaliveInterval": 20}
    json.loads(cm["data"]["cni-conf.json"])
    assert "--flannel-conf" in (MANIFESTS / "flannel-wireguard.yaml").read_text()


def test_the_admission_policy_is_bound_and_denies() -> None:
    policy, binding = documents("admission-policy.yaml")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    rules = {(tuple(r["operations"]), tuple(r["resources"]))
             for r in policy["spec"]["matchConstraints"]["resourceRules"]}
    assert (("DELETE",), ("pods",)) in rules
