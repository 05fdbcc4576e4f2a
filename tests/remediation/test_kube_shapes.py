"""Issue 27, finding 5: an API that answers garbage gets the client's own error, and the
remediation records a failed attempt with its alert.

A list where an object belongs, nesting deeper than the decoder goes, a number where a
string belongs, bytes that are not JSON, a watch ERROR whose object is a string: each
escaped as ``AttributeError``/``RecursionError``/``TypeError``, crash-looping the remediation
task (once after the Flannel pod was deleted, with no alert). Every answer here comes from
the test API server (:meth:`FakeKube.answer`) through the real client; each must become a
:class:`KubeError` that names the call, and never quote the garbage.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from edgeheal.agent.remediation import Remediator
from edgeheal.boundaries.kube import KubeClient, KubeError, Pod
from edgeheal.lab.kubeapi import Credentials, FakeKube
from edgeheal.model import State
from edgeheal.remedies import RemedyError
from edgeheal.remedies.pod import PodRemedy
from tests.remediation.conftest import NODE, NS
from tests.remediation.support import Clock, ScriptedRemedy, World, make_config, snapshot
from tests.remediation.test_pod_remedy import SETTINGS

DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 50_000 + b"1" + b"}" * 50_000
POD_GARBAGE: list[tuple[str, Any]] = [
    ("a list", [1, 2, 3]),
    ("a string", "pod"),
    ("a number", 42),
    ("null", None),
    ("metadata a list", {"metadata": ["name", "x"]}),
    ("metadata a string", {"metadata": "x"}),
    ("spec a number", {"metadata": {"name": "x"}, "spec": 7}),
    ("status a list", {"metadata": {"name": "x"}, "status": []}),
    ("conditions an object", {"status": {"conditions": {"type": "Ready"}}}),
    ("a condition a string", {"status": {"conditions": ["Ready"]}}),
    ("a condition type a list", {"status": {"conditions": [{"type": ["Ready"]}]}}),
    ("name a number", {"metadata": {"name": 12}}),
    ("uid an object", {"metadata": {"uid": {"x": 1}}}),
    ("nodeName a list", {"spec": {"nodeName": ["edge-1"]}}),
    ("deletionTimestamp a number", {"metadata": {"deletionTimestamp": 5}}),
    ("phase true", {"status": {"phase": True}}),
    ("nested too deep", DEEP),
    ("an object nested too deep", DEEP_OBJECT),
    ("not JSON", b"<html>502 Bad Gateway</html>"),
    ("not UTF-8", b'{"metadata": {"name": "\xff\xfe"}}'),
    ("truncated JSON", b'{"metadata": {"name": "kube-fla'),
]
LIST_GARBAGE: list[tuple[str, Any]] = [
    ("a bare list", [{"metadata": {"name": "x"}}]),
    ("items an object", {"items": {"metadata": {}}}),
    ("items a string", {"items": "pods"}),
    ("an item a list", {"items": [[1]]}),
    ("an item a number", {"items": [3]}),
    ("metadata a list", {"items": [], "metadata": []}),
    ("resourceVersion a number", {"items": [], "metadata": {"resourceVersion": 5}}),
    ("continue an object", {"items": [], "metadata": {"continue": {"x": 1}}}),
    ("nested too deep", DEEP),
    ("not JSON", b"\x00\x01\x02"),
]
WATCH_GARBAGE: list[tuple[str, bytes]] = [
    ("an event a list", b"[1, 2]\n"),
    ("an event a string", b'"ADDED"\n'),
    ("type a list", b'{"type": ["ADDED"], "object": {}}\n'),
    ("object a list", b'{"type": "ADDED", "object": []}\n'),
    ("object missing", b'{"type": "ADDED"}\n'),
    ("ERROR object a string", b'{"type": "ERROR", "object": "gone"}\n'),
    ("ERROR message a list", b'{"type": "ERROR", "object": {"message": ["x"]}}\n'),
    ("a pod's metadata a list", b'{"type": "ADDED", "object": {"metadata": [1]}}\n'),
    ("nested too deep", DEEP + b"\n"),
    ("not JSON", b"event: added\n"),
]
ERROR_GARBAGE: list[tuple[str, bytes]] = [
    ("an error body nested too deep", DEEP),
    ("an error body a list", b"[1]"),
    ("an error body not UTF-8", b"\xff\xfe\xfd"),
]
SECRETISH = "edgeheal-garbage-marker"


def _pods_path(name: str = "") -> str:
    return rf"/namespaces/{NS}/pods/{name}$" if name else rf"/namespaces/{NS}/pods$"


def _clear(err: BaseException) -> None:
    assert isinstance(err, KubeError), repr(err)
    assert SECRETISH not in str(err)
    assert len(str(err)) < 600, str(err)


@pytest.mark.parametrize(("case", "body"), POD_GARBAGE, ids=[c for c, _ in POD_GARBAGE])
async def test_a_garbage_pod_is_a_kube_error(api: FakeKube, client: KubeClient, case: str,
                                             body: Any) -> None:
    name = api.pod_on(NS, NODE)["metadata"]["name"]
    api.answer(body, method="GET", path=_pods_path(name))
    with pytest.raises(KubeError) as err:
        await client.get_pod(NS, name)
    _clear(err.value)
    assert f"get pod {NS}/{name}" in str(err.value) or "get pods" in str(err.value)


@pytest.mark.parametrize(("case", "body"), LIST_GARBAGE, ids=[c for c, _ in LIST_GARBAGE])
async def test_a_garbage_list_is_a_kube_error(api: FakeKube, client: KubeClient, case: str,
                                              body: Any) -> None:
    api.answer(body, method="GET", path=_pods_path())
    with pytest.raises(KubeError, match=f"list pods in namespace {NS}") as err:
        await client.list_pods(NS, "app=flannel", NODE)
    _clear(err.value)


@pytest.mark.parametrize(("case", "body"), WATCH_GARBAGE, ids=[c for c, _ in WATCH_GARBAGE])
async def test_a_garbage_watch_event_is_a_kube_error(api: FakeKube, client: KubeClient,
                                                     case: str, body: bytes) -> None:
    api.answer(body, method="GET", path=_pods_path(), query="watch=true")
    with pytest.raises(KubeError, match=f"watch pods in namespace {NS}") as err:
        async for _ in client.watch_pods(NS, "app=flannel", NODE, "", 5.0):
            pass
    _clear(err.value)


@pytest.mark.parametrize(("case", "body"), ERROR_GARBAGE, ids=[c for c, _ in ERROR_GARBAGE])
async def test_a_garbage_error_answer_is_a_kube_error_with_the_status(
        api: FakeKube, client: KubeClient, case: str, body: bytes) -> None:
    api.answer(body, status=400, method="GET", path=_pods_path())
    with pytest.raises(KubeError, match="answered 400") as err:
        await client.list_pods(NS, "app=flannel", NODE)
    assert err.value.status == 400
    _clear(err.value)


async def test_a_garbage_delete_answer_is_a_kube_error(api: FakeKube,
                                                       client: KubeClient) -> None:
    pod = Pod.from_json(api.pod_on(NS, NODE))
    api.answer({"kind": "Pod", "metadata": "deleted"}, method="DELETE")
    with pytest.raises(KubeError, match="delete pod"):
        await client.delete_pod(pod, NODE)


async def test_the_remedy_turns_garbage_after_the_delete_into_a_remedy_error(
        api: FakeKube, client: KubeClient) -> None:
    """The crash of the issue: the pod was deleted, then the list answered garbage."""
    api.before(lambda: api.answer({"items": "gone"}, method="GET", path=_pods_path()),
               method="DELETE")
    with pytest.raises(RemedyError, match=r"deleted kube-flannel/.*items is a string"):
        await PodRemedy(client, SETTINGS, node=NODE).restart()
    assert len(api.deletions) == 1


async def test_the_actor_records_a_failed_attempt_with_its_alert_on_garbage(
        api: FakeKube, token: Credentials, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token)
    config = make_config(tmp_path, 'mode = "pod"',
                         kube=f'[kubernetes]\nkubeconfig = "{kubeconfig}"\n'
                              "events = false\nnode_condition = false\n")
    world = World(config, Clock(step=0.01))
    rem = Remediator(world.ctx, boot_clock=lambda: world.clock.now + 4000.0, boot="b",
                     tick=0.001)
    try:
        await rem.resolve()
        api.before(lambda: api.answer(DEEP, method="GET", path=_pods_path()),
                   method="DELETE")
        await rem.evaluate(world.snap)
    finally:
        await rem.kube().close()
    assert world.kinds() == ["remediation.failed"]
    (failed,) = world.events
    assert "nested too deeply" in failed.message
    assert failed.detail["result"] == "failed"
    assert world.metric("restart", "failed") == 1
    assert rem.history.records[-1].result == "failed"
    assert len(api.deletions) == 1


async def test_a_remedy_that_raises_anything_else_is_a_failed_attempt(
        tmp_path: Path) -> None:
    """A bug in a remedy must not crash-loop the actor: failed, alerted, recorded."""
    def broken() -> None:
        raise AttributeError("'list' object has no attribute 'get'")

    world = World(make_config(tmp_path, 'mode = "pod"'), Clock(step=0.01))
    remedy = ScriptedRemedy(on_restart=broken)
    rem = Remediator(world.ctx, remedy_factory={"pod": remedy}.get,
                     boot_clock=lambda: world.clock.now + 4000.0, boot="b", tick=0.001)
    await rem.resolve()
    await rem.evaluate(snapshot(world.clock.now, wg=State.FAILED))
    await asyncio.sleep(0)
    assert world.kinds() == ["remediation.failed"]
    assert "AttributeError" in world.events[0].message
    assert world.metric("restart", "failed") == 1
    assert rem.history.records[-1].result == "failed"
