"""The control ladder's actor with the real k3s-service remedy, a real dbus-daemon and the
stand-in systemd; the snapshot is scripted (the control check is tested in tests/control).
The stand-in's restart hook plays the K3s agent coming back: from then on the scripted
control check reports ``ok``."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from edgeheal.agent.remediation import build_control
from edgeheal.agent.remediation.control_actor import ControlRemediator
from edgeheal.base.compat import UTC
from edgeheal.config import Config, loads_generic
from edgeheal.lab.systemd_bus import Behaviour, FakeSystemd, SystemBus
from edgeheal.model import CheckResult, CheckStatus, Context, Event, Snapshot, State

AGENT = "k3s-agent.service"
DAY = 86400.0


@dataclass
class Node:
    """The scripted view of one edge node: the control check, a direct-path target and
    the uplink check."""

    control: tuple[State, str] = (State.FAILED, "heartbeat_stale")
    direct: State = State.OK
    uplink: State = State.OK
    cured_by_restart: bool = True
    restarted: int = 0
    balancer_present_at_restart: list[bool] = field(default_factory=list)
    balancer: Path | None = None
    started: float = field(default_factory=lambda: time.monotonic() - 3600.0)

    def on_restart(self, unit: str) -> None:
        self.restarted += 1
        if self.balancer is not None:
            self.balancer_present_at_restart.append(self.balancer.exists())
        if self.cured_by_restart:
            self.control = (State.OK, "ok")

    def snapshot(self) -> Snapshot:
        now = time.monotonic()

        def status(name: str, state: State, reason: str) -> CheckStatus:
            return CheckStatus(name=name, state=state, reason=reason, message="",
                               since=datetime.now(UTC), since_mono=self.started,
                               detail={}, required=False, runs=5,
                               observed=CheckResult(state, reason), last_run_mono=now)

        checks = {
            "control": status("control", *self.control),
            "broker-direct": status("broker-direct", self.direct,
                                    "ok" if self.direct is State.OK else "timeout"),
            "uplink": status("uplink", self.uplink,
                             "ok" if self.uplink is State.OK else "stuck"),
        }
        return Snapshot(node="edge-1", checks=checks, started_mono=self.started,
                        taken_mono=now, round_complete=True)


def config(state_dir: Path, balancer: Path | str = "", **ladder: object) -> Config:
    settings = {"enabled": "true", "startup_grace": '"0s"', "cooldown": '"0s"',
                "act_after": '"0s"', "max_per_hour": "10", "give_up_after": "2",
                "verify_timeout": '"2s"', "balancer_state": json.dumps(str(balancer)),
                **{k: str(v) for k, v in ladder.items()}}
    lines = "\n".join(f"{k} = {v}" for k, v in settings.items())
    return loads_generic(f"""
[agent]
node_name = "edge-1"
state_dir = "{state_dir}"

[[mqtt.targets]]
name = "broker-direct"
host = "127.0.0.1"
path = "direct"

[uplink]
interfaces = ["wwan0"]

[control]
servers = ["127.0.0.1:6443"]

[remediation]
mode = "none"
restart_jitter = "0s"

[remediation.service]
timeout = "10s"

