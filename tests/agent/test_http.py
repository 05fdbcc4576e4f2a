"""The real HTTP server on an ephemeral port, hit over TCP, answered from the snapshot."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgeheal import cli
from edgeheal.config import CheckSettings
from edgeheal.model import State
from tests.agent.fakes import ScriptedCheck, degraded, failed, ok
from tests.agent.support import running_agent

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
        await agent.until(lambda: agent.agent.snapshot.ready)
        status, body = await agent.get("/readyz")
        assert (status, body) == (200, {"ready": True, "failing": []})


async def test_every_endpoint_answers_with_the_documented_shape(
        tmp_path: Path, schema_validate: Callable[[Any, str], None]) -> None:
    checks = [ScriptedCheck("good", FAST, [ok()]), ScriptedCheck("meh", SOFT, [degraded()]),
              ScriptedCheck("bad", SOFT, [failed()])]
    async with running_agent(tmp_path, checks) as agent:
        await agent.until(lambda: agent.agent.snapshot.round_complete)
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
        assert 'edgeheal_check_duration_seconds{check="good"}' in text
        assert "edgeheal_build_info{" in text


async def test_a_required_failing_check_makes_the_node_unready(tmp_path: Path) -> None:
    flip = ScriptedCheck("tunnel", FAST, [ok(), ok(), failed("stalled")])
    async with running_agent(tmp_path, [flip]) as agent:
        await agent.until(lambda: agent.agent.snapshot.checks["tunnel"].state is State.FAILED)
        status, body = await agent.get("/readyz")
        assert status == 503
        assert body["failing"] == [{"check": "tunnel", "state": "failed",
                                    "reason": "stalled", "message": "it broke"}]


async def test_a_slow_check_never_slows_the_probes(tmp_path: Path) -> None:
    fast = ScriptedCheck("fast", FAST, [ok()])
    slow = ScriptedCheck("slow", CheckSettings(interval=0.2, timeout=30), [ok()], delay=20.0)
    async with running_agent(tmp_path, [fast, slow]) as agent:
        await agent.until(lambda: slow.runs >= 1 and fast.runs >= 1)
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
        await agent.until(lambda: agent.agent.snapshot.round_complete and good.runs >= 5)
        checks = agent.agent.snapshot.checks
        assert (checks["boom"].state, checks["boom"].reason) == (State.UNKNOWN, "check_error")
        assert "RuntimeError: kaput" in checks["boom"].message
        assert (checks["hang"].state, checks["hang"].reason) == (
            State.UNKNOWN, "check_timeout")
        _, text = await agent.get("/metrics")
        assert 'edgeheal_check_runs_total{check="boom",result="error"}' in text
        assert 'edgeheal_check_runs_total{check="hang",result="timeout"}' in text
        await agent.until(lambda: boom.runs >= 3)  # it keeps being retried


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
async def test_metrics_pass_promtool(tmp_path: Path) -> None:
    async with running_agent(tmp_path, [ScriptedCheck("good", FAST, [ok()])]) as agent:
        await agent.until(lambda: agent.agent.snapshot.round_complete)
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
        await agent.until(lambda: agent.agent.snapshot.round_complete)
        code = await asyncio.to_thread(cli.main, ["status", "--url", agent.base])
    out = capsys.readouterr().out
    assert code == 1  # a required check failed: not ready
    assert "node edge-test" in out
    assert "NOT READY" in out
    assert "tunnel *" in out
    assert "stalled" in out
    unreachable = await asyncio.to_thread(cli.main, ["status", "--url", agent.base])
    assert unreachable == 3
