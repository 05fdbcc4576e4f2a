"""Issue 17, finding 1: no credential reaches /status, the log or an error.

A kubeconfig token written as a YAML block scalar (``token: |``) ends in a newline; the HTTP
client refused the header with ``Illegal header value b'Bearer <token>\\n'`` and that text,
token included, reached ``remediation.why`` in ``/status`` and an info log line. Now the
token is checked before use (``check-config`` refuses the file naming the key; the client
refuses to send it, naming the key), and a transport error is described without its text,
so even a header the check did not foresee cannot leak. Each layer is tested on its own:
the last one with the first switched off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgeheal.agent.remediation import Remediator
from edgeheal.base import compat
from edgeheal.boundaries import kube
from edgeheal.boundaries.kube import KubeClient, KubeError
from edgeheal.config import KubernetesSettings
from edgeheal.lab.kubeapi import FakeKube
from tests.remediation.support import Clock, World, make_config

TOKEN = "edgehealTESTtoken.s3cr3t-value_0123456789"
NODE, NS = "edge-1", "kube-flannel"


@pytest.fixture
async def api() -> AsyncIterator[FakeKube]:
    server = FakeKube(ready_delay=0.2, replace_delay=0.05)
    server.add_node(NODE)
    server.add_daemonset(NS, "kube-flannel-ds", {"app": "flannel"})
    await server.start()
    try:
        yield server
    finally:
        await server.close()


def block_scalar_kubeconfig(api: FakeKube, path: Path, token: str = TOKEN) -> Path:
    """The finding's file: the API server's real kubeconfig with the (valid) token written
    as ``token: |`` — a trailing newline the server never issued."""
    creds = api.add_user(f"system:serviceaccount:{NS}:edgeheal-{NODE}", token=token)
    api.allow_agent(creds.user, NS)
    api.write_kubeconfig(path, creds)
    text = path.read_text(encoding="utf-8")
    assert f"token: {token}\n" in text
    path.write_text(text.replace(f"token: {token}\n", f"token: |\n      {token}\n"),
                    encoding="utf-8")
    import yaml  # type: ignore[import-untyped]

    assert yaml.safe_load(path.read_text())["users"][0]["user"]["token"] == token + "\n"
    return path


def test_check_config_refuses_the_token_naming_the_key_not_the_value(
        api: FakeKube, tmp_path: Path) -> None:
    kubeconfig = block_scalar_kubeconfig(api, tmp_path / "kubeconfig")
    cfg = tmp_path / "edge.toml"
    cfg.write_text(f'[agent]\nnode_name = "{NODE}"\nstate_dir = "{tmp_path}/state"\n'
                   f'[kubernetes]\nkubeconfig = "{kubeconfig}"\n[remediation]\nmode = "pod"\n')
    proc = subprocess.run([sys.executable, "-m", "edgeheal", "check-config", "--config",
                           str(cfg)], capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert (f"{cfg}: kubernetes.kubeconfig: {kubeconfig}: users[edgeheal].user.token ends "
            "with a line break") in proc.stderr
    assert "the value is not shown" in proc.stderr
    assert TOKEN not in proc.stdout + proc.stderr
    assert TOKEN[:12] not in proc.stdout + proc.stderr


@pytest.mark.parametrize(("token", "problem"), [
    (TOKEN + "\n", "ends with a line break"),
    (TOKEN + "\r\n", "ends with a line break"),
    (TOKEN[:10] + "\n" + TOKEN[10:], "contains a line break"),
    (TOKEN[:10] + " " + TOKEN[10:], "space or tab"),
    (TOKEN[:10] + "\x7f" + TOKEN[10:], "printable ASCII"),
    (TOKEN[:10] + "é" + TOKEN[10:], "printable ASCII"),
    ("", "is empty"),
    (12345, "not a string"),
])
def test_a_token_that_cannot_be_a_header_is_named_not_shown(token: object, problem: str) -> None:
    said = kube.token_problem(token)
    assert problem in said
    assert TOKEN[5:15] not in said
    assert kube.token_problem(TOKEN) == ""


@pytest.mark.parametrize("guard", ["on", "off"])
async def test_the_remediator_view_and_log_never_carry_the_token(
        api: FakeKube, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch, guard: str) -> None:
    """The finding through the remediator (the real pod remedy, the real client, the test
    API): ``why`` says what is wrong and never holds the token — with the token check on,
    and with it off so the HTTP library's own error (which quotes the header) is met."""
    kubeconfig = block_scalar_kubeconfig(api, tmp_path / "kubeconfig")
    if guard == "off":
        monkeypatch.setattr(kube, "token_problem", lambda token: "")
    config = make_config(tmp_path, 'mode = "pod"', kube=(
        f'[kubernetes]\nkubeconfig = "{kubeconfig}"\nretries = 0\n'
        "events = false\nnode_condition = false\n"))
    world = World(config, Clock())
    client = KubeClient(config.kubernetes or KubernetesSettings())
    caplog.set_level(logging.DEBUG)
    try:
        rem = Remediator(world.ctx, kube=client, boot_clock=lambda: world.clock.now + 4000.0,
                         boot="boot-a", tick=0.001)
        await rem.resolve()
        view = rem.view()
    finally:
        await client.close()
    why = view["why"]
    assert why.startswith("configured; not usable now: cannot list Flannel pods:"), why
    if guard == "on":
        assert "the token of context 'edgeheal' ends with a line break" in why
    else:
        assert "LocalProtocolError: the request is not valid HTTP" in why
        assert "Bearer" not in why
    everything = json.dumps(view) + caplog.text
    assert TOKEN not in everything
    assert TOKEN[:12] not in everything
    assert why in caplog.text  # the log line the finding saw, now without the token
    assert not api.requests  # the header was never sent: refused before, or by h11


