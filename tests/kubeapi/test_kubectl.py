"""kubectl, the real client, against the stand-in: what it prints and exits with is what a
real API server makes it print (the answers are the API server's: status codes, Status
reasons and messages, object shapes, watch framing)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from edgeheal.lab.kubeapi import Credentials, FakeKube
from tests.kubeapi.conftest import NODE, NS, OTHER, Kubectl
from tests.support import until


def names(doc: dict[str, Any]) -> list[str]:
    return sorted(item["metadata"]["name"] for item in doc["items"])


async def test_version_and_api_resources_come_from_discovery(kubectl: Kubectl) -> None:
    version = await kubectl("version", "-o", "json")
    assert version.rc == 0, version.err
    assert version.json()["serverVersion"]["gitVersion"] == "v1.33.5+k3s1"
    resources = await kubectl("api-resources", "-o", "wide")
    assert resources.rc == 0, resources.err
    rows = {line.split()[0]: line.split() for line in resources.out.splitlines()[1:]}
    assert rows["pods"][1:5] == ["po", "v1", "true", "Pod"]
    assert rows["pods"][5] == "delete,get,list,watch"  # only the verbs it serves
    assert rows["nodes"][1:5] == ["no", "v1", "false", "Node"]
    assert "selfsubjectaccessreviews" in rows


async def test_get_pods_in_every_namespace_with_set_based_selectors(
        api: FakeKube, kubectl: Kubectl) -> None:
    flannel = sorted(p["metadata"]["name"] for p in api.pods(NS)
                     if p["metadata"]["labels"]["app"] == "flannel")
    found = await kubectl("get", "pods", "-A", "-o", "json",
                          "-l", "app in (flannel,canal),tier notin (x),!missing")
    assert found.rc == 0, found.err
    assert found.json()["kind"] == "List"
    assert names(found.json()) == flannel
    on_node = await kubectl("get", "pods", "-n", NS, "-o", "json",
                            "--field-selector", f"spec.nodeName={NODE},status.phase!=Failed")
    assert names(on_node.json()) == sorted([api.pod_on(NS, NODE)["metadata"]["name"],
                                            "unrelated"])


async def test_get_prints_the_servers_table(api: FakeKube, kubectl: Kubectl) -> None:
    table = await kubectl("get", "pods", "-n", NS, "-o", "wide")
    assert table.rc == 0, table.err
    header, *rows = table.out.splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE",
                              "NOMINATED", "NODE", "READINESS", "GATES"]
    mine = api.pod_on(NS, NODE)["metadata"]["name"]
    (row,) = [r.split() for r in rows if r.startswith(mine)]
    assert row[1:4] == ["1/1", "Running", "0"]
    assert row[6] == NODE
    nodes = await kubectl("get", "nodes")
    assert [line.split()[:2] for line in nodes.out.splitlines()[1:]] == [
        [NODE, "Ready"], [OTHER, "Ready"]]


async def test_errors_are_the_api_servers_statuses(api: FakeKube, kubectl: Kubectl,
                                                   kubectl_as: Any) -> None:
    missing = await kubectl("get", "pod", "nope", "-n", NS)
    assert missing.rc == 1
    assert 'Error from server (NotFound): pods "nope" not found' in missing.err
    api.allow("admin", "list", "widgets")  # authorized, but no such resource
    unknown = await kubectl("get", "--raw", "/api/v1/widgets")
    assert unknown.rc == 1
    assert "Error from server (NotFound): the server could not find the requested " \
        "resource" in unknown.err
    reader = api.add_user("reader")
    api.allow(reader.user, "list", "pods", NS)
    denied = await kubectl_as(reader)("get", "nodes")
    assert denied.rc == 1
    assert ('Error from server (Forbidden): nodes is forbidden: User "reader" cannot list '
            'resource "nodes" in API group "" at the cluster scope') in denied.err
    stranger = await kubectl_as(Credentials("stranger", token="not-a-token"))("get", "pods")
    assert stranger.rc == 1
    assert "Unauthorized" in stranger.err


async def test_auth_can_i_and_whoami_for_the_agents_account(agent: Credentials,
                                                            kubectl_as: Any) -> None:
    kubectl = kubectl_as(agent)
    answers = []
    for args in (("delete", "pods", "-n", NS), ("watch", "pods", "-n", NS),
                 ("delete", "pods", "-n", "default"), ("create", "events", "-n", "default"),
                 ("patch", "nodes", "--subresource=status"), ("list", "nodes"),
                 ("get", "secrets", "-n", NS), ("get", "nodes"),
                 ("get", "leases", "-n", "kube-node-lease")):
        result = await kubectl("auth", "can-i", *args)
        answers.append((result.rc, result.out.strip()))
    assert answers == [(0, "yes"), (0, "yes"), (1, "no"), (0, "yes"),
                       (0, "yes"), (1, "no"), (1, "no"), (0, "yes"), (0, "yes")]
    whoami = await kubectl("auth", "whoami", "-o", "json")
    assert whoami.rc == 0, whoami.err
    info = whoami.json()["status"]["userInfo"]
    assert info["username"] == agent.user
    assert "system:serviceaccounts:kube-flannel" in info["groups"]


async def test_delete_is_graceful_and_the_daemonset_replaces_the_pod(
        api: FakeKube, kubectl: Kubectl) -> None:
    old = api.pod_on(NS, NODE)
    name = old["metadata"]["name"]
    # the container stops well within the grace period, but after three kubectl runs on a
    # loaded machine (1 s was shorter than they took in a full CI run: the pod was gone)
    api.stop_delay = 8.0
    deleted = await kubectl("delete", "pod", name, "-n", NS, "--wait=false")
    assert deleted.rc == 0, deleted.err
    assert f'pod "{name}" deleted' in deleted.out
    listed = (await kubectl("get", "pods", "-n", NS, "-o", "json")).json()
    (terminating,) = [p for p in listed["items"] if p["metadata"]["name"] == name]
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    assert terminating["metadata"]["deletionTimestamp"]
    table = await kubectl("get", "pod", name, "-n", NS, "--no-headers")
    assert table.out.split()[2] == "Terminating"
    # the replacement comes up while the old pod is still listed
    await until(lambda: any(p["metadata"]["name"] == name for p in api.pods(NS))
                and _live_on(api, NODE), what="a replacement beside the Terminating pod")
    await until(lambda: all(p["metadata"]["name"] != name for p in api.pods(NS)),
                within=20.0, what="the Terminating pod gone after its container stopped")
    assert len(api.deletions) == 1


def _live_on(api: FakeKube, node: str) -> bool:
    try:
        api.pod_on(NS, node)
    except LookupError:
        return False
    return True


async def test_delete_waits_until_the_pod_is_gone(api: FakeKube, kubectl: Kubectl) -> None:
    name = api.pod_on(NS, OTHER)["metadata"]["name"]
    deleted = await kubectl("delete", "pod", name, "-n", NS, "--timeout=20s")
    assert deleted.rc == 0, deleted.err
    assert all(p["metadata"]["name"] != name for p in api.pods(NS))


async def test_a_server_dry_run_changes_nothing(api: FakeKube, kubectl: Kubectl) -> None:
    before = api.pod_on(NS, NODE)
    result = await kubectl("delete", "pod", before["metadata"]["name"], "-n", NS,
                           "--dry-run=server")
    assert result.rc == 0, result.err
    assert "(server dry run)" in result.out
    await asyncio.sleep(0.3)  # longer than the DaemonSet's replace delay
    assert api.pod_on(NS, NODE) == before
    assert api.deletions == []


async def test_a_forced_delete_removes_the_pod_at_once(api: FakeKube,
                                                       kubectl: Kubectl) -> None:
    name = api.pod_on(NS, NODE)["metadata"]["name"]
    result = await kubectl("delete", "pod", name, "-n", NS, "--grace-period=0", "--force")
    assert result.rc == 0, result.err
    assert all(p["metadata"]["name"] != name for p in api.pods(NS))
    assert api.deletions[0]["metadata"]["deletionGracePeriodSeconds"] == 0


async def test_watch_streams_the_graceful_deletion_and_the_replacement(
        api: FakeKube, kubectl: Kubectl) -> None:
    old = api.pod_on(NS, NODE)["metadata"]["name"]
    watch = await kubectl.start("get", "pods", "-n", NS, "-l", "app=flannel", "-w",
                                "--output-watch-events", "-o", "json",
                                "--request-timeout=6s")
    stdout = watch.stdout
    assert stdout is not None
    try:
        decoder = json.JSONDecoder()
        events: list[dict[str, Any]] = []
        buffer = ""

        async def read_until(done: Any) -> None:
            nonlocal buffer
            for _ in range(400):
                while buffer.strip():
                    try:
                        event, end = decoder.raw_decode(buffer.lstrip())
                    except ValueError:
                        break
                    events.append(event)
                    buffer = buffer.lstrip()[end:]
                if done():
                    return
                chunk = await asyncio.wait_for(stdout.read(65536), 10)
                if not chunk:
                    return
                buffer += chunk.decode()

        await read_until(lambda: len(events) >= 2)
        assert {e["type"] for e in events} == {"ADDED"}
        api_delete = await kubectl("delete", "pod", old, "-n", NS, "--wait=false")
        assert api_delete.rc == 0
        await read_until(lambda: any(e["type"] == "DELETED" for e in events) and any(
            e["object"]["metadata"]["name"] != old and e["object"]["status"]["phase"]
            == "Running" and e["type"] == "MODIFIED" for e in events))
    finally:
        if watch.returncode is None:
            watch.kill()
        await watch.wait()
    mine = [(e["type"], bool(e["object"]["metadata"].get("deletionTimestamp")))
            for e in events if e["object"]["metadata"]["name"] == old]
    assert mine[0] == ("ADDED", False)
    assert mine[1] == ("MODIFIED", True)
    assert mine[-1] == ("DELETED", True)
    new = [e["type"] for e in events if e["object"]["metadata"]["name"] != old
           and e["object"]["spec"]["nodeName"] == NODE]
    assert new[:2] == ["ADDED", "MODIFIED"]


async def test_raw_watch_framing_replay_bookmarks_and_expiry(api: FakeKube,
                                                             kubectl: Kubectl) -> None:
    path = f"/api/v1/namespaces/{NS}/pods"
    listed = (await kubectl("get", "--raw", path)).json()
    version = listed["metadata"]["resourceVersion"]
    name = api.pod_on(NS, NODE)["metadata"]["name"]
    assert (await kubectl("delete", "pod", name, "-n", NS, "--wait=false")).rc == 0
    api.bookmark_interval = 0.5
    replay = await kubectl("get", "--raw", f"{path}?watch=true&resourceVersion={version}"
                           "&timeoutSeconds=1&allowWatchBookmarks=true")
    assert replay.rc == 0, replay.err
    lines = [json.loads(line) for line in replay.out.splitlines()]  # one JSON per line
    assert (lines[0]["type"], lines[0]["object"]["metadata"]["name"]) == ("MODIFIED", name)
    assert lines[0]["object"]["metadata"]["deletionTimestamp"]
    assert "BOOKMARK" in {e["type"] for e in lines}
    api.compact()
    expired = await kubectl("get", "--raw",
                            f"{path}?watch=true&resourceVersion={version}&timeoutSeconds=5")
    assert expired.rc == 0, expired.err  # a watch answers 200; the error is in the stream
    (error,) = [json.loads(line) for line in expired.out.splitlines()]
    assert error["type"] == "ERROR"
    assert (error["object"]["kind"], error["object"]["code"], error["object"]["reason"]) \
        == ("Status", 410, "Expired")
    assert error["object"]["message"].startswith(f"too old resource version: {version}")
    bad = await kubectl("get", "--raw", f"{path}?watch=true&resourceVersion=abc")
    assert bad.rc == 1
    assert "Error from server (BadRequest)" in bad.err


async def test_describe_node_lists_its_pods_and_events(api: FakeKube, agent: Credentials,
                                                       kubectl: Kubectl,
                                                       tmp_path: Any) -> None:
    from edgeheal.boundaries.kube import KubeClient
    from edgeheal.config import KubernetesSettings

    client = KubeClient(KubernetesSettings(kubeconfig=str(api.write_kubeconfig(
        tmp_path / "agent", agent)), request_timeout=5.0, retries=0))
    try:
        await client.node_event(NODE, "FlannelRestarted", "restarted by edgeheal")
    finally:
        await client.close()
    described = await kubectl("describe", "node", NODE)
    assert described.rc == 0, described.err
    assert api.pod_on(NS, NODE)["metadata"]["name"] in described.out
    assert "FlannelRestarted" in described.out
    events = await kubectl("get", "events", "-A")
    assert events.rc == 0, events.err
    (row,) = events.out.splitlines()[1:]
    assert row.split()[:1] == ["default"]
    assert f"node/{NODE}" in row
    assert "FlannelRestarted" in row
