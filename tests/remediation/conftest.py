"""Fixtures: the HTTPS test API server (edgeheal.lab.kubeapi) and clients that reach it
through a real kubeconfig file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgeheal.boundaries.kube import KubeClient
from edgeheal.config import KubernetesSettings
from edgeheal.lab.kubeapi import Credentials, FakeKube

NODE, OTHER = "edge-1", "edge-2"
NS = "kube-flannel"
AGENT_USER = "system:serviceaccount:kube-flannel:edgeheal-edge-1"


@pytest.fixture
async def api() -> AsyncIterator[FakeKube]:
    server = FakeKube(ready_delay=0.3, replace_delay=0.05)
    server.add_node(NODE)
    server.add_node(OTHER)
    server.add_daemonset(NS, "kube-flannel-ds", {"app": "flannel", "tier": "node"})
    server.add_pod(NS, "unrelated", NODE, {"app": "other"})
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
def token(api: FakeKube) -> Credentials:
    creds = api.add_user(AGENT_USER)
    api.allow_agent(creds.user, NS)
    return creds


class Sleeps:
    """An injected sleep that records the delays asked for and yields without waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        import asyncio

        self.delays.append(delay)
        await asyncio.sleep(0)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def settings_for(path: Path, **kw: object) -> KubernetesSettings:
    base = {"kubeconfig": str(path), "request_timeout": 2.0, "retries": 3}
    base.update(kw)
    return KubernetesSettings(**base)  # type: ignore[arg-type]


@pytest.fixture
async def client(api: FakeKube, token: Credentials, tmp_path: Path,
                 sleeps: Sleeps) -> AsyncIterator[KubeClient]:
    path = api.write_kubeconfig(tmp_path / "kubeconfig", token)
    kube = KubeClient(settings_for(path), sleep=sleeps)
    try:
        yield kube
    finally:
        await kube.close()
