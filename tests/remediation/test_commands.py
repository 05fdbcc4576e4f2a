"""``edgeheal remediation pause|resume|reset`` over a real control socket, and
``edgeheal kubeconfig`` producing a kubeconfig that really reaches the test API server."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgeheal import cli
from edgeheal.agent.remediation import Remediator
from edgeheal.boundaries.control_socket import ControlServer
from edgeheal.boundaries.kube import KubeClient
from edgeheal.lab.kubeapi import Credentials, FakeKube
from tests.remediation.conftest import NODE, NS, settings_for
from tests.remediation.support import Clock, ScriptedRemedy, World, make_config


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[Path, Remediator]]:
    config = make_config(tmp_path, 'mode = "pod"')
    config_file = tmp_path / "edgeheal.toml"
    config_file.write_text(f'[agent]\nstate_dir = "{config.agent.state_dir}"\n')
    world = World(config, Clock())
    server = ControlServer(config.agent.state_dir)
    world.ctx = dataclasses.replace(world.ctx, control=server.register)
    rem = Remediator(world.ctx, remedy_factory={"pod": ScriptedRemedy()}.get,
                     boot_clock=lambda: world.clock.now + 4000.0, boot="b")
    await server.start()
    try:
        yield config_file, rem
    finally:
        await server.close()


async def edgeheal(*argv: str) -> int:
    return await asyncio.to_thread(cli.main, list(argv))


async def test_pause_for_a_duration_then_resume(agent: tuple[Path, Remediator],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    config_file, rem = agent
    assert await edgeheal("--config", str(config_file), "remediation", "pause",
                          "--for", "30m") == 0
    assert rem.history.paused(rem.clock())
    assert "remediation paused until 20" in capsys.readouterr().out
    assert await edgeheal("--config", str(config_file), "remediation", "resume") == 0
    assert not rem.history.paused(rem.clock())


async def test_pause_without_duration_is_indefinite(agent: tuple[Path, Remediator],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config_file, rem = agent
    assert await edgeheal("--config", str(config_file), "remediation", "pause") == 0
    assert "paused until resumed" in capsys.readouterr().out
    assert rem.view()["paused_until"] == "indefinite"


async def test_reset_closes_the_circuit(agent: tuple[Path, Remediator]) -> None:
    config_file, rem = agent
    rem.store(rem.history.opened())
    assert await edgeheal("--config", str(config_file), "remediation", "reset") == 0
    assert rem.view()["circuit"] == "closed"


async def test_a_bad_duration_is_a_usage_error(agent: tuple[Path, Remediator],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    config_file, rem = agent
    assert await edgeheal("--config", str(config_file), "remediation", "pause",
                          "--for", "a while") == 2
    assert "--for" in capsys.readouterr().err
    assert not rem.history.paused(rem.clock())


async def test_no_agent_running_is_exit_3(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    config_file = tmp_path / "edgeheal.toml"
    config_file.write_text(f'[agent]\nstate_dir = "{tmp_path}"\n')
    assert await edgeheal("--config", str(config_file), "remediation", "resume") == 3
    assert "not running" in capsys.readouterr().err


def token_secret(api: FakeKube, token: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
            "metadata": {"name": "edgeheal-edge-1-token", "namespace": NS, "annotations": {
                "kubernetes.io/service-account.name": "edgeheal-edge-1"}},
            "data": {"token": base64.b64encode(token.encode()).decode(),
                     "ca.crt": base64.b64encode(api.ca.cert_pem.bytes()).decode(),
                     "namespace": base64.b64encode(NS.encode()).decode()}}


async def test_kubeconfig_from_the_token_secret_reaches_the_api(
        api: FakeKube, token: Credentials, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(token_secret(api, token.token)))
    out = tmp_path / "etc" / "kubeconfig"
    assert await edgeheal("kubeconfig", "--server", api.url, "--secret", str(secret),
                          "--output", str(out)) == 0
    printed = capsys.readouterr()
    assert token.token not in printed.out + printed.err
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    kube = KubeClient(settings_for(out))
    try:
        pods, _ = await kube.list_pods(NS, "app=flannel", NODE)
    finally:
        await kube.close()
    assert len(pods) == 1
    # an existing file is not overwritten without --force
    assert await edgeheal("kubeconfig", "--server", api.url, "--secret", str(secret),
                          "--output", str(out)) == 2


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda s: s.update(kind="ConfigMap"), "expected a Secret"),
    (lambda s: s.update(type="Opaque"), "service-account-token"),
    (lambda s: s["data"].pop("token"), "no token yet"),
    (lambda s: s["data"].update(token="%%%"), "not valid base64"),
])
async def test_an_unusable_secret_is_a_usage_error_naming_why(
        api: FakeKube, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        mutate: object, message: str) -> None:
    secret = token_secret(api, "t")
    mutate(secret)  # type: ignore[operator]
    path = tmp_path / "secret.json"
    path.write_text(json.dumps(secret))
    assert await edgeheal("kubeconfig", "--server", "https://10.0.0.1:6443", "--secret",
                          str(path), "--output", str(tmp_path / "kc")) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "kc").exists()
