"""The remediation actor: runs the policy, the remedy, verification, persistence, events,
metrics, /status and the control commands. Remedies are scripted here (the real ones are
tested against the test API server and a real D-Bus); time is injected."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest

from edgeheal.agent import remediation
from edgeheal.agent.remediation import Remediator
from edgeheal.model import State
from edgeheal.remedies import RemedyError, RemedyOutcome
from tests.remediation.support import (
    Clock,
    ScriptedRemedy,
    World,
    make_config,
    snapshot,
    until,
)

MODES = ("pod", "k3s-service")


def remediator(world: World, remedies: dict[str, ScriptedRemedy], **kw: object) -> Remediator:
    return Remediator(world.ctx, remedy_factory=remedies.get,
                      boot_clock=lambda: world.clock.now + 4000.0,  # boottime runs along
                      boot="boot-a", tick=0.001, **kw)  # type: ignore[arg-type]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_a_failed_tunnel_is_restarted_once_and_recovery_verified(
        tmp_path: Path, mode: str) -> None:
    world = World(make_config(tmp_path, f'mode = "{mode}"'), Clock(step=0.01))
    remedy = ScriptedRemedy(mode)
    remedy.on_restart = world.recover_after_restart
    rem = remediator(world, {mode: remedy})
    await rem.resolve()
    assert rem.mode == mode
    actions = await rem.evaluate(world.snap)
    assert [a.kind for a in actions] == ["restart"]
    assert remedy.calls == 1
    assert world.kinds() == ["remediation.restarted", "remediation.recovered"]
    assert world.metric("restart", "recovered") == 1.0
    view = rem.view()
    assert view["mode"] == mode
    assert view["circuit"] == "closed"
    assert view["budget_left"] == 2
    (entry,) = view["actions"]
    assert (entry["action"], entry["mode"], entry["result"]) == ("restart", mode, "recovered")
    assert entry["reason"] == "wireguard_stalled"
    assert entry["duration_seconds"] >= 0
    saved = json.loads((tmp_path / "state" / "remediation-history.json").read_text())
    assert saved["records"][0]["result"] == "recovered"
    assert saved["boot_id"] == "boot-a"


async def test_a_restart_that_does_not_cure_is_reported_failed(tmp_path: Path,
                                                               mode: str) -> None:
    world = World(make_config(tmp_path, f'mode = "{mode}"'), Clock(step=0.05))
    remedy = ScriptedRemedy(mode)
    rem = remediator(world, {mode: remedy})
    await rem.resolve()
    await rem.evaluate(world.snap)
    assert world.kinds() == ["remediation.restarted", "remediation.failed"]
    assert "did not recover within 5s" in world.events[-1].message
    assert rem.history.failures_in_row == 1
    assert world.metric("restart", "not_recovered") == 1.0


async def test_verification_asks_for_fresh_runs_of_the_checks_it_waits_for(
        tmp_path: Path) -> None:
    """After a restart the tunnel-path probe must not wait its full interval (60 s by
    default) to prove recovery: the actor hastens what lacks a fresh ok, bounded."""
    world = World(make_config(tmp_path, 'mode = "pod"'), Clock(step=0.05))
    asked: list[str] = []
    world.ctx = dataclasses.replace(world.ctx, hasten=asked.append)
    rem = remediator(world, {"pod": ScriptedRemedy("pod")})
    await rem.resolve()
    await rem.evaluate(world.snap)  # never recovers: verification runs its whole 5 s
    assert world.kinds() == ["remediation.restarted", "remediation.failed"]
    assert set(asked) == {"wireguard", "broker-tunnel"}
    # every VERIFY_HASTEN_EVERY (5 s) of the 5 s window, not on every tick
    assert 1 <= asked.count("broker-tunnel") <= 2


async def test_a_permission_problem_is_a_config_problem_result(tmp_path: Path,
                                                                mode: str) -> None:
    world = World(make_config(tmp_path, f'mode = "{mode}"'), Clock(step=0.01))
    remedy = ScriptedRemedy(mode, error=RemedyError("forbidden: delete pods",
                                                    config_problem=True))
    rem = remediator(world, {mode: remedy})
    await rem.resolve()
    await rem.evaluate(world.snap)
    assert world.kinds() == ["remediation.failed"]
    assert world.events[0].detail["result"] == "config_problem"
    assert rem.view()["actions"][0]["result"] == "config_problem"


async def test_the_direct_path_down_skips_and_says_so_once(tmp_path: Path, mode: str) -> None:
    world = World(make_config(tmp_path, f'mode = "{mode}"'), Clock(step=0.01))
    world.snap = snapshot(world.clock.now, direct=State.FAILED)
    remedy = ScriptedRemedy(mode)
    rem = remediator(world, {mode: remedy})
    await rem.resolve()
    for _ in range(5):
        await rem.evaluate(world.snap)
    assert remedy.calls == 0
    assert world.kinds() == ["remediation.skipped"]
    assert world.events[0].detail["reason"] == "direct_path_down"
    assert rem.view()["last_decision"]["reason"] == "direct_path_down"


async def test_uncured_restarts_open_the_circuit_and_health_closes_it(tmp_path: Path,
                                                                      mode: str) -> None:
    config = make_config(tmp_path, f'mode = "{mode}"\ngive_up_after = 2\ncooldown = "0s"')
    world = World(config, Clock(step=0.05))
    remedy = ScriptedRemedy(mode)
    rem = remediator(world, {mode: remedy})
    await rem.resolve()
    for _ in range(6):
        await rem.evaluate(world.snap)
    assert remedy.calls == 2
    assert world.kinds().count("remediation.circuit_open") == 1
    assert world.kinds()[-1] == "remediation.skipped"  # circuit_open, announced once
    assert world.kinds().count("remediation.skipped") == 1
    assert rem.view()["circuit"] == "open"
    world.snap = snapshot(world.clock.now, wg=State.OK, wg_reason="ok", tunnel=State.OK)
    await rem.evaluate(world.snap)
    assert rem.view()["circuit"] == "closed"
    assert world.kinds()[-1] == "remediation.recovered"


async def test_dry_run_does_nothing_but_says_everything(tmp_path: Path, mode: str) -> None:
    world = World(make_config(tmp_path, f'mode = "{mode}"\ndry_run = true'), Clock(step=0.01))
    remedy = ScriptedRemedy(mode)
    rem = remediator(world, {mode: remedy})
    await rem.resolve()
    await rem.evaluate(world.snap)
    assert remedy.calls == 0
    assert world.kinds() == ["remediation.skipped"]
    assert world.events[0].detail["dry_run"] is True
    assert "would restart" in world.events[0].message
    assert rem.view()["actions"][0]["result"] == "dry_run"


async def test_pause_resume_and_reset_over_the_control_handlers(tmp_path: Path,
                                                                mode: str) -> None:
    world = World(make_config(tmp_path, f'mode = "{mode}"'), Clock(step=0.01))
    remedy = ScriptedRemedy(mode)
    rem = remediator(world, {mode: remedy})
    await rem.resolve()
    assert set(world.handlers) == {"remediation.pause", "remediation.resume",
                                   "remediation.reset"}
    view = await world.handlers["remediation.pause"]({"for": "10m"})
    assert view["paused_until"] is not None
    await rem.evaluate(world.snap)
    assert remedy.calls == 0
    assert world.events[-1].detail["reason"] == "paused"
    indefinite = await world.handlers["remediation.pause"]({})
    assert indefinite["paused_until"] == "indefinite"
    with pytest.raises(ValueError, match="duration"):
        await world.handlers["remediation.pause"]({"for": "soon"})
    await world.handlers["remediation.resume"]({})
    await rem.evaluate(world.snap)
    assert remedy.calls == 1
    rem.store(rem.history.opened())
    view = await world.handlers["remediation.reset"]({})
    assert view["circuit"] == "closed"
    assert view["failures_in_row"] == 0


async def test_the_history_survives_an_agent_restart(tmp_path: Path, mode: str) -> None:
    config = make_config(tmp_path, f'mode = "{mode}"\ncooldown = "0s"\nmax_per_hour = 2'
                         "\ngive_up_after = 10")
    clock = Clock(step=0.05)
    for _incarnation in range(3):
        world = World(config, clock)
        remedy = ScriptedRemedy(mode)
        rem = remediator(world, {mode: remedy})
        await rem.resolve()
        await rem.evaluate(world.snap)
    # two restarts in the first two incarnations, the third is out of budget
    assert rem.view()["budget_left"] == 0
    assert remedy.calls == 0
    assert world.events[-1].detail["reason"] == "budget_exhausted"
    assert len(rem.view()["actions"]) == 2


async def test_a_corrupt_history_is_moved_aside_not_fatal(tmp_path: Path) -> None:
    config = make_config(tmp_path, 'mode = "pod"')
    state = tmp_path / "state"
    state.mkdir()
    (state / "remediation-history.json").write_text("{broken")
    world = World(config, Clock())
    rem = remediator(world, {"pod": ScriptedRemedy()})
    assert rem.history.records == ()
    assert [p.read_text() for p in state.glob("remediation-history.json.corrupt-*")] == [
        "{broken"]
    assert world.kinds() == ["agent.state_reset"]
    assert world.events[0].detail["file"] == "remediation-history.json"


async def test_auto_picks_the_usable_remedy_and_says_why(tmp_path: Path) -> None:
    world = World(make_config(tmp_path), Clock())
    remedies = {"pod": ScriptedRemedy("pod", usable=False, why="no Flannel pod on edge-1"),
                "k3s-service": ScriptedRemedy("k3s-service", why="k3s-agent.service loaded")}
    rem = remediator(world, remedies)
    await rem.resolve()
    assert rem.mode == "k3s-service"
    assert rem.view()["why"] == "auto: k3s-agent.service loaded"


async def test_auto_with_nothing_to_restart_is_none_and_says_why(tmp_path: Path) -> None:
    world = World(make_config(tmp_path), Clock(step=0.01))
    rem = remediator(world, {"k3s-service": ScriptedRemedy("k3s-service", usable=False,
                                                           why="no K3s unit")})
    await rem.resolve()
    assert rem.mode == "none"
    assert "pod: not configured" in rem.mode_why
    assert "k3s-service: no K3s unit" in rem.mode_why
    await rem.evaluate(world.snap)
    assert world.events[-1].detail["reason"] == "mode_none"


async def test_serve_evaluates_and_stops_cleanly(tmp_path: Path) -> None:
    world = World(make_config(tmp_path, 'mode = "pod"'), Clock(step=0.01))
    remedy = ScriptedRemedy("pod")
    remedy.on_restart = world.recover_after_restart
    rem = remediator(world, {"pod": remedy})
    task = asyncio.create_task(rem.serve())
    try:
        await until(lambda: "remediation.recovered" in world.kinds(), what="recovery")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert remedy.calls == 1


def test_mode_none_builds_no_remediator(tmp_path: Path) -> None:
    world = World(make_config(tmp_path, 'mode = "none"'), Clock())
    assert remediation.build(world.ctx) is None


def test_the_agent_hook_builds_one(tmp_path: Path) -> None:
    world = World(make_config(tmp_path), Clock())
    rem = remediation.build(world.ctx)
    assert isinstance(rem, Remediator)
    assert rem.view()["mode"] == "auto"


async def test_a_restart_interrupted_by_a_kill_still_counts(tmp_path: Path) -> None:
    """The attempt is persisted before the remedy runs: kill the agent mid-restart (here:
    cancel the actor while the remedy hangs) and the next agent still counts it."""
    config = make_config(tmp_path, 'mode = "pod"\ncooldown = "1h"')
    world = World(config, Clock(step=0.01))
    hang = asyncio.Event()
    remedy = ScriptedRemedy("pod")
    remedy.on_restart = None
    rem = remediator(world, {"pod": remedy})
    await rem.resolve()

    async def restart_forever() -> RemedyOutcome:
        remedy.calls += 1
        await hang.wait()
        raise AssertionError("never reached")

    remedy.restart = restart_forever  # type: ignore[method-assign]
    task = asyncio.create_task(rem.evaluate(world.snap))
    await until(lambda: remedy.calls == 1, what="the restart to begin")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    again = remediator(World(config, world.clock), {"pod": ScriptedRemedy("pod")})
    assert [a["result"] for a in again.view()["actions"]] == ["interrupted"]
    assert again.view()["budget_left"] == 2
    assert again.history.failures_in_row == 1


async def test_the_uplink_settle_flag_survives_an_agent_restart(tmp_path: Path) -> None:
    """An agent sees the direct path fail (an uplink outage) and is restarted; when the
    uplink returns, the new agent still knows it was an outage and gives the tunnel
    ``uplink_settle`` to recover by itself instead of restarting Flannel at once."""
    config = make_config(tmp_path, 'mode = "pod"\nuplink_settle = "30s"')
    clock = Clock(step=0.01)
    first = World(config, clock)
    first.snap = snapshot(clock.now, direct=State.FAILED)
    rem = remediator(first, {"pod": ScriptedRemedy()})
    await rem.resolve()
    assert [a.reason for a in await rem.evaluate(first.snap)] == ["direct_path_down"]
    assert rem.history.direct_was_down

    second = World(config, clock)  # the agent restarted; the uplink came back 5 s ago
    snap = snapshot(clock.now)
    back = dataclasses.replace(snap.checks["broker-direct"], since_mono=clock.now - 5.0)
    second.snap = dataclasses.replace(snap, checks={**snap.checks, "broker-direct": back})
    remedy = ScriptedRemedy()
    again = remediator(second, {"pod": remedy})
    assert again.history.direct_was_down
    await again.resolve()
    assert [a.reason for a in await again.evaluate(second.snap)] == ["uplink_settling"]
    assert remedy.calls == 0


async def test_a_first_reading_after_kill_9_does_not_clear_the_streak(tmp_path: Path) -> None:
    """Replays the e2e flake (3 Flannel deletions where give_up_after = 2 allowed 2).

    1. agent A restarts Flannel; the ``in_progress`` record is on disk; ``kill -9`` lands
       before the result is written (the file keeps ``in_progress``: streak 1);
    2. agent B starts. Its WireGuard check's first run reads the old device, whose
       handshake is young: ``ok`` (one reading cannot show a stall), while the tunnel-path
       MQTT target's first TCP connect into the blackhole is still timing out (no result);
    3. that view must not count as a healthy tunnel: closing the circuit there cleared the
       streak, and B restarted twice more before the circuit opened.
    """
    config = make_config(tmp_path, 'mode = "pod"\ngive_up_after = 2\ncooldown = "0s"')
    clock = Clock(step=0.01)
    first = World(config, clock)
    remedy_a = ScriptedRemedy("pod")
    rem = remediator(first, {"pod": remedy_a})
    await rem.resolve()
    hang = asyncio.Event()

    async def delete_then_hang() -> RemedyOutcome:
        remedy_a.calls += 1
        await hang.wait()
        raise AssertionError("never reached")

    remedy_a.restart = delete_then_hang  # type: ignore[method-assign]
    task = asyncio.create_task(rem.evaluate(first.snap))
    await until(lambda: remedy_a.calls == 1, what="agent A's restart to begin")
    on_disk = (tmp_path / "state" / "remediation-history.json").read_bytes()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # kill -9: no `finally` ran, the disk holds what it held during the remedy
    (tmp_path / "state" / "remediation-history.json").write_bytes(on_disk)

    second = World(config, clock)
    remedy_b = ScriptedRemedy("pod")
    agent_b = remediator(second, {"pod": remedy_b})
    assert agent_b.history.failures_in_row == 1
    await agent_b.resolve()
    snap = snapshot(clock.now, wg=State.OK, wg_reason="ok", tunnel=State.OK)
    first_run = dataclasses.replace(snap.checks["wireguard"], runs=1)
    pending = dataclasses.replace(snap.checks["broker-tunnel"], state=State.UNKNOWN,
                                  reason="pending", runs=0, observed=None,
                                  last_run_mono=None)
    second.snap = dataclasses.replace(snap, checks={
        **snap.checks, "wireguard": first_run, "broker-tunnel": pending})
    assert await agent_b.evaluate(second.snap) == []
    assert agent_b.history.failures_in_row == 1
    second.snap = snapshot(clock.now)  # then the tunnel path's first result: failed
    for _ in range(5):
        await agent_b.evaluate(second.snap)
    assert remedy_b.calls == 1  # 2 restarts in all: give_up_after
    assert agent_b.view()["circuit"] == "open"
    assert [a["result"] for a in agent_b.view()["actions"]] == ["not_recovered",
                                                                "interrupted"]


async def test_a_stop_while_verifying_a_restart_is_recorded_as_interrupted(
        tmp_path: Path) -> None:
    """Issue 27, finding 10: SIGTERM (the actor cancelled) after the restart was done,
    while the actor waits for the tunnel to recover, is ``interrupted`` (history, view,
    counter), not ``failed``: the restart was neither cured nor refused."""
    config = make_config(tmp_path, 'mode = "pod"\nverify_timeout = "1h"')
    world = World(config, Clock(step=0.01))
    remedy = ScriptedRemedy("pod")
    rem = remediator(world, {"pod": remedy})
    await rem.resolve()
    task = asyncio.create_task(rem.evaluate(world.snap))
    await until(lambda: "remediation.restarted" in world.kinds(),
                what="the restart to be done and verification to begin")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [a["result"] for a in rem.view()["actions"]] == ["interrupted"]
    assert world.metric("restart", "interrupted") == 1
    assert world.metric("restart", "failed") == 0
    again = remediator(World(config, world.clock), {"pod": ScriptedRemedy("pod")})
    assert [a["result"] for a in again.view()["actions"]] == ["interrupted"]