[remediation.control]
{lines}
""")


@pytest.fixture
def bus_env(system_bus: SystemBus, monkeypatch: pytest.MonkeyPatch) -> SystemBus:
    """The actor builds the remedy itself; it finds the bus like the agent would."""
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", system_bus.address)
    return system_bus


def actor(node: Node, cfg: Config, events: list[Event], *,
          busy: tuple[str, ...] = (), registry: CollectorRegistry | None = None,
          ) -> ControlRemediator:
    ctx = Context(config=cfg, registry=registry or CollectorRegistry(),
                  clock=time.monotonic, snapshot=node.snapshot, emit=events.append)
    rem = build_control(ctx, others=lambda: busy)
    assert isinstance(rem, ControlRemediator)
    rem.boot_clock = lambda: time.monotonic() + DAY
    rem.tick = 0.05
    return rem


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


async def test_a_stale_heartbeat_restarts_the_agent_once_and_recovers(
        bus_env: SystemBus, tmp_path: Path) -> None:
    node, events, registry = Node(), list[Event](), CollectorRegistry()
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"},
                                      on_restart=node.on_restart) as fake:
        rem = actor(node, config(tmp_path), events, registry=registry)
        await rem.resolve()
        assert rem.view()["why"].startswith("not probed")
        actions = await rem.evaluate(node.snapshot())
        assert [a.kind for a in actions] == ["restart"]
        assert fake.restarts == [AGENT]
        (record,) = rem.history.records
        assert (record.mode, record.reason, record.result, record.target) == (
            "k3s-service", "control_heartbeat_stale", "recovered", AGENT)
        assert kinds(events) == ["control_ladder.restarted", "control_ladder.recovered"]
        assert "balancer_state" not in events[0].detail  # only for balancer_stuck
        assert registry.get_sample_value("edgeheal_remediations_total", {
            "ladder": "control", "action": "restart", "result": "recovered"}) == 1.0
        saved = json.loads((tmp_path / "control-history.json").read_text())
        assert [r["result"] for r in saved["records"]] == ["recovered"]
        view = rem.view()
        assert (view["mode"], view["circuit"], view["actions"][0]["result"]) == (
            "k3s-service", "closed", "recovered")
        assert await rem.evaluate(node.snapshot()) == []  # ok now: nothing more
        assert fake.restarts == [AGENT]


async def test_balancer_stuck_removes_the_state_file_before_the_restart(
        bus_env: SystemBus, tmp_path: Path) -> None:
    state = tmp_path / "k3s" / "k3s-agent-load-balancer.json"
    state.parent.mkdir()
    state.write_text('{"ServerURL": "https://10.0.0.1:6443", "ServerAddresses": []}')
    node = Node(control=(State.FAILED, "balancer_stuck"), balancer=state)
    events: list[Event] = []
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"},
                                      on_restart=node.on_restart) as fake:
        rem = actor(node, config(tmp_path / "state", balancer=state), events)
        await rem.evaluate(node.snapshot())
        assert fake.restarts == [AGENT]
    assert node.balancer_present_at_restart == [False]  # gone before RestartUnit
    restarted = next(e for e in events if e.kind == "control_ladder.restarted")
    assert restarted.detail["balancer_state"] == f"removed {state}"


async def test_balancer_stuck_restarts_anyway_when_the_file_cannot_be_removed(
        bus_env: SystemBus, tmp_path: Path) -> None:
    """procfs refuses removal as the shipped unit's read-only K3s directory does
    (ProtectSystem=strict: EROFS): the restart goes ahead and its alert says so."""
    node = Node(control=(State.FAILED, "balancer_stuck"))
    events: list[Event] = []
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"},
                                      on_restart=node.on_restart) as fake:
        rem = actor(node, config(tmp_path, balancer="/proc/version"), events)
        await rem.evaluate(node.snapshot())
        assert fake.restarts == [AGENT]
    restarted = next(e for e in events if e.kind == "control_ladder.restarted")
    assert restarted.detail["balancer_state"].startswith("not removed: ")
    assert "ProtectSystem" in restarted.detail["balancer_state"]


@pytest.mark.parametrize(("node", "busy", "reason"), [
    (Node(control=(State.FAILED, "server_unreachable")), (), "server_unreachable"),
    (Node(direct=State.FAILED), (), "path_down"),
    (Node(uplink=State.FAILED), (), "path_down"),
    (Node(), ("flannel",), "other_ladder"),
    (Node(control=(State.UNKNOWN, "confirming")), (), None),
])
async def test_no_restart_when_the_ladder_says_no(
        bus_env: SystemBus, tmp_path: Path, node: Node, busy: tuple[str, ...],
        reason: str | None) -> None:
    events: list[Event] = []
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"}) as fake:
        rem = actor(node, config(tmp_path), events, busy=busy)
        for _ in range(3):  # said once, never done
            actions = await rem.evaluate(node.snapshot())
            assert [a.reason if a.kind == "skip" else a.kind for a in actions] == (
                [reason] if reason else [])
        assert fake.restarts == []
        assert "RestartUnit" not in [m for m, _ in fake.calls]
    assert kinds(events) == (["control_ladder.skipped"] if reason else [])
    assert rem.history.records == ()


async def test_a_healthy_node_costs_no_dbus_call(bus_env: SystemBus, tmp_path: Path) -> None:
    node, events = Node(control=(State.OK, "ok")), list[Event]()
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"}) as fake:
        rem = actor(node, config(tmp_path), events)
        await rem.resolve()
        for _ in range(3):
            assert await rem.evaluate(node.snapshot()) == []
        assert fake.calls == []
        node.control = (State.FAILED, "node_ip_changed")
        node.cured_by_restart = False
        rem2 = actor(node, config(tmp_path, dry_run="true"), events)
        await rem2.evaluate(node.snapshot())
        assert fake.calls  # the probe, once in trouble
        assert fake.restarts == []  # dry run
        assert rem2.history.records[-1].result == "dry_run"


@pytest.mark.parametrize(("behaviour", "result", "message"), [
    (Behaviour.POLKIT_DENIED, "config_problem", "50-edgeheal-k3s-restart.rules"),
    (Behaviour.JOB_FAILS, "failed", "ended 'failed'"),
])
async def test_a_restart_that_fails_is_recorded_and_alerted(
        bus_env: SystemBus, tmp_path: Path, behaviour: Behaviour, result: str,
        message: str) -> None:
    node, events = Node(cured_by_restart=False), list[Event]()
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"},
                                      behaviour=behaviour, restart_delay=0.05):
        rem = actor(node, config(tmp_path), events)
        await rem.evaluate(node.snapshot())
    (record,) = rem.history.records
    assert record.result == result
    (failure,) = [e for e in events if e.kind == "control_ladder.failed"]
    assert message in failure.message


async def test_restarts_that_do_not_cure_open_the_circuit_and_stop(
        bus_env: SystemBus, tmp_path: Path) -> None:
    node, events = Node(cured_by_restart=False), list[Event]()
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"},
                                      on_restart=node.on_restart, restart_delay=0.05) as fake:
        rem = actor(node, config(tmp_path, verify_timeout='"1s"'), events)
        decided = []
        for _ in range(4):
            decided += [a.kind if a.kind != "skip" else a.reason
                        for a in await rem.evaluate(node.snapshot())]
        assert decided == ["restart", "restart", "open_circuit", "circuit_open"]
        assert fake.restarts == [AGENT, AGENT]
        assert "control_ladder.circuit_open" in kinds(events)
        assert rem.view()["circuit"] == "open"
        # the check ok again closes it; the operator's reset would too
        node.control = (State.OK, "ok")
        assert [a.kind for a in await rem.evaluate(node.snapshot())] == ["close_circuit"]
        assert rem.view()["circuit"] == "closed"
