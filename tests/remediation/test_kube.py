"""The Kubernetes boundary against the HTTPS test API server, through real kubeconfig files."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from edgeheal.boundaries.kube import (
    KubeClient,
    KubeConflict,
    KubeError,
    KubePermissionError,
    Pod,
)
from edgeheal.config import KubernetesSettings
from edgeheal.lab.kubeapi import Credentials, FakeKube
from tests.remediation.conftest import NODE, NS, OTHER, Sleeps, settings_for

SELECTOR = "app=flannel"


async def test_listing_returns_only_this_nodes_flannel_pod(api: FakeKube,
                                                           client: KubeClient) -> None:
    pods, version = await client.list_pods(NS, SELECTOR, NODE)
    assert [p.node for p in pods] == [NODE]
    assert pods[0].name.startswith("kube-flannel-ds-")
    assert pods[0].ready
    assert version
    (logged,) = [r for r in api.requests if r.path.endswith("/pods")]
    assert "fieldSelector=spec.nodeName%3Dedge-1" in logged.query
    assert "labelSelector=app%3Dflannel" in logged.query


async def test_a_client_certificate_kubeconfig_works_like_k3s_ones(
        api: FakeKube, tmp_path: Path) -> None:
    creds = api.add_user("edgeheal-edge-1", cert=True)
    api.allow_agent(creds.user, NS)
    kube = KubeClient(settings_for(api.write_kubeconfig(tmp_path / "kc", creds)))
    try:
        pods, _ = await kube.list_pods(NS, SELECTOR, NODE)
    finally:
        await kube.close()
    assert len(pods) == 1
    assert api.requests[-1].user == "edgeheal-edge-1"


async def test_rejected_credentials_are_a_401_config_problem_without_the_token(
        api: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    stale = Credentials("nobody", token="s3cr3t-token-value")
    kube = KubeClient(settings_for(api.write_kubeconfig(tmp_path / "kc", stale)))
    try:
        with pytest.raises(KubePermissionError, match="unauthorized") as err:
            await kube.list_pods(NS, SELECTOR, NODE)
    finally:
        await kube.close()
    assert err.value.status == 401
    assert "s3cr3t" not in str(err.value)
    assert "s3cr3t" not in caplog.text
    assert len(api.requests) == 1  # never retried


async def test_a_missing_permission_is_a_403_naming_it(api: FakeKube, token: Credentials,
                                                       client: KubeClient) -> None:
    api.deny(token.user, "delete", "pods", NS)
    pod = Pod.from_json(api.pod_on(NS, NODE))
    with pytest.raises(KubePermissionError, match="delete pods in namespace kube-flannel"):
        await client.delete_pod(pod, NODE)
    assert api.deletions == []


async def test_delete_sends_the_uid_precondition_and_the_server_refuses_a_stale_one(
        api: FakeKube, client: KubeClient) -> None:
    pod = api.pod_on(NS, NODE)
    name = pod["metadata"]["name"]
    with pytest.raises(KubeConflict, match="Precondition failed"):
        await client.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}", what="delete",
                             body={"kind": "DeleteOptions",
                                   "preconditions": {"uid": "not-the-uid"}})
    assert api.deletions == []


async def test_a_replaced_pod_is_never_deleted(api: FakeKube, client: KubeClient) -> None:
    pod = Pod.from_json(api.pod_on(NS, NODE))
    await client.delete_pod(pod, NODE)
    stale = await client.wait_replacement(NS, SELECTOR, NODE, old_uid=pod.uid, within=5.0,
                                          clock=time.monotonic)
    # a pod object with the new name but an old uid: the re-check refuses
    with pytest.raises(KubeConflict, match="was replaced"):
        await client.delete_pod(Pod(NS, stale.name, pod.uid, NODE, "Running", True, False),
                                NODE)
    assert len(api.deletions) == 1


async def test_another_nodes_pod_is_never_deleted(api: FakeKube, client: KubeClient) -> None:
    other = Pod.from_json(api.pod_on(NS, OTHER))
    with pytest.raises(KubeConflict, match="not deleting another node's pod"):
        await client.delete_pod(other, NODE)
    assert api.deletions == []


async def test_delete_then_watch_until_the_replacement_is_ready(api: FakeKube,
                                                                client: KubeClient) -> None:
    pod = Pod.from_json(api.pod_on(NS, NODE))
    began = time.monotonic()
    deleted = await client.delete_pod(pod, NODE)
    assert deleted.uid == pod.uid
    assert deleted.deleting
    new = await client.wait_replacement(NS, SELECTOR, NODE, old_uid=pod.uid, within=10.0,
                                        clock=time.monotonic)
    assert new.uid != pod.uid
    assert new.name != pod.name
    assert new.node == NODE
    assert new.ready
    assert new.phase == "Running"
    assert time.monotonic() - began >= api.ready_delay  # it waited for Ready
    assert any("watch=true" in r.query for r in api.requests)
    assert [d["metadata"]["name"] for d in api.deletions] == [pod.name]
    assert api.deletions[0]["spec"]["nodeName"] == NODE
    assert Pod.from_json(api.pod_on(NS, OTHER)).ready  # the other node is untouched


async def test_a_replacement_that_never_turns_ready_times_out(api: FakeKube,
                                                              client: KubeClient) -> None:
    api.ready_delay = 60.0
    pod = Pod.from_json(api.pod_on(NS, NODE))
    await client.delete_pod(pod, NODE)
    began = time.monotonic()
    with pytest.raises(KubeError, match=r"no Ready replacement.*not ready"):
        await client.wait_replacement(NS, SELECTOR, NODE, old_uid=pod.uid, within=1.0,
                                      clock=time.monotonic)
    assert time.monotonic() - began < 5.0


async def test_429_is_retried_after_retry_after(api: FakeKube, client: KubeClient,
                                                sleeps: Sleeps) -> None:
    api.fail(429, times=2, retry_after=1.5, method="GET")
    pods, _ = await client.list_pods(NS, SELECTOR, NODE)
    assert len(pods) == 1
    assert sleeps.delays == [1.5, 1.5]
    assert [r.status for r in api.requests] == [429, 429, 200]


async def test_an_excessive_retry_after_is_capped(api: FakeKube, client: KubeClient,
                                                  sleeps: Sleeps) -> None:
    api.fail(429, retry_after=3600, method="GET")
    await client.list_pods(NS, SELECTOR, NODE)
    assert sleeps.delays == [30.0]


async def test_5xx_is_retried_with_jittered_exponential_backoff(
        api: FakeKube, client: KubeClient, sleeps: Sleeps) -> None:
    api.fail(500, times=3, method="GET")
    await client.list_pods(NS, SELECTOR, NODE)
    assert len(sleeps.delays) == 3
    for attempt, delay in enumerate(sleeps.delays):
        assert 0 <= delay <= 0.2 * 2 ** attempt


async def test_persistent_5xx_gives_up_after_the_configured_retries(
        api: FakeKube, client: KubeClient) -> None:
    api.fail(503, times=100, method="GET")
    with pytest.raises(KubeError, match=r"503.*gave up after 4 attempts"):
        await client.list_pods(NS, SELECTOR, NODE)
    assert len(api.requests) == 4


async def test_a_slow_answer_times_out_and_is_retried(api: FakeKube, token: Credentials,
                                                      tmp_path: Path, sleeps: Sleeps) -> None:
    api.slow(3.0, method="GET")
    kube = KubeClient(settings_for(api.write_kubeconfig(tmp_path / "kc", token),
                                   request_timeout=0.5, retries=2), sleep=sleeps)
    began = time.monotonic()
    try:
        pods, _ = await kube.list_pods(NS, SELECTOR, NODE)
    finally:
        await kube.close()
    assert len(pods) == 1
    assert len(sleeps.delays) == 1  # one timeout, one retry
    assert time.monotonic() - began < 2.5  # did not wait for the slow answer


async def test_an_event_is_recorded_on_the_node(api: FakeKube, client: KubeClient) -> None:
    await client.node_event(NODE, "FlannelRestarted", "edgeheal restarted pod x",
                            warning=True)
    (event,) = api.events
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE,
                                       "uid": NODE}
    assert event["source"]["component"] == "edgeheal"
    assert (event["reason"], event["type"]) == ("FlannelRestarted", "Warning")
    assert event["metadata"]["namespace"] == "default"


async def test_the_node_condition_is_merged_by_type(api: FakeKube,
                                                    client: KubeClient) -> None:
    await client.set_node_condition(NODE, "EdgeTunnelHealthy", False, "TunnelStalled", "m")
    await client.set_node_condition(NODE, "EdgeTunnelHealthy", True, "TunnelHealthy", "m")
    cond = api.condition(NODE, "EdgeTunnelHealthy")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "TunnelHealthy")
    kubelet = api.condition(NODE, "Ready")
    assert kubelet is not None
    assert kubelet["status"] == "True"


async def test_no_permission_on_node_status_names_it(api: FakeKube, token: Credentials,
                                                     client: KubeClient) -> None:
    api.deny(token.user, "patch", "nodes/status")
    with pytest.raises(KubePermissionError, match="nodes/status"):
        await client.set_node_condition(NODE, "EdgeTunnelHealthy", True, "r", "m")


async def test_a_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    kube = KubeClient(settings_for(tmp_path / "absent"))
    with pytest.raises(KubeError, match=r"cannot load Kubernetes credentials from .*absent"):
        await kube.list_pods(NS, SELECTOR, NODE)


async def test_in_cluster_credentials_work_and_a_rotated_token_is_reread(
        api: FakeKube, token: Credentials, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(token.token)
    (account / "ca.crt").write_bytes(api.ca.cert_pem.bytes())
    (account / "namespace").write_text(NS)
    host, port = api.url.removeprefix("https://").rsplit(":", 1)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    kube = KubeClient(KubernetesSettings(kubeconfig=""), service_account=str(account))
    try:
        pods, _ = await kube.list_pods(NS, SELECTOR, NODE)
        assert len(pods) == 1
        # kubelet rotates the projected token: the old one is revoked, the file rewritten
        fresh = api.add_user(token.user)
        api.revoke(token)
        (account / "token").write_text(fresh.token)
        pods, _ = await kube.list_pods(NS, SELECTOR, NODE)
        assert len(pods) == 1
    finally:
        await kube.close()
    assert [r.status for r in api.requests][-2:] == [401, 200]


async def test_a_stale_resource_version_precondition_is_a_409(api: FakeKube,
                                                              client: KubeClient) -> None:
    pod = api.pod_on(NS, NODE)
    name = pod["metadata"]["name"]
    api.set_ready(NS, name, True)  # a change: the version read before is stale now
    with pytest.raises(KubeConflict, match="ResourceVersion in precondition"):
        await client.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}", what="delete",
                             body={"kind": "DeleteOptions", "preconditions": {
                                 "resourceVersion": pod["metadata"]["resourceVersion"]}})
    assert api.deletions == []


async def test_a_watch_from_a_compacted_version_ends_with_410_expired(
        api: FakeKube, client: KubeClient) -> None:
    _, version = await client.list_pods(NS, SELECTOR, NODE)
    api.set_ready(NS, api.pod_on(NS, NODE)["metadata"]["name"], True)
    api.compact()
    with pytest.raises(KubeError, match="too old resource version") as err:
        async for _ in client.watch_pods(NS, SELECTOR, NODE, version, 5.0):
            pass
    assert err.value.status == 410


async def test_a_dry_run_delete_changes_nothing(api: FakeKube, client: KubeClient) -> None:
    pod = api.pod_on(NS, NODE)
    name = pod["metadata"]["name"]
    answer = await client.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}",
                                  what="delete", params={"dryRun": "All"})
    assert answer["metadata"]["deletionTimestamp"]
    assert api.pod_on(NS, NODE) == pod  # same resourceVersion: nothing happened
    assert api.deletions == []
