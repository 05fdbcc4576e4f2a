"""``edgeheal bundle``: every kind of secret planted, none in the archive; bounded; agent down.

The end-to-end tests run the real command against a real agent (``edgeheal run`` on
loopback, its log in a file as ``--log-file`` reads it) whose configuration names every
kind of secret file the configuration can hold — an MQTT password file, a TLS client key, a
kubeconfig with a token (a JWT, as a ServiceAccount's is) and a client key — and whose log
has secrets a library could have printed (a bearer header, WireGuard keys as ``wg
showconf`` and the UAPI print them, a URL with a password). Then they read every byte of
every member.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgeheal.base import compat
from edgeheal.tools.bundle.members import Options, journal_member
from edgeheal.tools.bundle.redaction import scrub

NODE = "edge-bundle"


def _b64(n: int) -> str:
    return base64.b64encode(secrets.token_bytes(n)).decode()


@dataclass
class Secrets:
    password: str
    pem_lines: list[str]
    token: str
    client_key_lines: list[str]
    client_key_data: str
    wg_private: str
    wg_preshared: str
    wg_uapi_hex: str
    bearer: str
    url_password: str

    def all(self) -> list[str]:
        return [self.password, *self.pem_lines, self.token, *self.client_key_lines,
                self.client_key_data, self.wg_private, self.wg_preshared, self.wg_uapi_hex,
                self.bearer, self.url_password]


def _pem(kind: str) -> tuple[str, list[str]]:
    lines = [_b64(48) for _ in range(5)]
    return (f"-----BEGIN {kind}PRIVATE KEY-----\n" + "\n".join(lines)
            + f"\n-----END {kind}PRIVATE KEY-----\n", lines)


@dataclass
class Node:
    config: Path
    state: Path
    log: Path
    port: int
    planted: Secrets


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def node(tmp_path: Path) -> Node:
    pem, pem_lines = _pem("")
    client_key, client_key_lines = _pem("EC ")
    jwt = ("eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ." + _b64(60).replace("+", "-").replace("/", "_")
           .rstrip("=") + "." + secrets.token_urlsafe(40))
    planted = Secrets(
        password="mqtt-" + secrets.token_urlsafe(18), pem_lines=pem_lines, token=jwt,
        client_key_lines=client_key_lines,
        client_key_data=base64.b64encode(client_key.encode()).decode(),
        wg_private=_b64(32), wg_preshared=_b64(32), wg_uapi_hex=secrets.token_hex(32),
        bearer=secrets.token_urlsafe(24), url_password="pw" + secrets.token_hex(8))
    (tmp_path / "mqtt.pass").write_text(planted.password + "\n")
    (tmp_path / "client.key").write_text(pem)
    (tmp_path / "client.crt").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n"
                                         "-----END CERTIFICATE-----\n")
    dead = _free_port()
    (tmp_path / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: edgeheal\n"
        f"clusters:\n- name: k3s\n  cluster:\n    server: https://127.0.0.1:{dead}\n"
        "    insecure-skip-tls-verify: true\n"
        "contexts:\n- name: edgeheal\n  context: {cluster: k3s, user: edgeheal}\n"
        "users:\n- name: edgeheal\n  user:\n"
        f"    token: {planted.token}\n"
        f"    client-key-data: {planted.client_key_data}\n")
    port = _free_port()
    state = tmp_path / "state"
    config = tmp_path / "edge.toml"
    config.write_text(
        f'[agent]\nnode_name = "{NODE}"\nstate_dir = "{state}"\n'
        f'[http]\nlisten = ["127.0.0.1:{port}"]\n[wireguard]\nenabled = false\n'
        '[offload]\ninterfaces = ["edgeheal-none-*"]\ninterval = "1s"\n'
        '[[mqtt.targets]]\nname = "cloud"\nhost = "127.0.0.1"\n'
        f'port = {dead}\ntls = true\ncert_file = "{tmp_path}/client.crt"\n'
        f'key_file = "{tmp_path}/client.key"\nusername = "edge"\n'
        f'password_file = "{tmp_path}/mqtt.pass"\n'
        '[alerts]\ntarget = "cloud"\n'
        f'[kubernetes]\nkubeconfig = "{tmp_path}/kubeconfig"\nretries = 0\n'
        "events = false\nnode_condition = false\n")
    return Node(config, state, tmp_path / "agent.log", port, planted)


def _plant_log_lines(node: Node) -> None:
    """What a library or an older version could have logged."""
    p = node.planted
    with node.log.open("a") as f:
        f.write(f"DEBUG send: b'Authorization: Bearer {p.token}\\r\\n'\n"
                f"INFO header authorization=Bearer {p.bearer}\n"
                f"DEBUG wg showconf: [Interface]\nPrivateKey = {p.wg_private}\n"
                f"PresharedKey = {p.wg_preshared}\n"
                f"DEBUG uapi: private_key={p.wg_uapi_hex}\n"
                f"WARNING connect mqtts://edge:{p.url_password}@broker:8883 failed\n"
                f"DEBUG read password {p.password} from file\n"
                f"DEBUG key line {p.pem_lines[2]}\n")


@pytest.fixture
async def agent(node: Node) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))}
    env["EDGEHEAL_LOG_LEVEL"] = "debug"
    with node.log.open("a") as log:  # O_APPEND: the lines planted later are not overwritten
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "edgeheal", "run", "--config", str(node.config), env=env,
            stdout=log, stderr=log)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except compat.TimeoutErrors:
                proc.kill()
                await proc.wait()


async def _serving(port: int) -> None:
    def status() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # 503: not ready, but serving
        except OSError:
            return False

    deadline = time.monotonic() + 30
    for _ in range(300):
        if await asyncio.to_thread(status):
            return
        assert time.monotonic() < deadline, "the agent never served /status"
        await asyncio.sleep(0.1)
    raise AssertionError("the agent never served /status")


def run_bundle(node: Node, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgeheal", "bundle", "--config", str(node.config),
         "--log-file", str(node.log), "-o", str(out), *extra],
        capture_output=True, text=True, timeout=120, check=False)


def members(path: Path) -> Iterator[tuple[str, bytes]]:
    with tarfile.open(path, "r:gz") as tar:
        for info in tar.getmembers():
            assert info.isfile(), info.name
            f = tar.extractfile(info)
            assert f is not None
            yield info.name.split("/", 1)[1], f.read()


def assert_no_secret(node: Node, path: Path, said: str) -> dict[str, bytes]:
    found = dict(members(path))
    blob = b"\n".join(found.values()).decode() + said
    for value in node.planted.all():
        assert value not in blob, f"a planted secret is in the bundle: {value[:6]}..."
        assert value[:12] not in blob, f"a planted secret's start is in the bundle: {value[:6]}"
    assert "PRIVATE KEY-----" not in blob
    return found


async def test_a_bundle_of_a_running_agent_holds_everything_and_no_secret(
        node: Node, agent: asyncio.subprocess.Process, tmp_path: Path) -> None:
    await _serving(node.port)
    _plant_log_lines(node)
    out = tmp_path / "b.tar.gz"
    proc = await asyncio.to_thread(run_bundle, node, out)
    assert proc.returncode == 0, proc.stderr
    assert f"{out} (" in proc.stdout
    found = assert_no_secret(node, out, proc.stdout + proc.stderr)
    assert {"manifest.json", "version.json", "config.json", "doctor.json", "status.json",
            "metrics.txt", "outbox.json", "journal.txt"} <= set(found)
    assert json.loads(found["status.json"])["node"] == NODE
    assert b"edgeheal_" in found["metrics.txt"]
    assert json.loads(found["doctor.json"])["findings"]
    config = json.loads(found["config.json"])
    assert config["mqtt"]["targets"][0]["password_file"].endswith("mqtt.pass")  # a path, kept
    journal = found["journal.txt"].decode()
    for said in ("PrivateKey = <redacted>", "PresharedKey = <redacted>",
                 "private_key=<redacted>", "Authorization: Bearer <redacted>",
                 "authorization=<redacted>", "mqtts://edge:<redacted>@broker"):
        assert said in journal
    manifest = json.loads(found["manifest.json"])
    journal_row = next(m for m in manifest["members"] if m["name"] == "journal.txt")
    assert journal_row["redacted"]["known value"] >= 2  # the password, the key line
    assert (out.stat().st_mode & 0o777) == 0o600


async def test_with_the_agent_down_the_state_directory_is_read_and_no_payload_is_copied(
        node: Node, agent: asyncio.subprocess.Process, tmp_path: Path) -> None:
    await _serving(node.port)
    agent.send_signal(signal.SIGTERM)
    await asyncio.wait_for(agent.wait(), 30)
    outbox = node.state / "alerts.sqlite3"
    assert outbox.exists(), node.log.read_text()[-2000:]
    db = sqlite3.connect(outbox)
    db.execute("INSERT INTO outbox (id, kind, raised, payload) VALUES (?, ?, ?, ?)",
               ("planted", "planted.kind", time.time() - 120,
                json.dumps({"token": node.planted.token, "note": node.planted.bearer}).encode()))
    db.commit()
    db.close()
    (node.state / "remediation-history.json").write_text(json.dumps({"planted": True}))
    _plant_log_lines(node)
    out = tmp_path / "down.tar.gz"
    proc = await asyncio.to_thread(run_bundle, node, out)
    assert proc.returncode == 0, proc.stderr
    found = assert_no_secret(node, out, proc.stdout + proc.stderr)
    manifest = {m["name"]: m for m in json.loads(found["manifest.json"])["members"]}
    assert manifest["status.json"]["note"].startswith("agent not reachable")
    assert "status.json" not in found
    summary = json.loads(found["outbox.json"])
    assert summary["kinds"]["planted.kind"]["count"] == 1
    assert 100 < summary["kinds"]["planted.kind"]["oldest_age_seconds"] < 3600
    assert summary["count"] >= 2  # the agent's own alerts (no broker) and the planted one
    assert json.loads(found["history/remediation-history.json"]) == {"planted": True}


def test_the_archive_stays_under_its_bound_and_keeps_the_journal_tail(
        node: Node, tmp_path: Path) -> None:
    with node.log.open("w") as f:
        for i in range(40_000):
            f.write(f"line {i} {secrets.token_hex(24)}\n")
        f.write("the last line\n")
    out = tmp_path / "small.tar.gz"
    proc = run_bundle(node, out, "--max-size", "65536", "--lines", "100000", "--no-agent")
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size <= 65536
    found = dict(members(out))
    journal = found["journal.txt"].decode()
    assert journal.endswith("the last line\n")
    assert journal.startswith("line ")  # cut at a line boundary
    row = next(m for m in json.loads(found["manifest.json"])["members"]
               if m["name"] == "journal.txt")
    assert row["cut"] is True


@pytest.mark.parametrize(("args", "said"), [
    (["--max-size", "1000"], "--max-size must be at least 65536 bytes, got 1000"),
    (["--lines", "0"], "--lines must be 1 to 100000, got 0"),
    (["--diagnose", "600"], "--diagnose must be 1 to 60 seconds, got 600"),
    (["--url", "ftp://x"], "--url must be an http:// or https:// URL"),
])
def test_bad_usage_is_named(node: Node, tmp_path: Path, args: list[str], said: str) -> None:
    proc = run_bundle(node, tmp_path / "x.tar.gz", *args)
    assert proc.returncode == 2
    assert said in proc.stderr
    assert not (tmp_path / "x.tar.gz").exists()


def test_an_existing_archive_is_never_overwritten(node: Node, tmp_path: Path) -> None:
    out = tmp_path / "x.tar.gz"
    out.write_text("keep")
    node.log.write_text("")
    proc = run_bundle(node, out, "--no-agent")
    assert proc.returncode == 3
    assert "already exists (not overwritten)" in proc.stderr
    assert out.read_text() == "keep"


def test_a_configuration_that_does_not_load_still_bundles(node: Node, tmp_path: Path) -> None:
    node.config.write_text("[agent]\nno_such_key = 1\n")
    node.log.write_text("hello\n")
    out = tmp_path / "x.tar.gz"
    proc = run_bundle(node, out, "--no-agent")
    assert proc.returncode == 0, proc.stderr
    found = dict(members(out))
    assert "no_such_key" in json.loads(found["config.json"])["error"]
    assert found["journal.txt"] == b"hello\n"


@pytest.mark.parametrize(("text", "kept"), [
    ("Authorization: Bearer abc.def-ghi", "Authorization: <redacted>"),
    ("got bearer QWxhZGRpbjpvcGVu back", "got bearer <redacted> back"),
    ('"token": "s3cr3t-tok", "n": 1', '"token": "<redacted>", "n": 1'),
    ("password=hunter2hunter2 next", "password=<redacted> next"),
    ("PrivateKey = yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=", "PrivateKey = <redacted>"),
    ("private key: (hidden)", "private key: (hidden)"),  # what `wg show` prints
    ("https://user:pa55word@host/x", "https://user:<redacted>@host/x"),
    ('"password_file": "/etc/edgeheal/mqtt.pass"', '"password_file": "/etc/edgeheal/mqtt.pass"'),
    ("public_key=yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=",
     "public_key=yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="),  # not a secret: kept
    ("reason=token_invalid count 3", "reason=token_invalid count 3"),
])
def test_scrub_replaces_what_a_secret_looks_like_and_keeps_the_rest(text: str,
                                                                    kept: str) -> None:
    assert scrub(text)[0] == kept


def test_scrub_replaces_known_values_wherever_they_are() -> None:
    said, counts = scrub("a xyzzy-secret-1 b xyzzy-secret-1", {"xyzzy-secret-1"})
    assert said == "a <redacted> b <redacted>"
    assert counts == {"known value": 2}


def test_the_journal_is_asked_for_the_unit_and_the_lines_and_its_failure_is_said() -> None:
    asked: list[list[str]] = []

    def journalctl(argv: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 1, b"", b"Failed to open journal: EACCES\n")

    member = journal_member(Options(journal_lines=50, journal_unit="x.service"), journalctl)
    assert asked == [["journalctl", "--no-pager", "-o", "short-iso", "-u", "x.service",
                      "-n", "50"]]
    assert member.note == "journalctl exited 1: Failed to open journal: EACCES"


@pytest.mark.root
def test_a_short_diagnose_is_added_when_asked_and_its_failure_said(node: Node,
                                                                   tmp_path: Path) -> None:
    """The real diagnose, twice: on loopback as the uplink (no WireGuard interface here, so
    its verdict says so), then with no interface it can use (its error is the member and
    the manifest's note; the bundle is still written)."""
    node.log.write_text("")
    text = node.config.read_text()
    node.config.write_text(text.replace('interfaces = ["edgeheal-none-*"]', 'interfaces = ["lo"]'))
    out = tmp_path / "d.tar.gz"
    proc = run_bundle(node, out, "--no-agent", "--diagnose", "1")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(dict(members(out))["diagnose.json"])
    assert doc["verdict"]["code"] == "no_tunnel", doc
    node.config.write_text(text)
    out = tmp_path / "e.tar.gz"
    proc = run_bundle(node, out, "--no-agent", "--diagnose", "1")
    assert proc.returncode == 0, proc.stderr
    found = dict(members(out))
    assert "cannot tell which interface is the uplink" in json.loads(
        found["diagnose.json"])["error"]
    row = next(m for m in json.loads(found["manifest.json"])["members"]
               if m["name"] == "diagnose.json")
    assert row["note"].startswith("diagnose failed: cannot tell which interface")
