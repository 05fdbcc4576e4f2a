"""Restart jitter (issue 33): the first restart of an episode waits a random part of
``restart_jitter``, drawn once, after every other gate; later restarts do not; a fleet that
fails in the same second restarts spread over the window. Pure rows with a fixed random
source, then the actor with an injected one and a fake clock."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from edgeheal.agent.remediation import Remediator
from edgeheal.agent.remediation.history import Store, Timeline
from edgeheal.config import RemediationSettings
from edgeheal.core import flannel_ladder as policy
from edgeheal.core.flannel_ladder import History, Record, TunnelView, decide
from edgeheal.model import State
from tests.remediation.support import Clock, ScriptedRemedy, World, make_config

SETTINGS = RemediationSettings(cooldown=120.0, max_per_hour=3, startup_grace=60.0,
                               give_up_after=3, restart_jitter=30.0)
FAILED = TunnelView(mode="pod", wireguard=State.FAILED, wireguard_reason="stalled",
                    tunnel_mqtt={"broker-tunnel": State.OK},
                    direct_mqtt={"broker-direct": State.OK}, started_mono=0.0,
                    booted_mono=-10_000.0)
HEALTHY = replace(FAILED, wireguard=State.OK, wireguard_reason="ok")
NOW = 1000.0


def kinds(actions: list[policy.Action]) -> list[tuple[str, str]]:
    return [(a.kind, a.reason) for a in actions]


def test_the_first_restart_draws_its_wait_once_and_goes_ahead_when_it_is_over() -> None:
    (first,) = decide(FAILED, History(), NOW, SETTINGS, rand=lambda: 0.5)
    assert (first.kind, first.reason, first.until) == ("watch", "restart_jitter", NOW + 15.0)
    assert "waits 15s more" in first.message
    waiting = History(jitter_until=first.until)

    def never() -> float:
        raise AssertionError("drawn again")

    assert kinds(decide(FAILED, waiting, NOW + 14.9, SETTINGS, rand=never)) == [
        ("watch", "restart_jitter")]
    assert kinds(decide(FAILED, waiting, NOW + 15.0, SETTINGS, rand=never)) == [
        ("restart", "wireguard_stalled")]


@pytest.mark.parametrize(("case", "history", "settings", "rand"), [
    ("a restart in a row already happened: cooldown only",
     History(records=(Record(NOW - 200, "w", "pod", "x", "not_recovered", 5.0),),
             failures_in_row=1), SETTINGS, 0.9),
    ("restart_jitter = 0 turns it off", History(), replace(SETTINGS, restart_jitter=0.0), 0.9),
    ("a draw of 0 waits nothing", History(), SETTINGS, 0.0),
    ("no random source: no wait", History(), SETTINGS, None),
])
def test_no_wait_when(case: str, history: History, settings: RemediationSettings,
                      rand: float | None) -> None:
    source = None if rand is None else (lambda: rand)
    assert kinds(decide(FAILED, history, NOW, settings, rand=source)) == [
        ("restart", "wireguard_stalled")], case


@pytest.mark.parametrize(("case", "view", "history", "now", "expected"), [
    ("startup grace comes first", FAILED, History(), 30.0, ("skip", "startup_grace")),
    ("the direct path down comes first", replace(
        FAILED, direct_mqtt={"broker-direct": State.FAILED}), History(), NOW,
     ("skip", "direct_path_down")),
    ("a pause comes first", FAILED, History(paused_until=NOW + 60), NOW, ("skip", "paused")),
    ("cooldown comes first", FAILED, History(records=(Record(
        NOW - 10, "w", "pod", "x", "recovered", 5.0),)), NOW, ("skip", "cooldown")),
])
def test_every_other_gate_comes_before_the_jitter(case: str, view: TunnelView,
                                                  history: History, now: float,
                                                  expected: tuple[str, str]) -> None:
    assert kinds(decide(view, history, now, SETTINGS, rand=lambda: 0.5)) == [expected], case


def test_a_healthy_reading_ends_the_wait_and_the_next_episode_draws_again() -> None:
    waiting = History(jitter_until=NOW + 15)
    assert policy.episode_over(FAILED, waiting) is waiting
    assert policy.episode_over(HEALTHY, waiting).jitter_until is None
    assert policy.episode_over(HEALTHY, History()) == History()
    assert waiting.with_record(Record(NOW, "w", "pod", "x", "in_progress", 0.0)
                               ).jitter_until is None


def test_a_fleet_failing_in_the_same_second_restarts_spread_over_the_window() -> None:
    """100 nodes, each its own random source, the same fault at the same instant: their
    first restarts are spread over the 30 s window, a few per second at most."""
    times = []
    for node in range(100):
        rng = random.Random(node)  # noqa: S311 - a seeded jitter source
        (action,) = decide(FAILED, History(), NOW, SETTINGS, rand=rng.random)
        assert action.until is not None
        times.append(action.until - NOW)
    assert all(0.0 <= t < 30.0 for t in times)
    assert max(times) - min(times) > 25.0
    per_second = [sum(1 for t in times if s <= t < s + 1) for s in range(30)]
    assert max(per_second) <= 10, per_second  # 100 at once without the jitter


def test_the_wait_survives_an_agent_restart_on_the_same_boot_only(tmp_path: Path) -> None:
    timeline = Timeline(boot_id="boot-a", offset=4000.0)
    store = Store(str(tmp_path), timeline)
    store.save(History(jitter_until=NOW + 12.5))
    saved = json.loads((tmp_path / "remediation-history.json").read_text())
    assert saved["jitter_until_boottime"] == NOW + 12.5 + 4000.0
    assert Store(str(tmp_path), Timeline("boot-a", 3000.0)).load().jitter_until == \
        NOW + 12.5 + 1000.0
    assert Store(str(tmp_path), Timeline("boot-b", 4000.0)).load().jitter_until is None


async def test_the_actor_waits_its_drawn_part_then_restarts_once(tmp_path: Path) -> None:
    world = World(make_config(tmp_path, 'mode = "pod"\nrestart_jitter = "20s"'),
                  Clock(step=0.001))
    remedy = ScriptedRemedy("pod")
    remedy.on_restart = world.recover_after_restart
    rng = random.Random()  # noqa: S311 - a jitter source, not security
    rng.random = lambda: 0.25  # type: ignore[method-assign]
    rem = Remediator(world.ctx, remedy_factory={"pod": remedy}.get,
                     boot_clock=lambda: world.clock.now + 4000.0, boot="boot-a", tick=0.001,
                     rng=rng)
    await rem.resolve()
    start = world.clock.now
    assert kinds(await rem.evaluate(world.snap)) == [("watch", "restart_jitter")]
    until = rem.history.jitter_until
    assert until is not None
    assert until == pytest.approx(start + 5.0, abs=0.1)  # 0.25 of 20 s
    saved = json.loads((tmp_path / "state" / "remediation-history.json").read_text())
    assert saved["jitter_until_boottime"] == pytest.approx(until + 4000.0)
    world.clock.now = until - 0.5
    assert kinds(await rem.evaluate(world.snap)) == [("watch", "restart_jitter")]
    assert rem.history.jitter_until == until  # drawn once
    assert remedy.calls == 0
    world.clock.now = until
    assert kinds(await rem.evaluate(world.snap)) == [("restart", "wireguard_stalled")]
    assert remedy.calls == 1
    assert rem.history.jitter_until is None
    assert "remediation.skipped" not in world.kinds()  # a wait is not a skip to alert on