async def test_a_transport_error_is_described_without_its_text(api: FakeKube,
                                                               tmp_path: Path) -> None:
    """The real h11 error quotes the header; the KubeError and its cause never do."""
    path = block_scalar_kubeconfig(api, tmp_path / "kubeconfig")
    client = KubeClient(KubernetesSettings(kubeconfig=str(path), retries=0))
    original = kube.token_problem
    kube.token_problem = lambda token: ""  # type: ignore[assignment]
    try:
        with pytest.raises(KubeError) as caught:
            await client.list_pods(NS, "app=flannel", NODE)
    finally:
        kube.token_problem = original
        await client.close()
    chain: list[BaseException] = []
    err: BaseException | None = caught.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    assert all(TOKEN not in str(e) and TOKEN not in repr(e) for e in chain)
    assert "LocalProtocolError" in str(caught.value)


async def test_a_real_agent_keeps_the_token_out_of_status_and_its_log(
        api: FakeKube, tmp_path: Path) -> None:
    """`edgeheal run` (it does not refuse a bad credential file at start: the probes must
    keep serving) with the finding's kubeconfig and the test API: /status says what is
    wrong with the token, and neither /status nor the log holds it."""
    kubeconfig = block_scalar_kubeconfig(api, tmp_path / "kubeconfig")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cfg = tmp_path / "edge.toml"
    cfg.write_text(f'[agent]\nnode_name = "{NODE}"\nstate_dir = "{tmp_path}/state"\n'
                   f'[http]\nlisten = ["127.0.0.1:{port}"]\n[wireguard]\nenabled = false\n'
                   # a check that runs every second, so /status is refreshed; it matches
                   # no interface, so it changes nothing on this machine
                   '[offload]\ninterfaces = ["edgeheal-none-*"]\ninterval = "1s"\n'
                   f'[kubernetes]\nkubeconfig = "{kubeconfig}"\nretries = 0\n'
                   '[remediation]\nmode = "pod"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    env["EDGEHEAL_LOG_LEVEL"] = "debug"
    log_file = tmp_path / "agent.log"
    with log_file.open("w") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "edgeheal", "run", "--config", str(cfg), env=env,
            stdout=log, stderr=log)
    try:
        def remediation_why() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status",
                                            timeout=2) as resp:
                    body = resp.read().decode()
            except OSError:
                return ""
            why = str((json.loads(body).get("remediation") or {}).get("why") or "")
            return body if "not usable now" in why else ""

        deadline = time.monotonic() + 30
        body = ""
        for _ in range(300):
            body = await asyncio.to_thread(remediation_why)
            if body or time.monotonic() > deadline or proc.returncode is not None:
                break
            await asyncio.sleep(0.1)
        assert body, f"no remediation verdict in /status; log:\n{log_file.read_text()}"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except compat.TimeoutErrors:
                proc.kill()
                await proc.wait()
    log_text = log_file.read_text()
    assert "ends with a line break" in json.loads(body)["remediation"]["why"]
    for text in (body, log_text):
        assert TOKEN not in text
        assert TOKEN[:12] not in text
    with contextlib.suppress(FileNotFoundError):
        assert "Bearer" not in log_text


@pytest.mark.parametrize("body", [
    f"Authorization: Bearer {TOKEN} is not valid",
    json.dumps({"kind": "Status", "message": f"invalid bearer token {TOKEN}: bearer {TOKEN}"}),
])
def test_an_api_answer_that_echoes_the_header_is_blanked(body: str) -> None:
    """A server or proxy may echo the request's header in its error: never repeated."""
    import httpx2

    said = kube._status_message(httpx2.Response(400, text=body), TOKEN)
    assert TOKEN not in said
    assert "<redacted>" in said
