"""The uplink ladder's actor — the shared remediation actor with the uplink's hooks: rungs
in escalation order, verification, the persisted history across an agent killed mid-rung,
pause/resume on the control socket, dry-run, the reboot's durable alert first, counters
labelled ``ladder="uplink"``. Rungs are scripted here (the real ones: test_rungs.py);
time is injected."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from edgeheal import config as cfg
from edgeheal.agent.remediation import Remediator, build_uplink
from edgeheal.agent.remediation.uplink_actor import UplinkRemediator
from edgeheal.base.compat import UTC
from edgeheal.model import CheckResult, CheckStatus, Context, Event, Snapshot, State
from edgeheal.remedies import Availability, RemedyOutcome
from tests.support import Clock

RUNGS = ("modem-reconnect", "link-bounce", "usb-reauthorize", "reboot")
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def make_config(tmp_path: Path, extra: str = "") -> cfg.Config:
    return cfg.loads_generic(f"""
[agent]
node_name = "edge-1"
state_dir = "{tmp_path / 'state'}"
[uplink]
interfaces = ["wwan0"]
[[mqtt.targets]]
name = "broker-direct"
host = "127.0.0.1"
path = "direct"
[remediation]
mode = "none"
[remediation.uplink]
enabled = true
act_after = "60s"
startup_grace = "0s"
cooldown = "10s"
verify_timeout = "5s"
reboot = true
rungs = {json.dumps(list(RUNGS))}
{extra}
""")


def status(name: str, state: State, reason: str, *, at: float, since: float = 0.0,
           ) -> CheckStatus:
    return CheckStatus(name=name, state=state, reason=reason, message="", since=EPOCH,
                       since_mono=since, detail={}, required=False, runs=3,
                       observed=CheckResult(state, reason), last_run_mono=at)


class Rung:
    def __init__(self, mode: str, world: World, *, cures: bool = False) -> None:
        self.mode, self.world, self.cures = mode, world, cures
        self.calls = 0

    async def probe(self) -> Availability:
        return Availability(True, f"scripted {self.mode}")

    async def restart(self) -> RemedyOutcome:
        self.calls += 1
        self.world.order.append(f"rung:{self.mode}")
        if self.cures:
            self.world.healthy = True
        return RemedyOutcome(target=self.mode)


class World:
    def __init__(self, config: cfg.Config, clock: Clock) -> None:
        self.config, self.clock = config, clock
        self.registry = CollectorRegistry()
        self.events: list[Event] = []
        self.order: list[str] = []
        self.handlers: dict[str, Callable[..., Any]] = {}
        self.healthy = False
        self.reason = "stuck"
        self.ctx = Context(config=config, registry=self.registry, clock=clock,
                           wall=clock.wall, snapshot=self.read, emit=self.emit,
                           control=self.handlers.__setitem__)

    def emit(self, event: Event) -> None:
        self.events.append(event)
        self.order.append(event.kind)

    def read(self) -> Snapshot:
        now = self.clock.now
        if self.healthy:
            checks = {"uplink": status("uplink", State.OK, "ok", at=now + 0.001),
                      "broker-direct": status("broker-direct", State.OK, "ok", at=now + 0.001)}
        else:
            checks = {"uplink": status("uplink", State.FAILED, self.reason, at=now),
                      "broker-direct": status("broker-direct", State.FAILED, "timeout",
                                              at=now)}
        return Snapshot(node="edge-1", checks=checks, started_mono=0.0, taken_mono=now,
                        round_complete=True)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def metric(self, action: str, result: str) -> float:
        return self.registry.get_sample_value(
            "edgeheal_remediations_total",
            {"ladder": "uplink", "action": action, "result": result}) or 0.0


def actor(world: World, rungs: dict[str, Rung], *, boot: str = "boot-a",
          durable: Callable[[], bool] = lambda: True) -> UplinkRemediator:
    return UplinkRemediator(world.ctx, remedy_factory=rungs.get, durable=durable,
                            boot_clock=lambda: world.clock.now + 4000.0, boot=boot,
                            tick=0.001)


def rungs_for(world: World, cure: str = "") -> dict[str, Rung]:
    return {m: Rung(m, world, cures=m == cure) for m in RUNGS}


async def test_no_coverage_gets_no_rung_and_one_skip_alert(tmp_path: Path) -> None:
    world = World(make_config(tmp_path), Clock(now=10_000.0))
    world.reason = "no_coverage"
    rungs = rungs_for(world)
    rem = actor(world, rungs)
    await rem.probe_rungs()
    for _ in range(50):
        world.clock.advance(600)
        await rem.evaluate(world.read())
    assert sum(r.calls for r in rungs.values()) == 0
    assert world.kinds() == ["uplink_ladder.skipped"]
    assert world.events[0].detail["reason"] == "no_coverage"
    assert world.metric("skip", "no_coverage") == 1.0


async def test_the_rungs_escalate_until_one_cures(tmp_path: Path) -> None:
    world = World(make_config(tmp_path), Clock(now=10_000.0, step=0.05))
    rungs = rungs_for(world, cure="usb-reauthorize")
    rem = actor(world, rungs)
    await rem.probe_rungs()
    assert rem.usable == RUNGS
    for _ in range(20):
        world.clock.advance(30)
        await rem.evaluate(world.read())
        if world.healthy:
            break
    assert [r for r in world.order if r.startswith("rung:")] == [
        "rung:modem-reconnect", "rung:link-bounce", "rung:usb-reauthorize"]
    assert rungs["reboot"].calls == 0
    assert world.kinds().count("uplink_ladder.failed") == 2
    assert world.kinds()[-1] == "uplink_ladder.recovered"
    assert rem.history.failures_in_row == 0
    assert world.metric("restart", "not_recovered") == 2.0
    assert world.metric("restart", "recovered") == 1.0
    view = rem.view()
    assert [a["mode"] for a in view["actions"]] == [
        "usb-reauthorize", "link-bounce", "modem-reconnect"]
    assert view["rungs"]["reboot"]["usable"] is True


async def test_an_agent_killed_mid_rung_resumes_the_ladder_within_its_budget(
        tmp_path: Path) -> None:
    """kill -9 during rung 1: the attempt was persisted before it ran, so the restarted agent
    (same boot) counts it for the cooldown and the budget and goes on with rung 2."""
    config = make_config(tmp_path, "max_per_hour = 2")
    world = World(config, Clock(now=10_000.0, step=0.05))
    rungs = rungs_for(world)
    first = actor(world, rungs)
    await first.probe_rungs()

    path = tmp_path / "state" / "uplink-history.json"
    disk: list[str] = []

    async def dies() -> RemedyOutcome:
        disk.append(path.read_text())  # what is on disk when SIGKILL lands mid-rung
        return RemedyOutcome(target="never seen")

    rungs["modem-reconnect"].restart = dies  # type: ignore[method-assign]
    world.clock.advance(100)
    await first.evaluate(world.read())
    path.write_text(disk[0])  # the process died there: nothing after it reached the disk
    saved = json.loads(path.read_text())
    assert [r["result"] for r in saved["records"]] == ["in_progress"]

    second = actor(world, rungs_for(world))  # the new process, same boot
    await second.probe_rungs()
    (record,) = second.history.records
    assert (record.mode, record.result) == ("modem-reconnect", "interrupted")
    assert second.history.failures_in_row == 1
    assert [a.reason for a in await second.evaluate(world.read())] == ["cooldown"]
    world.clock.advance(15)
    actions = await second.evaluate(world.read())
    assert [(a.kind, a.rung) for a in actions] == [("restart", "link-bounce")]
    world.clock.advance(15)
    assert [a.reason for a in await second.evaluate(world.read())] == ["budget_exhausted"]
    assert not (tmp_path / "state" / "remediation-history.json").exists()  # its own file

    third = actor(world, rungs_for(world), boot="boot-b")  # after a reboot: a new boot
    assert third.history.failures_in_row == 2  # the streak outlives the boot ...
    assert all(r.mono is None for r in third.history.records)  # ... the windows do not


async def test_pause_and_resume_through_the_control_commands(tmp_path: Path) -> None:
    world = World(make_config(tmp_path), Clock(now=10_000.0, step=0.05))
    rungs = rungs_for(world)
    rem = actor(world, rungs)
    await rem.probe_rungs()
    assert {"remediation.uplink.pause", "remediation.uplink.resume",
            "remediation.uplink.reset"} <= set(world.handlers)
    view = await world.handlers["remediation.uplink.pause"]({"for": "1h"})
    assert view["paused_until"] is not None
    world.clock.advance(100)
    assert [a.reason for a in await rem.evaluate(world.read())] == ["paused"]
    assert sum(r.calls for r in rungs.values()) == 0
    await world.handlers["remediation.uplink.resume"]({})
    assert [a.rung for a in await rem.evaluate(world.read())] == ["modem-reconnect"]


async def test_dry_run_says_everything_and_does_nothing(tmp_path: Path) -> None:
    world = World(make_config(tmp_path, "dry_run = true"), Clock(now=10_000.0, step=0.05))
    rungs = rungs_for(world)
    rem = actor(world, rungs)
    await rem.probe_rungs()
    world.clock.advance(100)
    await rem.evaluate(world.read())
    assert sum(r.calls for r in rungs.values()) == 0
    assert world.kinds() == ["uplink_ladder.skipped"]
    assert world.events[0].detail["dry_run"] is True
    assert world.metric("restart", "dry_run") == 1.0


def _at_the_reboot(world: World, rem: UplinkRemediator) -> None:
    from edgeheal.core.safeguards import History

    rem.store(History(failures_in_row=3))  # three rungs already failed to cure


async def test_the_reboot_alert_is_in_the_outbox_before_logind_is_asked(
        tmp_path: Path) -> None:
    world = World(make_config(tmp_path), Clock(now=200_000.0, step=0.05))
    rungs = rungs_for(world)
    rem = actor(world, rungs)
    await rem.probe_rungs()
    _at_the_reboot(world, rem)
    await rem.evaluate(world.read())
    assert world.order.index("uplink_ladder.rebooting") < world.order.index("rung:reboot")
    assert rungs["reboot"].calls == 1


async def test_no_reboot_when_the_outbox_cannot_keep_its_alert(tmp_path: Path) -> None:
    world = World(make_config(tmp_path), Clock(now=200_000.0, step=0.05))
    rungs = rungs_for(world)
    rem = actor(world, rungs, durable=lambda: False)
    await rem.probe_rungs()
    _at_the_reboot(world, rem)
    actions = await rem.evaluate(world.read())
    assert [a.rung for a in actions] == ["reboot"]
    assert rungs["reboot"].calls == 0
    assert world.kinds() == ["uplink_ladder.rebooting", "uplink_ladder.skipped"]
    assert world.events[-1].detail["reason"] == "alert_not_durable"
    assert rem.history.records == ()  # nothing attempted, nothing counted


async def test_both_ladders_share_one_registry_and_keep_their_own_label(
        tmp_path: Path) -> None:
    world = World(make_config(tmp_path), Clock(now=10_000.0, step=0.05))
    flannel = Remediator(world.ctx, remedy_factory=lambda mode: None, boot="boot-a",
                         boot_clock=lambda: world.clock.now + 4000.0, tick=0.001)
    up = build_uplink(world.ctx, durable=lambda: True)
    assert isinstance(up, UplinkRemediator)
    flannel.restarts.labels(action="skip", result="x").inc()
    up.restarts.labels(action="skip", result="x").inc()
    for ladder in ("flannel", "uplink"):
        assert world.registry.get_sample_value(
            "edgeheal_remediations_total",
            {"ladder": ladder, "action": "skip", "result": "x"}) == 1.0
    assert "remediation.pause" in world.handlers
    assert "remediation.uplink.pause" in world.handlers


def test_the_ladder_is_off_by_default(tmp_path: Path) -> None:
    world = World(cfg.loads_generic(f'[agent]\nstate_dir = "{tmp_path}"\n'), Clock())
    assert build_uplink(world.ctx, durable=lambda: True) is None
    assert not world.config.uplink.interfaces
    assert not world.config.remediation.uplink.reboot


async def test_the_rungs_are_probed_only_once_the_uplink_is_in_trouble(
        tmp_path: Path) -> None:
    world = World(make_config(tmp_path), Clock(now=10_000.0, step=0.05))
    world.healthy = True
    probed: list[str] = []

    def make(mode: str) -> Rung:
        probed.append(mode)
        return Rung(mode, world)

    rem = UplinkRemediator(world.ctx, remedy_factory=make, boot="boot-a",
                           boot_clock=lambda: world.clock.now + 4000.0, tick=0.001)
    await rem.resolve()
    for _ in range(5):
        world.clock.advance(100)
        await rem.evaluate(world.read())
    assert probed == []  # a healthy uplink: no rung built, no D-Bus call
    assert rem.view()["mode"] == "not probed"
    world.healthy = False
    await rem.evaluate(world.read())
    assert probed == list(RUNGS)
    assert rem.usable == RUNGS


async def test_the_cli_pauses_and_resumes_the_uplink_ladder_over_the_control_socket(
        tmp_path: Path) -> None:
    import asyncio
    import sys

    from edgeheal.boundaries import control_socket as control

    world = World(make_config(tmp_path), Clock(now=10_000.0, step=0.01))
    rem = actor(world, rungs_for(world))
    flannel = Remediator(world.ctx, remedy_factory=lambda mode: None, boot="boot-a",
                         boot_clock=lambda: world.clock.now + 4000.0, tick=0.001)
    server = control.ControlServer(world.config.agent.state_dir)
    for name, handler in world.handlers.items():
        server.register(name, handler)
    conf = tmp_path / "edge.toml"
    conf.write_text(f'[agent]\nstate_dir = "{world.config.agent.state_dir}"\n')

    async def cli(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "edgeheal", "remediation", *args, "--config", str(conf),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, (out + err).decode()

    await server.start()
    try:
        code, text = await cli("pause", "--for", "2h", "--ladder", "uplink")
        assert code == 0, text
        assert rem.history.paused(world.clock.now)
        assert not flannel.history.paused(world.clock.now)  # the other ladder untouched
        code, text = await cli("resume", "--ladder", "uplink")
        assert code == 0, text
        assert not rem.history.paused(world.clock.now)
    finally:
        await server.close()


async def test_a_stuck_after_no_coverage_waits_act_after_from_the_change(
        tmp_path: Path) -> None:
    """The uplink has been failed since the coverage went (the snapshot's ``since_mono``);
    when the verdict turns to ``stuck`` the ladder still waits its ``act_after`` (60 s)."""
    world = World(make_config(tmp_path), Clock(now=10_000.0, step=0.05))
    world.reason = "no_coverage"
    rungs = rungs_for(world)
    rem = actor(world, rungs)
    await rem.probe_rungs()
    await rem.evaluate(world.read())
    world.clock.advance(600)
    world.reason = "stuck"
    for _ in range(5):  # seen stuck at the first; 40 s later: not yet
        world.clock.advance(10)
        await rem.evaluate(world.read())
    assert sum(r.calls for r in rungs.values()) == 0
    world.clock.advance(25)  # 65 s after the change
    await rem.evaluate(world.read())
    assert rungs["modem-reconnect"].calls == 1


ALL_RUNGS = ("modem-reconnect", "radio-cycle", "link-bounce", "modemmanager-restart",
             "usb-reauthorize", "reboot")


def _all(tmp_path: Path) -> tuple[World, dict[str, Rung]]:
    world = World(cfg.loads_generic(_with_rungs(tmp_path, ALL_RUNGS)),
                  Clock(now=10_000.0, step=0.05))
    return world, {m: Rung(m, world) for m in ALL_RUNGS}


def _with_rungs(tmp_path: Path, rungs: tuple[str, ...]) -> str:
    return f"""
[agent]
node_name = "edge-1"
state_dir = "{tmp_path / 'state'}"
[uplink]
interfaces = ["wwan0"]
[[mqtt.targets]]
name = "broker-direct"
host = "127.0.0.1"
path = "direct"
[remediation]
mode = "none"
[remediation.uplink]
enabled = true
act_after = "60s"
startup_grace = "0s"
cooldown = "10s"
verify_timeout = "5s"
reboot = true
rungs = {json.dumps(list(rungs))}
"""


async def test_a_denied_registration_gets_one_radio_cycle_then_only_alerts(
        tmp_path: Path) -> None:
    """A day of a network refusing the SIM, every rung usable (reboot too): exactly one
    radio-cycle, then the circuit opens with its critical alert, and nothing more."""
    world, rungs = _all(tmp_path)
    world.reason = "registration_denied"
    rem = actor(world, rungs)
    await rem.probe_rungs()
    for _ in range(24 * 6):  # a day in 10-minute steps
        world.clock.advance(600)
        await rem.evaluate(world.read())
    assert {m: r.calls for m, r in rungs.items() if r.calls} == {"radio-cycle": 1}
    assert "uplink_ladder.circuit_open" in world.kinds()
    circuit = next(e for e in world.events if e.kind == "uplink_ladder.circuit_open")
    assert "registration_denied" in circuit.message
    assert rem.history.circuit_open


async def test_a_vanished_modem_restarts_modemmanager_first_and_never_reconnects(
        tmp_path: Path) -> None:
    world, rungs = _all(tmp_path)
    world.reason = "modem_absent"
    rungs["modemmanager-restart"].cures = True
    rem = actor(world, rungs)
    await rem.probe_rungs()
    for _ in range(20):
        world.clock.advance(30)
        await rem.evaluate(world.read())
        if world.healthy:
            break
    assert [r for r in world.order if r.startswith("rung:")] == ["rung:modemmanager-restart"]
    assert world.kinds()[-1] == "uplink_ladder.recovered"
    assert rungs["modem-reconnect"].calls == 0
