"""The rebind rung: the policy's rows (when it comes before the restart, when not), the actor
running it and climbing to the restart, and the remedy against wireguard-go."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from edgeheal import remedies
from edgeheal.agent.remediation import Remediator
from edgeheal.boundaries import wg
from edgeheal.config import RemediationSettings, loads_generic
from edgeheal.core.flannel_ladder import History, Record, TunnelView, decide
from edgeheal.lab.netns import run
from edgeheal.lab.nsutil import inside
from edgeheal.lab.wireguard import WgMesh
from edgeheal.model import State
from edgeheal.remedies import RemedyError
from edgeheal.remedies.rebind import FLANNEL_PORTS, Rebind
from tests.remediation.support import Clock, ScriptedRemedy, World, make_config, until

OK, FAIL = State.OK, State.FAILED
SETTINGS = RemediationSettings(cooldown=120.0, max_per_hour=3, startup_grace=60.0,
                               give_up_after=3, verify_timeout=60.0)


def view(*, reason: str = "stalled", rung: str = "rebind", uplink: State | None = None,
         direct: State = OK, wg: State = FAIL) -> TunnelView:
    return TunnelView(mode="pod", wireguard=wg, wireguard_reason=reason,
                      tunnel_mqtt={"broker-tunnel": FAIL}, direct_mqtt={"broker-direct": direct},
                      started_mono=0.0, booted_mono=-10_000.0, direct_ok_since=-10_000.0,
                      first_rung=rung, uplink=uplink)


def attempt(mono: float, mode: str, result: str = "not_recovered") -> Record:
    return Record(mono=mono, wall="2026-01-01T00:00:00.000Z", mode=mode, reason="x",
                  result=result, duration=30.0)


# (id, view overrides, history, now, expected (kind, reason, rung))
CASES: list[tuple[str, dict[str, Any], History, float, list[tuple[str, str, str]]]] = [
    ("a stalled peer with the uplink fine is rebound first", {}, History(), 1000,
     [("restart", "wireguard_stalled", "rebind")]),
    ("so is a dead one", {"reason": "dead"}, History(), 1000,
     [("restart", "wireguard_dead", "rebind")]),
    ("an ok uplink check allows it", {"uplink": OK}, History(), 1000,
     [("restart", "wireguard_stalled", "rebind")]),
    ("an uplink in trouble goes straight to the restart", {"uplink": State.DEGRADED},
     History(), 1000, [("restart", "wireguard_stalled", "")]),
    ("a tunnel-path target failing while the WireGuard check still says ok is rebound "
     "first (the MQTT timeout comes before rx_stall_after)", {"wg": OK, "reason": "ok"},
     History(), 1000, [("restart", "tunnel_mqtt_failed", "rebind")]),
    ("but not while WireGuard says Flannel's own state is broken",
     {"wg": State.UNKNOWN, "reason": "connecting"}, History(), 1000,
     [("restart", "tunnel_mqtt_failed", "")]),
    ("never_connected is Flannel's state: a restart", {"reason": "never_connected"},
     History(), 1000, [("restart", "wireguard_never_connected", "")]),
    ("no_peers is Flannel's state: a restart", {"reason": "no_peers"}, History(), 1000,
     [("restart", "wireguard_no_peers", "")]),
    ("without the rung (off, or not usable here) the restart as always", {"rung": ""},
     History(), 1000, [("restart", "wireguard_stalled", "")]),
    ("an uncured rebind climbs to the restart at once: no cooldown after the rung", {},
     History(records=(attempt(990.0, "rebind"),), failures_in_row=1), 1000,
     [("restart", "wireguard_stalled", "")]),
    ("but the cooldown after a restart still holds the next rebind", {},
     History(records=(attempt(990.0, "pod", "recovered"),)), 1000,
     [("skip", "cooldown", "")]),
    ("a rebind is an attempt for the budget", {},
     History(records=tuple(attempt(t, m, "recovered") for t, m in
                           ((100.0, "rebind"), (400.0, "pod"), (700.0, "rebind")))), 1000,
     [("skip", "budget_exhausted", "")]),
    ("and for the circuit: rebind + two restarts that did not cure open it", {},
     History(records=(attempt(100.0, "rebind"), attempt(200.0, "pod"),
                      attempt(400.0, "pod")), failures_in_row=3), 1000,
     [("open_circuit", "wireguard_stalled", "")]),
    ("the direct path down is an outage: no rebind either", {"direct": FAIL}, History(), 1000,
     [("skip", "direct_path_down", "")]),
    ("within the startup grace: nothing", {}, History(), 30,
     [("skip", "startup_grace", "")]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_rung_before_the_restart(case: tuple[Any, ...]) -> None:
    _, overrides, hist, now, expected = case
    actions = decide(view(**overrides), hist, now, SETTINGS)
    assert [(a.kind, a.reason, a.rung) for a in actions] == expected
    assert all(a.message for a in actions)


def test_a_dry_run_says_it_would_rebind() -> None:
    (action,) = decide(view(), History(), 1000, replace(SETTINGS, dry_run=True))
    assert action.dry_run
    assert action.rung == "rebind"
    assert "would try rebind" in action.message


def test_the_rung_is_off_by_default_and_on_with_its_section(tmp_path: Path) -> None:
    (reg,) = remedies.registrations(remedies.PRE_RESTART)
    assert reg.mode == "rebind"
    assert "off" in reg.unavailable(loads_generic(""))
    assert reg.unavailable(loads_generic("[remediation.rebind]\nenabled = true\n")) == ""
    assert reg.mode not in remedies.modes()  # never a restart remedy, never auto's pick
    on = loads_generic('[remediation.rebind]\nenabled = true\nverify_timeout = "20s"\n')
    assert reg.verify_bound is not None
    assert reg.verify_bound(on) == 20.0


# --- the actor -------------------------------------------------------------------------------

def remediator(world: World, made: dict[str, ScriptedRemedy]) -> Remediator:
    return Remediator(world.ctx, remedy_factory=made.get,
                      boot_clock=lambda: world.clock.now + 4000.0, boot="boot-a", tick=0.001)


REBIND_ON = 'mode = "pod"\n[remediation.rebind]\nenabled = true\nverify_timeout = "3s"'


async def test_a_cured_rebind_counts_as_a_cure_and_no_restart_follows(tmp_path: Path) -> None:
    world = World(make_config(tmp_path, REBIND_ON), Clock(step=0.01))
    pod, rebind = ScriptedRemedy("pod"), ScriptedRemedy("rebind")
    rebind.on_restart = world.recover_after_restart
    rem = remediator(world, {"pod": pod, "rebind": rebind})
    await rem.resolve()
    assert rem.first is rebind
    (action,) = await rem.evaluate(world.snap)
    assert (action.kind, action.rung) == ("restart", "rebind")
    assert (rebind.calls, pod.calls) == (1, 0)
    assert world.kinds() == ["remediation.restarted", "remediation.recovered"]
    assert world.events[0].message.startswith("rebind: rebind flannel-xyz")
    assert rem.history.failures_in_row == 0
    (entry,) = rem.view()["actions"]
    assert (entry["mode"], entry["result"]) == ("rebind", "recovered")
    assert world.registry.get_sample_value(
        "edgeheal_remediations_total",
        {"ladder": "flannel", "action": "rebind", "result": "recovered"}) == 1.0
    assert await rem.evaluate(world.read()) == []  # healthy now: nothing more


async def test_an_uncured_rebind_climbs_to_the_restart_within_its_own_verify_bound(
        tmp_path: Path) -> None:
    world = World(make_config(tmp_path, 'cooldown = "10m"\n' + REBIND_ON), Clock(step=0.05))
    pod, rebind = ScriptedRemedy("pod"), ScriptedRemedy("rebind")
    pod.on_restart = world.recover_after_restart
    rem = remediator(world, {"pod": pod, "rebind": rebind})
    await rem.resolve()
    began = world.clock.now
    await rem.evaluate(world.snap)
    assert rebind.calls == 1
    assert 3.0 <= world.clock.now - began < 5.0  # the rung's 3 s, not verify_timeout's 5 s
    assert "rebind: rebind flannel-xyz, but the tunnel did not recover within 3s" in \
        world.events[-1].message
    assert rem.history.failures_in_row == 1
    (action,) = await rem.evaluate(world.snap)  # within the 10 min cooldown: no matter
    assert (action.kind, action.rung) == ("restart", "")
    assert (rebind.calls, pod.calls) == (1, 1)
    assert [a["mode"] for a in rem.view()["actions"]] == ["pod", "rebind"]  # newest first


async def test_without_the_section_the_ladder_is_unchanged(tmp_path: Path) -> None:
    world = World(make_config(tmp_path, 'mode = "pod"'), Clock(step=0.01))
    pod, rebind = ScriptedRemedy("pod"), ScriptedRemedy("rebind")
    rem = remediator(world, {"pod": pod, "rebind": rebind})
    await rem.resolve()
    assert rem.first is None
    await rem.evaluate(world.snap)
    assert (rebind.calls, pod.calls) == (0, 1)
    assert world.registry.get_sample_value(
        "edgeheal_remediations_total",
        {"ladder": "flannel", "action": "rebind", "result": "recovered"}) is None


# --- the remedy, against wireguard-go ------------------------------------------------------

@pytest.fixture
def mesh(tmp_path: Path) -> Any:
    m = WgMesh(2, keepalive=2, log_dir=tmp_path)
    try:
        yield m
    finally:
        m.close()


def rebinder(mesh: WgMesh, **kw: Any) -> Rebind:
    a, _ = mesh.nodes
    config = loads_generic(f'[wireguard]\ninterfaces = ["{a.ifname}", "flannel-wg-v6"]\n'
                           "[remediation.rebind]\nenabled = true\n")
    return Rebind(config, **kw)


async def test_the_remedy_moves_the_device_and_the_peer_follows(mesh: WgMesh) -> None:
    a, b = mesh.nodes
    mesh.wait_handshake(a, b)
    remedy = rebinder(mesh)
    probe = await remedy.probe()
    assert probe.usable, probe.why
    assert f"{a.ifname} (port 51820)" in probe.why  # the absent v6 device is left out
    outcome = await remedy.restart()
    port = (await wg.read_device(a.ifname)).listen_port
    assert outcome.target == f"{a.ifname} port 51820->{port}"
    assert 49152 <= port <= 65535
    assert port not in FLANNEL_PORTS
    # one keepalive (2 s) carries the new port to b
    await until(lambda: mesh.dump(b)[a.public_key][2],
                holds=lambda ep: ep == f"{a.underlay[b.index]}:{port}", within=15, every=0.2,
                what="b to learn a's new endpoint")
    assert run(["ping", "-c", "1", "-W", "2", a.overlay], ns=b.ns, check=False).returncode == 0


async def test_a_port_in_use_is_retried_with_another(mesh: WgMesh) -> None:
    a, _ = mesh.nodes
    with inside(a.ns):
        taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ports = iter([51820, 50001, 50002])  # Flannel's own port is never chosen
    try:
        taken.bind(("0.0.0.0", 50001))
        outcome = await rebinder(mesh, choose=lambda: next(ports)).restart()
    finally:
        taken.close()
    assert outcome.target.endswith("port 51820->50002")
    assert (await wg.read_device(a.ifname)).listen_port == 50002


async def test_when_no_port_binds_the_old_one_is_put_back(mesh: WgMesh) -> None:
    a, _ = mesh.nodes
    with inside(a.ns):
        taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        taken.bind(("0.0.0.0", 50003))
        with pytest.raises(RemedyError, match="no new port could be bound in 3 attempts"):
            await rebinder(mesh, choose=lambda: 50003).restart()
    finally:
        taken.close()
    assert (await wg.read_device(a.ifname)).listen_port == 51820


async def test_no_device_is_not_usable_and_says_which(tmp_path: Path) -> None:
    config = loads_generic('[wireguard]\ninterfaces = ["ehnone0"]\n'
                           "[remediation.rebind]\nenabled = true\n")
    remedy = Rebind(config, uapi_dir=tmp_path)
    probe = await remedy.probe()
    assert not probe.usable
    assert "ehnone0" in probe.why


async def test_a_rung_not_usable_yet_is_probed_again_alone(tmp_path: Path) -> None:
    # the device may appear after the agent (Flannel creates it): the actor probes the
    # rung again every minute, without probing the restart remedy (an API call) with it
    world = World(make_config(tmp_path, REBIND_ON), Clock(step=0.01))
    pod, rebind = ScriptedRemedy("pod"), ScriptedRemedy("rebind", usable=False)
    rem = remediator(world, {"pod": pod, "rebind": rebind})
    await rem.resolve()
    assert rem.first is None
    assert rem.first_wanted()
    assert not rem.reprobe_wanted()  # the configured pod remedy is not probed again
    rebind.usable = True
    await rem.resolve_first()
    assert rem.first is rebind
    assert not rem.first_wanted()
