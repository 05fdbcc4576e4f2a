"""The same Kubernetes path against a real K3s cluster, when one is pointed at.

    EDGEHEAL_TEST_KUBECONFIG=/etc/edgeheal/kubeconfig EDGEHEAL_TEST_NODE=edge-1 \\
        pytest tests/remediation/test_kube_real.py

uses the agent's own kubeconfig (made with ``edgeheal kubeconfig`` from
k3s-manifests/rbac.yaml) and only reads, except: ``EDGEHEAL_TEST_RESTART=1`` also deletes
that node's Flannel pod once and waits for the replacement (a few seconds of tunnel
outage on that node). Without the variables every test here is skipped.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from edgeheal.boundaries.kube import KubeClient, KubePermissionError
from edgeheal.config import KubernetesSettings, PodRemedySettings
from edgeheal.remedies.pod import PodRemedy

KUBECONFIG = os.environ.get("EDGEHEAL_TEST_KUBECONFIG", "")
NODE = os.environ.get("EDGEHEAL_TEST_NODE", "")
pytestmark = [
    pytest.mark.daemon,  # a real K3s cluster
    pytest.mark.skipif(not (KUBECONFIG and NODE),
                       reason="set EDGEHEAL_TEST_KUBECONFIG and EDGEHEAL_TEST_NODE"),
]
POD = PodRemedySettings()


@pytest.fixture
async def kube() -> AsyncIterator[KubeClient]:
    client = KubeClient(KubernetesSettings(kubeconfig=KUBECONFIG))
    try:
        yield client
    finally:
        await client.close()


async def test_the_node_has_exactly_one_flannel_pod(kube: KubeClient) -> None:
    pods, _ = await kube.list_pods(POD.namespace, POD.label_selector, NODE)
    assert len([p for p in pods if not p.deleting]) == 1
    availability = await PodRemedy(kube, POD, node=NODE).probe()
    assert availability.usable, availability.why


async def test_events_and_the_node_condition_are_allowed(kube: KubeClient) -> None:
    try:
        await kube.node_event(NODE, "EdgehealTest", "edgeheal test suite: API access works")
        await kube.set_node_condition(NODE, "EdgeTunnelHealthy", None, "TestRun",
                                      "edgeheal test suite")
    except KubePermissionError as err:
        pytest.fail(f"RBAC from k3s-manifests/rbac.yaml is not applied: {err}")


@pytest.mark.skipif(os.environ.get("EDGEHEAL_TEST_RESTART") != "1",
                    reason="set EDGEHEAL_TEST_RESTART=1 to restart this node's Flannel pod")
async def test_restarting_this_nodes_flannel_pod(kube: KubeClient) -> None:
    outcome = await PodRemedy(kube, POD, node=NODE).restart()
    assert outcome.target.startswith(f"pod {POD.namespace}/")
