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
                     ("pods", "delete"), ("events", "create"), ("nodes/status", "patch"),
                     ("leases", "get"), ("nodes", "get")}
    # the control check's reads are of this node's own objects only, by name
    named = {(tuple(rule["resources"]), tuple(rule.get("resourceNames") or ()))
             for role in roles.values() for rule in role["rules"]
             if set(rule["resources"]) & {"leases", "nodes"}}
    assert named == {(("leases",), ("edge-1",)), (("nodes",), ("edge-1",))}
    # (test_kube_rbac.py derives the same set from the requests the agent's code makes)
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


# --- the admission policy's CEL, evaluated -------------------------------------------------

SA = "system:serviceaccount:kube-flannel:edgeheal-edge-1"
NODE_NAME = "authentication.kubernetes.io/node-name"
TOKENS: dict[str, dict[str, Any]] = {
    # rbac.yaml's long-lived Secret token: no extra at all (the field is omitted)
    "secret token": {"username": SA, "uid": "u1", "groups": [
        "system:serviceaccounts", "system:serviceaccounts:kube-flannel",
        "system:authenticated"]},
    # an extra without the node (e.g. a token bound to a Secret or a Pod only)
    "token without node": {"username": SA, "uid": "u1", "groups": ["system:authenticated"],
                           "extra": {"authentication.kubernetes.io/credential-id": [
                               "JTI=0d3c1a4e"]}},
    # `kubectl create token edgeheal-edge-1 --bound-object-kind Node --bound-object-name
    # edge-1`: the node rides in the extra
    "node-bound token": {"username": SA, "uid": "u1", "groups": ["system:authenticated"],
                         "extra": {NODE_NAME: ["edge-1"],
                                   "authentication.kubernetes.io/node-uid": ["n-1"],
                                   "authentication.kubernetes.io/credential-id": [
                                       "JTI=5b2e"]}},
}


def _request(token: str, operation: str, resource: str, sub: str = "") -> dict[str, Any]:
    return {"operation": operation, "userInfo": TOKENS[token],
            "resource": {"group": "", "version": "v1", "resource": resource},
            "subResource": sub, "namespace": "kube-flannel" if resource == "pods" else ""}


def _pod(node: str | None) -> dict[str, Any]:
    spec = {"nodeName": node} if node else {}
    return {"metadata": {"name": "kube-flannel-ds-x", "namespace": "kube-flannel"},
            "spec": {"containers": [{"name": "kube-flannel"}], **spec}}


def _event(node: str) -> dict[str, Any]:
    return {"metadata": {"name": "e"}, "reason": "FlannelRestarted",
            "involvedObject": {"kind": "Node", "name": node}}


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {}}


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    """One CEL expression with cel-python, plus the Kubernetes string extension
    ``substring`` the policy uses; an evaluation error is raised, not returned."""
    import celpy  # a dev extra, only this test uses it
    from celpy.adapter import json_to_cel
    from celpy.evaluation import CELEvalError

    def substring(text: Any, start: Any, end: Any = None) -> Any:
        return celpy.celtypes.StringType(str(text)[int(start):None if end is None
                                                   else int(end)])

    env = celpy.Environment()
    program = env.program(env.compile(expression), functions={"substring": substring})
    result = program.evaluate({k: json_to_cel(v) for k, v in activation.items()})
    if isinstance(result, CELEvalError):
        raise result
    return result


def admit(request: dict[str, Any], *, old: Any = None, new: Any = None,
          ) -> tuple[str, str]:
    """The ValidatingAdmissionPolicy's answer as the API server computes it: ("skip", "")
    when a match condition is false, ("allow", ""), ("deny", message); an evaluation error
    is a denial (failurePolicy Fail)."""
    from celpy.evaluation import CELEvalError  # a dev extra

    (policy, _binding) = documents("admission-policy.yaml")
    spec = policy["spec"]
    activation: dict[str, Any] = {"request": request, "oldObject": old, "object": new}
    try:
        for condition in spec["matchConditions"]:
            if not evaluate(condition["expression"], activation):
                return "skip", ""
        variables: dict[str, Any] = {}
        for variable in spec["variables"]:
            variables[variable["name"]] = evaluate(variable["expression"],
                                                   {**activation, "variables": variables})
        for check in spec["validations"]:
            scope = {**activation, "variables": variables}
            if not evaluate(check["expression"], scope):
                return "deny", str(evaluate(check["messageExpression"], scope))
    except CELEvalError as err:
        assert spec["failurePolicy"] == "Fail"
        return "deny", f"evaluation error: {err.args[0] if err.args else err}"
    return "allow", ""


@pytest.mark.parametrize("token", list(TOKENS))
def test_the_policy_lets_each_token_act_on_its_own_node_only(token: str) -> None:
    assert admit(_request(token, "DELETE", "pods"), old=_pod("edge-1")) == ("allow", "")
    verdict, message = admit(_request(token, "DELETE", "pods"), old=_pod("edge-2"))
    assert verdict == "deny"
    assert message == ("the edgeheal account of node edge-1 may only act on its own node, "
                       "not on edge-2")
    assert admit(_request(token, "CREATE", "events"), new=_event("edge-1"))[0] == "allow"
    assert admit(_request(token, "CREATE", "events"), new=_event("edge-2"))[0] == "deny"
    assert admit(_request(token, "UPDATE", "nodes", "status"),
                 old=_node("edge-1"), new=_node("edge-1"))[0] == "allow"
    assert admit(_request(token, "UPDATE", "nodes", "status"),
                 old=_node("edge-2"), new=_node("edge-2"))[0] == "deny"


def test_a_missing_field_is_a_denial_with_a_reason_not_an_evaluation_error() -> None:
    verdict, message = admit(_request("secret token", "DELETE", "pods"), old=_pod(None))
    assert (verdict, message.startswith("evaluation error")) == ("deny", False)
    event = {"metadata": {"name": "e"}, "reason": "X"}  # no involvedObject
    verdict, message = admit(_request("secret token", "CREATE", "events"), new=event)
    assert (verdict, message.startswith("evaluation error")) == ("deny", False)


def test_the_node_in_a_bound_token_wins_over_the_account_name() -> None:
    moved = {**TOKENS["node-bound token"], "extra": {NODE_NAME: ["edge-2"]}}
    request = {**_request("node-bound token", "DELETE", "pods"), "userInfo": moved}
    assert admit(request, old=_pod("edge-2"))[0] == "allow"
    assert admit(request, old=_pod("edge-1"))[0] == "deny"


def test_other_users_are_not_matched() -> None:
    kubelet = {"username": "system:node:edge-1", "groups": ["system:nodes"]}
    request = {**_request("secret token", "DELETE", "pods"), "userInfo": kubelet}
    assert admit(request, old=_pod("edge-2")) == ("skip", "")


def test_without_has_guards_a_secret_token_would_fail_evaluation() -> None:
    """Why the guards: the extra is absent from a Secret token's userInfo, and reading it
    is an evaluation error — with failurePolicy Fail, every request of the agent refused."""
    from celpy.evaluation import CELEvalError  # a dev extra

    with pytest.raises(CELEvalError):
        evaluate(f"'{NODE_NAME}' in request.userInfo.extra",
                 {"request": _request("secret token", "DELETE", "pods")})
    (policy, _binding) = documents("admission-policy.yaml")
    token_node = policy["spec"]["variables"][0]["expression"]
    assert token_node.startswith("has(request.userInfo.extra)")
