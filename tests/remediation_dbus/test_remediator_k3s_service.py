"""The remediation ladder in `k3s-service` mode: the Remediator, the real remedy, a real
dbus-daemon and the stand-in systemd; the snapshot is scripted (the checks are tested in
their own suites). The stand-in's restart hook plays K3s's Flannel: it re-creates the
tunnel, and from then on the scripted WireGuard check reports it healthy again."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from edgeheal.agent.remediation import Remediator
from edgeheal.base.compat import UTC
from edgeheal.config import Config, loads_generic
from edgeheal.lab.systemd_bus import Behaviour, FakeSystemd, SystemBus
from edgeheal.model import CheckResult, CheckStatus, Context, Event, Snapshot, State

AGENT = "k3s-agent.service"
DAY = 86400.0


@dataclass
class Node:
    """The scripted view of one edge node: WireGuard and two MQTT targets."""

    wireguard: tuple[State, str] = (State.FAILED, "stalled")
    direct: State = State.OK
    tunnel: State = State.FAILED
    cured_by_restart: bool = True
    restarted: int = 0
    started: float = field(default_factory=time.monotonic)

    def on_restart(self, unit: str) -> None:
        self.restarted += 1
        if self.cured_by_restart:
            self.wireguard, self.tunnel = (State.OK, "ok"), State.OK

    def snapshot(self) -> Snapshot:
        now = time.monotonic()

        def status(name: str, state: State, reason: str) -> CheckStatus:
            return CheckStatus(name=name, state=state, reason=reason, message="",
                               since=datetime.now(UTC), since_mono=self.started,
                               detail={}, required=False, runs=5,
                               observed=CheckResult(state, reason), last_run_mono=now)

        checks = {
            "wireguard": status("wireguard", *self.wireguard),
            "broker-direct": status("broker-direct", self.direct,
                                    "ok" if self.direct is State.OK else "timeout"),
            "broker-tunnel": status("broker-tunnel", self.tunnel,
                                    "ok" if self.tunnel is State.OK else "timeout"),
        }
        return Snapshot(node="edge-1", checks=checks, started_mono=self.started,
                        taken_mono=now, round_complete=True)


def config(state_dir: Path, service_timeout: str = "10s", **remediation: object) -> Config:
    settings = {"mode": '"k3s-service"', "startup_grace": "0", "cooldown": "0",
                "uplink_settle": "0", "restart_jitter": "0",
                "max_per_hour": "10", "give_up_after": "2", "verify_timeout": "2",
                **{k: str(v) for k, v in remediation.items()}}
    lines = "\n".join(f"{k} = {v}" for k, v in settings.items())
    return loads_generic(f"""
[agent]
node_name = "edge-1"
state_dir = "{state_dir}"

[[mqtt.targets]]
name = "broker-direct"
host = "127.0.0.1"
path = "direct"

[[mqtt.targets]]
name = "broker-tunnel"
host = "127.0.0.1"
path = "tunnel"

[remediation]
{lines}

