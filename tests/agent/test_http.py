"""The real HTTP server on an ephemeral port, hit over TCP, answered from the snapshot."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgeheal import cli
from edgeheal.agent import endpoints as http
from edgeheal.agent import http_server
from edgeheal.base import compat
from edgeheal.config import CheckSettings
from edgeheal.model import State
from tests.agent.fakes import ScriptedCheck, degraded, failed, ok
from tests.agent.support import running_agent
from tests.support import until

FAST = CheckSettings(interval=0.2, fail_after=1, recover_after=1, required=True)
SOFT = CheckSettings(interval=0.2, fail_after=1, recover_after=1, required=False)


async def test_not_ready_until_the_first_round_completes(
        tmp_path: Path, schema_validate: Callable[[Any, str], None]) -> None:
    slow = ScriptedCheck("slow", FAST, [ok()], delay=1.0)
    async with running_agent(tmp_path, [slow]) as agent:
        status, body = await agent.get("/readyz")
        assert status == 503
        schema_validate(body, "readyz.schema.json")
        assert body == {"ready": False, "failing": [
            {"check": "slow", "state": "unknown", "reason": "pending",
             "message": "no result yet"}]}
        await until(lambda: agent.agent.snapshot.ready)
        status, body = await agent.get("/readyz")
        assert (status, body) == (200, {"ready": True, "failing": []})


async def test_every_endpoint_answers_with_the_documented_shape(
        tmp_path: Path, schema_validate: Callable[[Any, str], None]) -> None:
    checks = [ScriptedCheck("good", FAST, [ok()]), ScriptedCheck("meh", SOFT, [degraded()]),
              ScriptedCheck("bad", SOFT, [failed()])]
    async with running_agent(tmp_path, checks) as agent:
        await until(lambda: agent.agent.snapshot.round_complete)
        status, doc = await agent.get("/status")
        assert status == 200
        schema_validate(doc, "status.schema.json")
        assert doc["node"] == "edge-test"
        assert doc["ready"] is True  # only "good" is required
        assert {n: c["state"] for n, c in doc["checks"].items()} == {
            "good": "ok", "meh": "degraded", "bad": "failed"}
        assert doc["actions"] == []

        for name, code in (("good", 200), ("meh", 200), ("bad", 503)):
            status, body = await agent.get(f"/probe/{name}")
            assert status == code, name
            schema_validate(body, "check.schema.json")
            assert body["state"] == doc["checks"][name]["state"]
        status, body = await agent.get("/probe/nope")
        assert status == 404
        assert body["known_checks"] == ["bad", "good", "meh"]

        status, body = await agent.get("/livez")
        assert status == 200
        assert body["live"] is True
        status, text = await agent.get("/metrics")
        assert status == 200
        assert 'edgeheal_check_state{check="bad",state="failed"} 1.0' in text
        assert 'edgeheal_check_state{check="bad",state="ok"} 0.0' in text
        assert 'edgeheal_check_runs_total{check="good",result="completed"}' in text
        assert 'edgeheal_check_duration_seconds_count{check="good"}' in text
        # a check no module registers has no reason table: its "broken" is bounded to other
        assert 'edgeheal_check_reason{check="bad",reason="other"} 1.0' in text
        assert 'edgeheal_check_reason{check="bad",reason="pending"} 0.0' in text
        assert 'edgeheal_check_runs_total{check="bad",result="timeout"} 0.0' in text
        assert "edgeheal_ready 1.0" in text
        assert "_created" not in text
        assert "edgeheal_build_info{" in text


async def test_a_required_failing_check_makes_the_node_unready(tmp_path: Path) -> None:
    flip = ScriptedCheck("tunnel", FAST, [ok(), ok(), failed("stalled")])
    async with running_agent(tmp_path, [flip]) as agent:
        await until(lambda: agent.agent.snapshot.checks["tunnel"].state is State.FAILED)
        status, body = await agent.get("/readyz")
        assert status == 503
        assert body["failing"] == [{"check": "tunnel", "state": "failed",
                                    "reason": "stalled", "message": "it broke"}]


async def test_a_slow_check_never_slows_the_probes(tmp_path: Path) -> None:
    fast = ScriptedCheck("fast", FAST, [ok()])
    slow = ScriptedCheck("slow", CheckSettings(interval=0.2, timeout=30), [ok()], delay=20.0)
    async with running_agent(tmp_path, [fast, slow]) as agent:
        await until(lambda: slow.runs >= 1 and fast.runs >= 1)
        worst = 0.0
        for _ in range(20):
            began = time.perf_counter()
            status, _ = await agent.get("/readyz")
            worst = max(worst, time.perf_counter() - began)
            assert status == 503  # "slow" has not completed a run: not ready, promptly
        assert worst < 1.0, f"/readyz took {worst:.3f}s while a check was busy"


async def test_a_check_that_raises_or_hangs_becomes_unknown_and_the_agent_lives_on(
        tmp_path: Path) -> None:
    boom = ScriptedCheck("boom", FAST, [RuntimeError("kaput")])
    hang = ScriptedCheck("hang", CheckSettings(interval=0.2, timeout=0.3, fail_after=1),
                         [ok()], delay=60.0)
    good = ScriptedCheck("good", FAST, [ok()])
    async with running_agent(tmp_path, [boom, hang, good]) as agent:
        await until(lambda: agent.agent.snapshot.round_complete and good.runs >= 5)
        checks = agent.agent.snapshot.checks
        assert (checks["boom"].state, checks["boom"].reason) == (State.UNKNOWN, "check_error")
        assert "RuntimeError: kaput" in checks["boom"].message
        assert (checks["hang"].state, checks["hang"].reason) == (
            State.UNKNOWN, "check_timeout")
        _, text = await agent.get("/metrics")
        assert 'edgeheal_check_runs_total{check="boom",result="error"}' in text
        assert 'edgeheal_check_runs_total{check="hang",result="timeout"}' in text
        await until(lambda: boom.runs >= 3)  # it keeps being retried


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
async def test_metrics_pass_promtool(tmp_path: Path) -> None:
    async with running_agent(tmp_path, [ScriptedCheck("good", FAST, [ok()])]) as agent:
        await until(lambda: agent.agent.snapshot.round_complete)
        _, text = await agent.get("/metrics")
    proc = await asyncio.to_thread(
        subprocess.run, ["promtool", "check", "metrics"], input=text, capture_output=True,
        text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


async def test_edgeheal_status_prints_the_table_and_exits_by_readiness(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checks = [ScriptedCheck("tunnel", FAST, [failed("stalled")]),
              ScriptedCheck("offload", SOFT, [ok()])]
    async with running_agent(tmp_path, checks) as agent:
        await until(lambda: agent.agent.snapshot.round_complete)
        code = await asyncio.to_thread(cli.main, ["status", "--url", agent.base])
    out = capsys.readouterr().out
    assert code == 1  # a required check failed: not ready
    assert "node edge-test" in out
    assert "NOT READY" in out
    assert "tunnel *" in out
    assert "stalled" in out
    unreachable = await asyncio.to_thread(cli.main, ["status", "--url", agent.base])
    assert unreachable == 3


# --- bad input and floods (issue 17, findings 2 and 12) ------------------------------------

BAD_REQUESTS: list[tuple[str, bytes]] = [
    ("not HTTP", b"GARBAGE\r\n\r\n"),
    ("unknown version", b"GET /livez HTTP/9.9\r\nHost: x\r\n\r\n"),
    ("request line too long", b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("method too long", b"A" * 9000 + b" /livez HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("header too long", b"GET /livez HTTP/1.1\r\nX: " + b"a" * 10000 + b"\r\n\r\n"),
    ("too many headers", b"GET /livez HTTP/1.1\r\n" + b"".join(
        b"X-%d: y\r\n" % i for i in range(300)) + b"\r\n"),
    ("header without a colon", b"GET /livez HTTP/1.1\r\nHost\r\n\r\n"),
    ("space in a header name", b"GET /livez HTTP/1.1\r\nHo st: x\r\n\r\n"),
    ("NUL in a header value", b"GET /livez HTTP/1.1\r\nX: a\x00b\r\n\r\n"),
    ("control byte in the path", b"GET /li\x01vez HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("TLS ClientHello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32)),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
    ("negative Content-Length", b"GET /livez HTTP/1.1\r\nContent-Length: -1\r\n\r\n"),
    ("two Content-Lengths", b"GET /livez HTTP/1.1\r\nContent-Length: 1\r\n"
                            b"Content-Length: 2\r\n\r\nab"),
    ("non-numeric Content-Length", b"GET /livez HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
    ("bad chunk size", b"POST /livez HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
    ("huge chunk size", b"POST /livez HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"FFFFFFFFFFFFFFFFFFFFFFFF\r\n"),
    ("chunked and Content-Length", b"POST /livez HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                                   b"Content-Length: 3\r\n\r\n0\r\n\r\n"),
    ("unknown transfer coding", b"POST /livez HTTP/1.1\r\nTransfer-Encoding: gzip, x\r\n\r\n"),
    ("obsolete line folding", b"GET /livez HTTP/1.1\r\nX: a\r\n b\r\n\r\n"),
    ("only line ends", b"\r\n\r\n\r\n\r\n"),
    ("invalid UTF-8 path", b"GET /probe/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("NUL escaped in the path", b"GET /probe/%00 HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("path traversal", b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("absolute file URI", b"GET file:///etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("POST with a body over 4 KB", b"POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                   b"100000\r\n\r\n" + b"x" * 100000),
    ("DELETE", b"DELETE /status HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("bad websocket upgrade", b"GET /livez HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                              b"Connection: Upgrade\r\nSec-WebSocket-Key: !!\r\n\r\n"),
    ("500 pipelined requests", b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n" * 500),
    ("binary noise", bytes(range(256)) * 16),
]
"""Malformed or hostile requests, each on its own connection. Handled means: an HTTP
answer (4xx/5xx for the bad ones, never a traceback in it) or a closed connection, no
``error`` log record and no traceback in the log, and the agent still answering."""


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


async def _closed_by_peer(reader: asyncio.StreamReader) -> bool:
    """Read until the server closes (EOF, or a reset seen by a write); True if it sent
    nothing before closing."""
    try:
        return await reader.read() == b""
    except ConnectionError:
        return True


async def _exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        data = b""
        with contextlib.suppress(ConnectionError, *compat.TimeoutErrors):
            async with compat.timeout(5):  # until closed, or quiet for 0.5 s after a reply
                while chunk := await (reader.read(65536) if not data else
                                      asyncio.wait_for(reader.read(65536), 0.5)):
                    data += chunk
        return data
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_malformed_requests_get_a_400_an_info_line_and_a_count(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with running_agent(tmp_path, [ScriptedCheck("good", FAST, [ok()])]) as agent:
        port = int(agent.base.rsplit(":", 1)[1])
        handled, answers = 0, {}
        for name, payload in BAD_REQUESTS:
            caplog.clear()
            reply = await _exchange(port, payload)
            status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.") else None
            answers[name] = status
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
            live, _ = await agent.get("/livez")
            assert b"Traceback" not in reply, name
            assert not errors, (name, [r.getMessage() for r in errors])
            assert live == 200, name
            handled += 1
        _, text = await agent.get("/metrics")
    assert handled == len(BAD_REQUESTS)
    bad = sum(1 for s in answers.values() if s == 400)
    not_400 = {n: s for n, s in answers.items() if s != 400}
    assert not_400 == {  # well-formed HTTP, answered as such, or no request at all
        "only line ends": None, "NUL escaped in the path": 404, "path traversal": 404,
        "POST with a body over 4 KB": 405, "DELETE": 405, "bad websocket upgrade": 200,
        "500 pipelined requests": 200}
    assert bad == len(BAD_REQUESTS) - len(not_400)
    assert _metric(text, "edgeheal_http_bad_requests_total") == bad  # each counted once
    assert [r.getMessage() for r in caplog.records if r.name == "edgeheal.http"] == [
        "bad HTTP request from 127.0.0.1: 400 BadHttpMethod"]  # the last one, "binary noise"


async def test_connections_that_send_no_request_are_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "REQUEST_TIMEOUT", 0.5)
    async with running_agent(tmp_path, [ScriptedCheck("good", FAST, [ok()])]) as agent:
        port = int(agent.base.rsplit(":", 1)[1])
        silent = await asyncio.open_connection("127.0.0.1", port)
        slow = await asyncio.open_connection("127.0.0.1", port)  # a slowloris
        began = time.monotonic()
        async with compat.timeout(10):
            for line in (b"GET /livez HTTP/1.1\r\n", b"Host: x\r\n", b"X-A: 1\r\n",
                         b"X-B: 2\r\n", b"X-C: 3\r\n", b"X-D: 4\r\n", b"X-E: 5\r\n"):
                with contextlib.suppress(ConnectionError):  # closed under us: fine
                    slow[1].write(line)  # one header line every 0.4 s, never the blank one
                    await slow[1].drain()
                await asyncio.sleep(0.4)
            assert await _closed_by_peer(silent[0])
            assert await _closed_by_peer(slow[0])
        took = time.monotonic() - began
        for _, writer in (silent, slow):
            writer.close()
        assert took < 5.0, f"closed only after {took:.1f}s"
        _, text = await agent.get("/metrics")
        assert 'edgeheal_http_connections_closed_total{reason="no_request"} 2.0' in text
        status, _ = await agent.get("/livez")  # a real request is served as before
        assert status == 200


async def test_over_the_connection_cap_the_oldest_is_closed_and_probes_get_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "connection_cap", lambda soft_limit=None: 8)
    async with running_agent(tmp_path, [ScriptedCheck("good", FAST, [ok()])]) as agent:
        port = int(agent.base.rsplit(":", 1)[1])
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(30)]
        try:
            async with compat.timeout(5):
                assert await _closed_by_peer(idle[0][0])  # the oldest went first
            for _ in range(5):  # fresh probes keep getting through
                status, _ = await agent.get("/livez")
                assert status == 200
            _, text = await agent.get("/metrics")
        finally:
            for _, writer in idle:
                writer.close()
        assert "edgeheal_http_connections_max 8.0" in text
        closed = _metric(text, 'edgeheal_http_connections_closed_total{reason="over_limit"}')
        assert closed >= 30 - 8
        assert _metric(text, "edgeheal_http_connections") <= 8 + 1


def test_the_connection_cap_leaves_descriptors_for_the_checks() -> None:
    assert http_server.connection_cap(1024) == http_server.MAX_CONNECTIONS  # 256 of 1024
    assert http_server.connection_cap(512) == 128
    assert http_server.connection_cap(64) == 8  # never none at all
    assert http_server.connection_cap(10**6) == http_server.MAX_CONNECTIONS


async def test_the_agent_exports_its_own_memory_and_descriptors(tmp_path: Path) -> None:
    async with running_agent(tmp_path, [ScriptedCheck("good", FAST, [ok()])]) as agent:
        _, text = await agent.get("/metrics")
        with open("/proc/self/statm") as statm_file:  # noqa: ASYNC230 - procfs, instant
            pages = int(statm_file.read().split()[1])
    rss = _metric(text, "edgeheal_resident_memory_bytes")
    statm = pages * os.sysconf("SC_PAGE_SIZE")
    assert 10e6 < rss < 2e9
    assert abs(rss - statm) < 50e6  # the same process, read moments apart
    fds = _metric(text, "edgeheal_open_fds")
    assert 3 <= fds <= len(os.listdir("/proc/self/fd")) + 50
    assert "edgeheal_max_fds " in text


def test_memory_limits_are_read_from_the_cgroup(tmp_path: Path) -> None:
    from edgeheal.boundaries.prometheus import SelfCollector, _cgroup_files

    group = tmp_path / "sys" / "system.slice" / "edgeheal.service"
    group.mkdir(parents=True)
    (group / "memory.high").write_text("100663296\n")
    (group / "memory.max").write_text("max\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/edgeheal.service\n")
    files = _cgroup_files(proc, tmp_path / "sys")
    assert files == {"high": group / "memory.high", "max": group / "memory.max"}
    families = {m.name: m for m in SelfCollector(cgroup=files).collect()}
    samples = families["edgeheal_memory_limit_bytes"].samples
    assert [(s.labels, s.value) for s in samples] == [({"limit": "high"}, 100663296)]
    assert _cgroup_files(tmp_path / "missing", tmp_path / "sys") == {}


@pytest.mark.parametrize("path", ["/status", "/metrics"])
async def test_a_client_that_leaves_before_the_answer_is_no_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        path: str) -> None:
    """A reader that gives up (a 1 s client timeout on a busy box) before its /status or
    /metrics is written is routine: no ``level=error`` traceback, the slot given back."""
    left = asyncio.Event()
    make = http._status_body if path == "/status" else http._metrics_body

    async def after_the_client_left(request: Any) -> Any:
        await left.wait()
        return await make(request)

    monkeypatch.setattr(http, "_status_body" if path == "/status" else "_metrics_body",
                        after_the_client_left)
    async with running_agent(tmp_path, [ScriptedCheck("good", FAST, [ok()])]) as agent:
        port = int(agent.base.rsplit(":", 1)[1])
        caplog.set_level(logging.DEBUG)
        for _ in range(http.MAX_HEAVY + 1):  # a leaked slot would show as a 503 below
            left.clear()
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.transport.abort()  # the client's timeout: gone, answer unread
            await asyncio.sleep(0.05)
            left.set()
            await asyncio.sleep(0.05)
        monkeypatch.setattr(http, "_status_body" if path == "/status" else "_metrics_body",
                            make)
        status, _ = await agent.get(path)
        assert status == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
