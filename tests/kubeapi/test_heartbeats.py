"""The stand-in's heartbeats, read by the real kubectl: the node's Lease renewed by the
stand-in kubelet, and the node lifecycle controller's ``Unknown`` once it stops."""

from __future__ import annotations

from edgeheal.lab.kubeapi import FakeKube
from tests.kubeapi.conftest import NODE, Kubectl
from tests.support import until


async def test_kubectl_reads_the_lease_the_kubelet_renews(api: FakeKube,
                                                          kubectl: Kubectl) -> None:
    api.kubelet_start(NODE, renew=0.1, grace=5.0)
    listed = await kubectl("get", "lease", "-n", "kube-node-lease")
    assert listed.rc == 0, listed.err
    (header, row) = listed.out.splitlines()
    assert header.split() == ["NAME", "HOLDER", "AGE"]
    assert row.split()[:2] == [NODE, NODE]
    first = (await kubectl("get", "lease", NODE, "-n", "kube-node-lease", "-o",
                           "json")).json()
    assert first["apiVersion"] == "coordination.k8s.io/v1"
    assert first["spec"]["leaseDurationSeconds"] == 40
    assert first["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert first["spec"]["renewTime"].endswith("Z")
    assert "." in first["spec"]["renewTime"]
    await until(lambda: api.lease(NODE)["spec"]["renewTime"] != first["spec"]["renewTime"],
                within=5.0, what="the lease renewed")


async def test_a_silent_kubelet_turns_the_node_unknown_and_back(api: FakeKube,
                                                                kubectl: Kubectl) -> None:
    api.kubelet_start(NODE, renew=0.1, grace=0.5)
    api.kubelet_stop(NODE)
    frozen = api.lease(NODE)["spec"]["renewTime"]
    await until(lambda: api.condition(NODE, "Ready")["status"] == "Unknown",  # type: ignore[index]
                within=5.0, what="Ready Unknown")
    assert api.lease(NODE)["spec"]["renewTime"] == frozen
    wide = await kubectl("get", "node", NODE, "-o", "wide")
    assert wide.rc == 0, wide.err
    assert wide.out.splitlines()[1].split()[1] == "NotReady"
    described = await kubectl("describe", "node", NODE)
    assert described.rc == 0, described.err
    assert "NodeStatusUnknown" in described.out
    assert "Kubelet stopped posting node status." in described.out
    assert f"HolderIdentity:  {NODE}" in described.out
    api.kubelet_start(NODE)
    ready = api.condition(NODE, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
    assert api.lease(NODE)["spec"]["renewTime"] != frozen


async def test_a_kubelet_that_reports_not_ready_keeps_renewing(api: FakeKube) -> None:
    api.kubelet_start(NODE, renew=0.1, grace=0.5)
    api.kubelet_not_ready(NODE, "container runtime network not ready")
    before = api.lease(NODE)["spec"]["renewTime"]
    await until(lambda: api.lease(NODE)["spec"]["renewTime"] != before, within=5.0,
                what="the lease renewed")
    ready = api.condition(NODE, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False",
                                                                        "KubeletNotReady")