[remediation.service]
timeout = "{service_timeout}"
""")


@pytest.fixture
def bus_env(system_bus: SystemBus, monkeypatch: pytest.MonkeyPatch) -> SystemBus:
    """The Remediator builds the remedy itself; it finds the bus like the agent would."""
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", system_bus.address)
    return system_bus


def remediator(node: Node, cfg: Config, events: list[Event]) -> Remediator:
    ctx = Context(config=cfg, registry=CollectorRegistry(), clock=time.monotonic,
                  snapshot=node.snapshot, emit=events.append)
    return Remediator(ctx, boot_clock=lambda: time.monotonic() + DAY, boot="test-boot",
                      tick=0.05)


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


async def test_a_stalled_tunnel_restarts_the_unit_once_and_recovers(
        bus_env: SystemBus, tmp_path: Path) -> None:
    node = Node()
    events: list[Event] = []
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"},
                                      on_restart=node.on_restart) as fake:
        rem = remediator(node, config(tmp_path), events)
        await rem.resolve()
        assert rem.mode == "k3s-service"
        actions = await rem.evaluate(node.snapshot())
        assert [a.kind for a in actions] == ["restart"]
        assert fake.restarts == [AGENT]
        assert node.restarted == 1
        (record,) = rem.history.records
        assert (record.mode, record.result, record.target) == ("k3s-service", "recovered",
                                                               AGENT)
        assert kinds(events) == ["remediation.restarted", "remediation.recovered"]
        assert all(e.detail["mode"] == "k3s-service" for e in events)
        assert rem.view()["actions"][0]["result"] == "recovered"
        # healthy now: the next round does nothing more
        assert await rem.evaluate(node.snapshot()) == []
        assert fake.restarts == [AGENT]


@pytest.mark.parametrize(("node", "reason"), [
    (Node(wireguard=(State.DEGRADED, "rekey_failing"), tunnel=State.OK), "watch"),
    (Node(direct=State.FAILED), "direct_path_down"),
    (Node(wireguard=(State.UNKNOWN, "timeout"), tunnel=State.OK), None),
])
async def test_no_restart_when_the_ladder_says_no(
        bus_env: SystemBus, tmp_path: Path, node: Node, reason: str | None) -> None:
    events: list[Event] = []
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"}) as fake:
        rem = remediator(node, config(tmp_path), events)
        await rem.resolve()
        actions = await rem.evaluate(node.snapshot())
        assert [a.reason if a.kind == "skip" else a.kind for a in actions] == (
            [reason] if reason else [])
        assert fake.restarts == []
        assert "RestartUnit" not in [m for m, _ in fake.calls]


async def test_dry_run_says_what_it_would_do_and_restarts_nothing(
        bus_env: SystemBus, tmp_path: Path) -> None:
    node, events = Node(), list[Event]()
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"}) as fake:
        rem = remediator(node, config(tmp_path, dry_run="true"), events)
        await rem.resolve()
        await rem.evaluate(node.snapshot())
        assert fake.restarts == []
        assert rem.history.records[0].result == "dry_run"


@pytest.mark.parametrize(("behaviour", "result", "message"), [
    (Behaviour.POLKIT_DENIED, "config_problem", "50-edgeheal-k3s-restart.rules"),
    (Behaviour.JOB_FAILS, "failed", "ended 'failed'"),
    (Behaviour.NEVER_ACTIVE, "failed", "not active"),
])
async def test_a_restart_that_fails_is_recorded_and_alerted(
        bus_env: SystemBus, tmp_path: Path, behaviour: Behaviour, result: str,
        message: str) -> None:
    node, events = Node(cured_by_restart=False), list[Event]()
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"},
                                      behaviour=behaviour, restart_delay=0.05) as fake:
        rem = remediator(node, config(tmp_path, service_timeout="1.5s"), events)
        await rem.resolve()
        await rem.evaluate(node.snapshot())
        (record,) = rem.history.records
        assert record.result == result
        (failure,) = [e for e in events if e.kind == "remediation.failed"]
        assert message in failure.message
        expected = [] if behaviour is Behaviour.POLKIT_DENIED else [AGENT]
        assert fake.restarts == expected


async def test_restarts_that_do_not_cure_open_the_circuit_and_stop(
        bus_env: SystemBus, tmp_path: Path) -> None:
    node, events = Node(cured_by_restart=False), list[Event]()
    async with FakeSystemd.with_units(bus_env.address, {AGENT: "active"},
                                      on_restart=node.on_restart, restart_delay=0.05) as fake:
        rem = remediator(node, config(tmp_path, verify_timeout="0.3"), events)
        await rem.resolve()
        decided = []
        for _ in range(4):
            decided += [a.kind if a.kind != "skip" else a.reason
                        for a in await rem.evaluate(node.snapshot())]
        assert decided == ["restart", "restart", "open_circuit", "circuit_open"]
        assert fake.restarts == [AGENT, AGENT]
        assert "remediation.circuit_open" in kinds(events)
        assert rem.view()["circuit"] == "open"


async def test_auto_mode_picks_k3s_service_without_kubernetes_and_says_why(
        bus_env: SystemBus, tmp_path: Path) -> None:
    node, events = Node(), list[Event]()
    async with FakeSystemd.with_units(bus_env.address, {"k3s.service": "active"}):
        rem = remediator(node, config(tmp_path, mode='"auto"'), events)
        await rem.resolve()
        assert rem.mode == "k3s-service"
        assert "k3s.service" in rem.mode_why
        assert "K3s server" in rem.mode_why


async def test_auto_mode_without_a_k3s_unit_is_none_and_says_why(
        bus_env: SystemBus, tmp_path: Path) -> None:
    node, events = Node(), list[Event]()
    async with FakeSystemd.with_units(bus_env.address, {"sshd.service": "active"}) as fake:
        rem = remediator(node, config(tmp_path, mode='"auto"'), events)
        await rem.resolve()
        assert rem.mode == "none"
        assert "no K3s unit on this node" in rem.mode_why
        actions = await rem.evaluate(node.snapshot())
        assert [a.reason for a in actions] == ["mode_none"]
        assert fake.restarts == []
