"""The ``pod`` remedy and the actor's Kubernetes side, against the HTTPS test API server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edgeheal.config import PodRemedySettings
from edgeheal.kube import KubeClient
from edgeheal.lab.kubeapi import Credentials, FakeKube
from edgeheal.model import State
from edgeheal.remediation import Remediator
from edgeheal.remedies import RemedyError
from edgeheal.remedies.pod import PodRemedy
from tests.remediation.conftest import NODE, NS, OTHER
from tests.remediation.support import Clock, World, make_config, snapshot, until

SETTINGS = PodRemedySettings(namespace=NS, label_selector="app=flannel", ready_timeout=10.0)


async def test_probe_finds_this_nodes_pod(api: FakeKube, client: KubeClient) -> None:
    availability = await PodRemedy(client, SETTINGS, node=NODE).probe()
    assert availability.usable
    assert api.pod_on(NS, NODE)["metadata"]["name"] in availability.why


async def test_probe_on_a_node_without_flannel_pod_is_not_usable(client: KubeClient) -> None:
    availability = await PodRemedy(client, SETTINGS, node="edge-9").probe()
    assert not availability.usable
    assert "no Flannel pod app=flannel in namespace kube-flannel on node edge-9" in \
        availability.why


async def test_restart_deletes_exactly_this_nodes_pod_and_waits_for_ready(
        api: FakeKube, client: KubeClient) -> None:
    old = api.pod_on(NS, NODE)
    other = api.pod_on(NS, OTHER)
    outcome = await PodRemedy(client, SETTINGS, node=NODE).restart()
    assert outcome.target == f"pod {NS}/{old['metadata']['name']}"
    assert [(d["metadata"]["name"], d["metadata"]["uid"], d["spec"]["nodeName"])
            for d in api.deletions] == [(old["metadata"]["name"], old["metadata"]["uid"],
                                         NODE)]
    new = api.pod_on(NS, NODE)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["status"]["phase"] == "Running"
    assert new["metadata"]["name"] in outcome.detail
    assert api.pod_on(NS, OTHER) == other  # another node's pod is never touched
    assert any(p["metadata"]["name"] == "unrelated" for p in api.pods(NS, NODE))


async def test_a_forbidden_delete_is_a_config_problem(api: FakeKube, token: Credentials,
                                                      client: KubeClient) -> None:
    api.deny(token.user, "delete", "pods", NS)
    with pytest.raises(RemedyError, match="delete pods in namespace kube-flannel") as err:
        await PodRemedy(client, SETTINGS, node=NODE).restart()
    assert err.value.config_problem
    assert api.deletions == []


async def test_two_flannel_pods_on_the_node_means_a_rollout_and_no_delete(
        api: FakeKube, client: KubeClient) -> None:
    api.add_pod(NS, "kube-flannel-extra", NODE, {"app": "flannel"})
    with pytest.raises(RemedyError, match="rollout is in progress"):
        await PodRemedy(client, SETTINGS, node=NODE).restart()
    assert api.deletions == []


async def test_a_replacement_that_never_gets_ready_fails_the_restart(
        api: FakeKube, client: KubeClient) -> None:
    api.ready_delay = 60.0
    settings = PodRemedySettings(namespace=NS, label_selector="app=flannel", ready_timeout=1.0)
    with pytest.raises(RemedyError, match="no Ready replacement") as err:
        await PodRemedy(client, settings, node=NODE).restart()
    assert not err.value.config_problem


async def test_the_actor_restarts_the_pod_and_records_events_and_the_condition(
        api: FakeKube, token: Credentials, tmp_path: Path) -> None:
    """The whole pod path: auto picks ``pod``, one deletion of this node's pod, Events on
    the Node, the EdgeTunnelHealthy condition follows the tunnel."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token)
    config = make_config(tmp_path, kube=f'[kubernetes]\nkubeconfig = "{kubeconfig}"\n')
    world = World(config, Clock(step=0.01))
    rem = Remediator(world.ctx, boot_clock=lambda: world.clock.now + 4000.0, boot="b",
                     tick=0.001)
    try:
        await rem.resolve()
        assert rem.mode == "pod"
        assert "Flannel pod kube-flannel/kube-flannel-ds-" in rem.mode_why
        api.on_replace.append(lambda old, new: world.recover_after_restart())
        await rem.evaluate(world.snap)
        assert world.kinds() == ["remediation.restarted", "remediation.recovered"]
        assert len(api.deletions) == 1
        assert api.deleted_by == [token.user]
        await until(lambda: {e["reason"] for e in api.events} == {"FlannelRestarted",
                                                                  "FlannelRecovered"},
                    what="both Node events")
        await until(lambda: (api.condition(NODE, "EdgeTunnelHealthy") or {}).get("status")
                    == "False", what="condition False")
        assert all(e["involvedObject"]["name"] == NODE for e in api.events)
        # the tunnel is healthy: the condition turns True
        await rem.evaluate(snapshot(world.clock.now, wg=State.OK, wg_reason="ok",
                                    tunnel=State.OK))
        await until(lambda: (api.condition(NODE, "EdgeTunnelHealthy") or {}).get("status")
                    == "True", what="condition True")
    finally:
        for task in list(rem.reporter.background):
            task.cancel()
        await asyncio.gather(*rem.reporter.background, return_exceptions=True)
        await rem.kube().close()


async def test_a_403_on_events_turns_them_off_with_one_warning(
        api: FakeKube, token: Credentials, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    api.deny(token.user, "create", "events", "default")
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token)
    config = make_config(tmp_path, 'mode = "pod"\ndry_run = true',
                         kube=f'[kubernetes]\nkubeconfig = "{kubeconfig}"\n'
                              "node_condition = false\n")
    world = World(config, Clock(step=0.01))
    world.snap = snapshot(world.clock.now, direct=State.FAILED)
    rem = Remediator(world.ctx, boot_clock=lambda: world.clock.now + 4000.0, boot="b",
                     tick=0.001)
    try:
        await rem.resolve()
        await rem.evaluate(world.snap)
        await until(lambda: not rem.reporter.events, what="events turned off")
        assert "not recording Node Events any more" in caplog.text
        assert "create events in namespace default" in caplog.text
    finally:
        await asyncio.gather(*rem.reporter.background, return_exceptions=True)
        await rem.kube().close()
