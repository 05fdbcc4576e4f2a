"""The control ladder's actor wired into the agent: its settings, its place beside the other
ladders, the operator's commands. The remedy here is scripted (the real one, over a real
dbus-daemon, is tests/remediation_dbus/test_control_ladder.py)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from edgeheal import config as cfg
from edgeheal.agent.remediation import build_control
from edgeheal.agent.remediation.control_actor import ControlRemediator, clear_balancer
from edgeheal.agent.supervisor import Agent
from edgeheal.base.compat import UTC
from edgeheal.boundaries import control_socket as control
from edgeheal.model import (
    CheckResult,
    CheckStatus,
    Context,
    Event,
    FleetHold,
    Snapshot,
    State,
)
from edgeheal.remedies import Availability, RemedyOutcome
from tests.support import Clock

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def make_config(tmp_path: Path, ladder: str = "enabled = true", control_section: bool = True,
                mode: str = "none") -> cfg.Config:
    section = '[control]\nservers = ["127.0.0.1:6443"]\n' if control_section else ""
    return cfg.loads_generic(f"""
[agent]
node_name = "edge-1"
state_dir = "{tmp_path / 'state'}"
[http]
listen = ["127.0.0.1:0"]
{section}
[remediation]
mode = "{mode}"
restart_jitter = "0s"
[remediation.control]
{ladder}
startup_grace = "0s"
act_after = "30s"
""")


class Unit:
    mode = "k3s-service"

    def __init__(self, heal: Callable[[], None] = lambda: None) -> None:
        self.restarts = 0
        self.heal = heal

    async def probe(self) -> Availability:
        return Availability(True, "scripted unit")

    async def restart(self) -> RemedyOutcome:
        self.restarts += 1
        self.heal()
        return RemedyOutcome(target="k3s-agent.service")


def snapshot(reason: str, state: State, at: float, since: float = 0.0) -> Snapshot:
    status = CheckStatus(name="control", state=state, reason=reason, message="", since=EPOCH,
                         since_mono=since, detail={}, required=False, runs=3,
                         observed=CheckResult(state, reason), last_run_mono=at)
    return Snapshot(node="edge-1", checks={"control": status}, started_mono=0.0,
                    taken_mono=at, round_complete=True)


def test_off_by_default_and_refused_without_the_control_check(tmp_path: Path) -> None:
    plain = cfg.loads_generic(f'[agent]\nstate_dir = "{tmp_path}"\n')
    assert not plain.remediation.control.enabled
    ctx = Context(config=plain, registry=CollectorRegistry(), clock=Clock(),
                  snapshot=lambda: snapshot("ok", State.OK, 0.0), emit=lambda e: None)
    assert build_control(ctx, others=lambda: ()) is None
    with pytest.raises(cfg.ConfigError, match=r"remediation\.control\.enabled.*\[control\]"):
        make_config(tmp_path, control_section=False)
    with pytest.raises(cfg.ConfigError, match=r"remediation\.control\.balancer_state.*"
                       "absolute"):
        make_config(tmp_path, 'enabled = true\nbalancer_state = "k3s.json"')
    with pytest.raises(cfg.ConfigError, match=r"remediation\.control\.max_per_hour"):
        make_config(tmp_path, "enabled = true\nmax_per_hour = 0")


def test_the_agent_builds_it_and_shows_it(tmp_path: Path) -> None:
    agent = Agent(make_config(tmp_path), checks=[])
    assert isinstance(agent.control_remediator, ControlRemediator)
    view = agent.views()["control_remediation"]
    assert (view["mode"], view["circuit"], view["act_after_seconds"]) == (
        "k3s-service", "closed", 30.0)
    assert view["acts_on"] == ["balancer_stuck", "heartbeat_stale", "node_ip_changed",
                               "not_ready"]
    assert agent.acting() == ()
    assert agent.uplink_remediator is None


def test_the_agent_tells_it_which_ladder_acts(tmp_path: Path) -> None:
    agent = Agent(make_config(tmp_path, mode="auto"), checks=[])
    flannel = agent.remediator
    assert flannel is not None
    flannel.busy = "wireguard_stalled"
    assert agent.acting() == ("flannel",)


async def test_a_verdict_waits_act_after_then_one_restart(tmp_path: Path) -> None:
    clock = Clock(now=10_000.0, step=0.01)
    events: list[Event] = []
    began = clock.now
    state = {"snap": snapshot("heartbeat_stale", State.FAILED, clock.now, since=began)}
    ctx = Context(config=make_config(tmp_path), registry=CollectorRegistry(), clock=clock,
                  wall=clock.wall, snapshot=lambda: state["snap"], emit=events.append)

    def heal() -> None:  # the agent back: the check's next run is ok
        state["snap"] = snapshot("ok", State.OK, clock.now + 1.0)

    unit = Unit(heal)
    rem = ControlRemediator(ctx, remedy_factory=lambda mode: unit, boot="b",
                            boot_clock=lambda: clock.now + 4000.0, tick=0.001)
    first = await rem.evaluate(state["snap"])
    assert [(a.kind, a.reason) for a in first] == [("skip", "verdict_window")]
    clock.advance(31)
    state["snap"] = snapshot("heartbeat_stale", State.FAILED, clock.now, since=began)
    assert [a.kind for a in await rem.evaluate(state["snap"])] == ["restart"]
    assert unit.restarts == 1
    assert rem.history.records[-1].result == "recovered"


def test_clear_balancer_says_what_became_of_the_file(tmp_path: Path) -> None:
    state = tmp_path / "lb.json"
    assert clear_balancer("").startswith("not removed: ")
    assert clear_balancer(str(state)) == f"{state} was not there"
    state.write_text("{}")
    assert clear_balancer(str(state)) == f"removed {state}"
    assert not state.exists()


async def test_the_cli_pauses_and_resets_the_control_ladder(tmp_path: Path) -> None:
    clock = Clock(now=10_000.0, step=0.01)
    handlers: dict[str, object] = {}
    conf = make_config(tmp_path)
    ctx = Context(config=conf, registry=CollectorRegistry(), clock=clock, wall=clock.wall,
                  snapshot=lambda: snapshot("ok", State.OK, clock.now), emit=lambda e: None,
                  control=handlers.__setitem__)
    rem = ControlRemediator(ctx, remedy_factory=lambda mode: Unit(), boot="b",
                            boot_clock=lambda: clock.now + 4000.0)
    assert {"remediation.control.pause", "remediation.control.resume",
            "remediation.control.reset"} <= set(handlers)
    server = control.ControlServer(conf.agent.state_dir)
    for name, handler in handlers.items():
        server.register(name, handler)  # type: ignore[arg-type]
    toml = tmp_path / "edge.toml"
    toml.write_text(f'[agent]\nstate_dir = "{conf.agent.state_dir}"\n')

    async def cli(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "edgeheal", "remediation", *args, "--config", str(toml),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, (out + err).decode()

    await server.start()
    try:
        code, text = await cli("pause", "--ladder", "control")
        assert code == 0, text
        assert rem.history.paused(clock.now)
        code, text = await cli("resume", "--ladder", "control")
        assert code == 0, text
        assert not rem.history.paused(clock.now)
        code, text = await cli("reset", "--ladder", "control")
        assert (code, "circuit reset" in text) == (0, True), text
    finally:
        await server.close()


async def test_the_other_ladders_wait_while_it_restarts_the_agent(tmp_path: Path) -> None:
    from edgeheal.core.safeguards import Action

    agent = Agent(make_config(tmp_path, mode="auto"), checks=[])
    flannel, control_ladder = agent.remediator, agent.control_remediator
    assert flannel is not None
    assert control_ladder is not None
    sample = {"ladder": "flannel", "action": "skip", "result": "other_ladder"}
    assert agent.registry.get_sample_value("edgeheal_remediations_total", sample) == 0.0
    assert flannel.yield_to() == ()
    control_ladder.busy = "control_heartbeat_stale"
    assert flannel.yield_to() == ("control",)
    await flannel._apply(Action("restart", "wireguard_stalled", "wireguard stalled"))
    assert flannel.history.records == ()  # nothing attempted, not even a dry run
    assert agent.registry.get_sample_value("edgeheal_remediations_total", sample) == 1.0


@dataclass
class HeldLink:
    """The alert link as the actor reads it (its broker side: tests/mqtt/test_fleet_hold)."""

    fleet_hold: FleetHold | None = None


def _stale_world(tmp_path: Path, remediation: str, extra: str = "",
                 ) -> tuple[Clock, dict[str, Snapshot], list[Event], Context]:
    clock = Clock(now=10_000.0, step=0.001)
    conf = cfg.loads_generic(f"""
