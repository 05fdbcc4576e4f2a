"""The ``pod`` remedy and the actor's Kubernetes side, against the HTTPS test API server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from edgeheal.agent.remediation import Remediator
from edgeheal.boundaries.kube import KubeClient
from edgeheal.config import PodRemedySettings
from edgeheal.lab.kubeapi import Credentials, FakeKube
from edgeheal.model import State
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


# --- the API's realism: graceful deletion, watch expiry, precondition races ---------------

def delete_requests(api: FakeKube) -> list[str]:
    return [r.path for r in api.requests if r.method == "DELETE"]


async def test_a_terminating_pod_is_waited_out_counted_once_and_never_deleted_again(
        api: FakeKube, client: KubeClient) -> None:
    """The old pod stays listed, Terminating, long after its replacement is Ready."""
    api.stop_delay = 30.0
    old = api.pod_on(NS, NODE)
    remedy = PodRemedy(client, SETTINGS, node=NODE)
    outcome = await remedy.restart()
    (going,) = api.terminating(NS, NODE)
    assert going["metadata"]["uid"] == old["metadata"]["uid"]
    assert going["metadata"]["deletionGracePeriodSeconds"] == 30
    new = api.pod_on(NS, NODE)
    assert new["metadata"]["name"] in outcome.detail
    # two Flannel pods listed on the node, one of them Terminating: no "rollout" refusal
    availability = await remedy.probe()
    assert availability.usable
    assert new["metadata"]["name"] in availability.why
    # a second restart deletes the live replacement, never the Terminating pod again
    await remedy.restart()
    assert [d["metadata"]["uid"] for d in api.deletions] == [old["metadata"]["uid"],
                                                            new["metadata"]["uid"]]
    assert len(delete_requests(api)) == 2


async def test_a_pod_someone_else_deleted_is_not_deleted_again_its_replacement_awaited(
        api: FakeKube, client: KubeClient) -> None:
    api.stop_delay, api.replace_delay = 30.0, 0.5
    old = api.pod_on(NS, NODE)
    name = old["metadata"]["name"]
    await client.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}", what="kubectl")
    outcome = await PodRemedy(client, SETTINGS, node=NODE).restart()
    assert "was already terminating" in outcome.detail
    assert outcome.target == f"pod {NS}/{name}"
    assert len(delete_requests(api)) == 1  # only the other party's
    assert api.pod_on(NS, NODE)["metadata"]["uid"] != old["metadata"]["uid"]


async def test_a_watch_that_expires_mid_restart_is_followed_by_a_new_list_and_watch(
        api: FakeKube, client: KubeClient, sleeps: Any) -> None:
    api.ready_delay = 1.0
    loop = asyncio.get_running_loop()
    api.before(lambda: loop.call_later(0.2, api.expire_watches), method="GET",
               query="watch=true", times=1)
    outcome = await PodRemedy(client, SETTINGS, node=NODE).restart()
    assert api.pod_on(NS, NODE)["metadata"]["name"] in outcome.detail
    pod_reads = ["watch" if "watch=true" in r.query else "list" for r in api.requests
                 if r.method == "GET" and r.path == f"/api/v1/namespaces/{NS}/pods"]
    assert pod_reads[:5] == ["list", "list", "watch", "list", "watch"]  # find, wait: 410
    assert sleeps.delays == []  # 410 means "re-list now", not "back off"


async def test_a_pod_recreated_between_the_check_and_the_delete_is_a_409_not_a_deletion(
        api: FakeKube, client: KubeClient) -> None:
    name = api.pod_on(NS, NODE)["metadata"]["name"]
    api.before(lambda: api.recreate(NS, name), method="DELETE", times=1)
    with pytest.raises(RemedyError, match="Precondition failed: UID in precondition") as err:
        await PodRemedy(client, SETTINGS, node=NODE).restart()
    assert not err.value.config_problem
    assert api.deletions == []
    assert [r.status for r in api.requests if r.method == "DELETE"] == [409]


async def test_dry_run_never_deletes_the_agent_uses_no_server_dry_run(
        api: FakeKube, token: Credentials, tmp_path: Path) -> None:
    """``dry_run`` is the actor's: it decides, reports and never calls the remedy's restart,
    so no DELETE (not even ``?dryRun=All``) reaches the API."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token)
    config = make_config(tmp_path, 'mode = "pod"\ndry_run = true',
                         kube=f'[kubernetes]\nkubeconfig = "{kubeconfig}"\n'
                              "node_condition = false\n")
    world = World(config, Clock(step=0.01))
    rem = Remediator(world.ctx, boot_clock=lambda: world.clock.now + 4000.0, boot="b",
                     tick=0.001)
    try:
        await rem.resolve()
        await rem.evaluate(world.snap)
        assert "remediation.restarted" not in world.kinds()
        await until(lambda: any(e["reason"] == "FlannelRestarted" for e in api.events)
                    or bool(world.kinds()), what="the dry run reported")
    finally:
        await asyncio.gather(*rem.reporter.background, return_exceptions=True)
        await rem.kube().close()
    assert delete_requests(api) == []
    assert api.deletions == []
