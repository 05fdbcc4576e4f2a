"""The one way to follow the snapshot: versioned, built once per change, awaited by all."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.agent.fakes import ScriptedCheck, failed, ok
from tests.agent.support import running_agent
from tests.support import until


async def test_a_follower_wakes_at_the_next_publication_not_at_its_timeout(
        tmp_path: Path) -> None:
    check = ScriptedCheck("probe", script=[ok(), failed(), ok()])
    async with running_agent(tmp_path, [check]) as running:
        agent = running.agent
        seen = agent.snapshot.version
        began = time.monotonic()
        await agent.changed(seen, 30.0)
        assert agent.snapshot.version > seen
        assert time.monotonic() - began < 10.0  # the check interval is 0.2 s, not 30 s


async def test_changed_returns_at_once_for_a_reader_behind(
        tmp_path: Path) -> None:
    async with running_agent(tmp_path, [ScriptedCheck("probe")]) as running:
        agent = running.agent
        began = time.monotonic()
        await agent.changed(agent.snapshot.version - 1, 30.0)  # already newer: no wait
        assert time.monotonic() - began < 1.0
    # without an agent (a check's unit test), the Context's default only waits its bound
    from edgeheal.model import _no_feed
    began = time.monotonic()
    await asyncio.wait_for(_no_feed(0, 0.05), 5.0)
    assert 0.04 <= time.monotonic() - began < 5.0


async def test_the_snapshot_carries_no_actors_view_and_status_still_shows_them(
        tmp_path: Path) -> None:
    async with running_agent(tmp_path, [ScriptedCheck("probe")]) as running:
        snap = running.agent.snapshot
        assert set(snap.extras) == {"path"}
        status, doc = await running.get("/status")
        assert status == 200
        assert "outbox_depth" in doc["alerts"]  # asked of the engine per request
        assert "path" in doc


async def test_alerts_follow_the_snapshot_in_order(tmp_path: Path) -> None:
    check = ScriptedCheck("probe", script=[ok(), failed(), failed(), ok()])
    async with running_agent(tmp_path, [check]) as running:
        agent = running.agent
        observed: list[int] = []
        real = agent.alerts.observe

        def spy(snap):  # type: ignore[no-untyped-def]
            observed.append(snap.version)
            real(snap)

        agent.alerts.observe = spy  # type: ignore[method-assign]
        await until(lambda: len(observed) >= 3, what="three observed snapshots")
        assert observed == sorted(set(observed))  # each version once, never backwards