[agent]
node_name = "edge-1"
state_dir = "{tmp_path / 'state'}"
[[mqtt.targets]]
name = "broker-direct"
host = "127.0.0.1"
path = "direct"
[alerts]
target = "broker-direct"
[control]
servers = ["127.0.0.1:6443"]
[remediation]
mode = "none"
{remediation}
[remediation.control]
enabled = true
startup_grace = "0s"
act_after = "0s"
{extra}
""")
    state = {"snap": snapshot("heartbeat_stale", State.FAILED, clock.now, since=clock.now)}
    events: list[Event] = []
    ctx = Context(config=conf, registry=CollectorRegistry(), clock=clock, wall=clock.wall,
                  snapshot=lambda: state["snap"], emit=events.append)
    return clock, state, events, ctx


def _counted(ctx: Context, result: str) -> float | None:
    return ctx.registry.get_sample_value("edgeheal_remediations_total", {
        "ladder": "control", "action": "skip", "result": result})


async def test_a_fleet_hold_holds_the_agent_restart_until_it_expires(tmp_path: Path) -> None:
    clock, state, events, ctx = _stale_world(tmp_path, 'restart_jitter = "0s"')
    ctx = replace(ctx, config=replace(ctx.config, fleet=replace(ctx.config.fleet, hold=True)))
    link = HeldLink(FleetHold("K3s server upgrade", clock.wall() + timedelta(seconds=30),
                              "ops"))
    ctx = replace(ctx, alert_link=link)  # type: ignore[arg-type]
    unit = Unit(lambda: state.update(snap=snapshot("ok", State.OK, clock.now + 1.0)))
    rem = ControlRemediator(ctx, remedy_factory=lambda mode: unit, boot="b",
                            boot_clock=lambda: clock.now + 4000.0, tick=0.001)
    assert _counted(ctx, "fleet_hold") == 0.0  # counted from the start
    for _ in range(3):
        assert kinds(await rem.evaluate(state["snap"])) == [("skip", "fleet_hold")]
    assert unit.restarts == 0
    assert [e.kind for e in events].count("control_ladder.skipped") == 1  # once an episode
    assert _counted(ctx, "fleet_hold") == 1.0
    assert rem.view()["fleet_hold"].startswith("K3s server upgrade by ops, until ")
    clock.advance(31)  # the hold ends at its until, no release needed
    state["snap"] = snapshot("heartbeat_stale", State.FAILED, clock.now, since=10_000.0)
    assert kinds(await rem.evaluate(state["snap"])) == [("restart", "control_heartbeat_stale")]
    assert unit.restarts == 1
    assert rem.view()["fleet_hold"] is None


async def test_without_fleet_hold_on_a_held_link_changes_nothing(tmp_path: Path) -> None:
    clock, state, _events, ctx = _stale_world(tmp_path, 'restart_jitter = "0s"')
    link = HeldLink(FleetHold("hub down", clock.wall() + timedelta(hours=1)))
    ctx = replace(ctx, alert_link=link)  # type: ignore[arg-type]
    unit = Unit()
    rem = ControlRemediator(ctx, remedy_factory=lambda mode: unit, boot="b",
                            boot_clock=lambda: clock.now + 4000.0, tick=0.001)
    assert kinds(await rem.evaluate(state["snap"])) == [("restart", "control_heartbeat_stale")]
    assert "fleet_hold" not in rem.view()


async def test_the_first_agent_restart_waits_its_drawn_part_of_restart_jitter(
        tmp_path: Path) -> None:
    clock, state, events, ctx = _stale_world(tmp_path, 'restart_jitter = "20s"')
    unit = Unit(lambda: state.update(snap=snapshot("ok", State.OK, clock.now + 1.0)))
    rng = random.Random()  # noqa: S311 - a jitter source, not security
    draws: list[float] = []
    rng.random = lambda: draws.append(0.25) or 0.25  # type: ignore[method-assign]
    rem = ControlRemediator(ctx, remedy_factory=lambda mode: unit, boot="b",
                            boot_clock=lambda: clock.now + 4000.0, tick=0.001, rng=rng)
    start = clock.now
    assert kinds(await rem.evaluate(state["snap"])) == [("watch", "restart_jitter")]
    until = rem.history.jitter_until
    assert until == pytest.approx(start + 5.0, abs=0.1)  # 0.25 of 20 s
    saved = json.loads((tmp_path / "state" / "control-history.json").read_text())
    assert saved["jitter_until_boottime"] == pytest.approx(until + 4000.0)
    clock.now = until - 0.5
    assert kinds(await rem.evaluate(state["snap"])) == [("watch", "restart_jitter")]
    assert (rem.history.jitter_until, len(draws), unit.restarts) == (until, 1, 0)
    clock.now = until
    assert kinds(await rem.evaluate(state["snap"])) == [("restart", "control_heartbeat_stale")]
    assert unit.restarts == 1
    assert rem.history.jitter_until is None
    assert "control_ladder.skipped" not in [e.kind for e in events]  # a wait, not a skip


async def test_an_ok_check_ends_a_drawn_wait(tmp_path: Path) -> None:
    clock, state, _events, ctx = _stale_world(tmp_path, 'restart_jitter = "20s"')
    rng = random.Random()  # noqa: S311 - a jitter source, not security
    rng.random = lambda: 0.9  # type: ignore[method-assign]
    rem = ControlRemediator(ctx, remedy_factory=lambda mode: Unit(), boot="b",
                            boot_clock=lambda: clock.now + 4000.0, tick=0.001, rng=rng)
    assert kinds(await rem.evaluate(state["snap"])) == [("watch", "restart_jitter")]
    assert rem.history.jitter_until is not None
    state["snap"] = snapshot("ok", State.OK, clock.now)
    assert await rem.evaluate(state["snap"]) == []
    assert rem.history.jitter_until is None
    saved = json.loads((tmp_path / "state" / "control-history.json").read_text())
    assert saved.get("jitter_until_boottime") is None


def kinds(actions: list[Any]) -> list[tuple[str, str]]:
    return [(a.kind, a.reason) for a in actions]
