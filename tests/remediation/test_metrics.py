"""The remediation metrics: counters at 0 from the start, gauges that survive a restart."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

from edgeheal.agent.remediation import Remediator
from edgeheal.agent.remediation.metrics import KNOWN, SKIP_REASONS
from edgeheal.agent.remediation.uplink_actor import UplinkRemediator
from edgeheal.core import flannel_ladder as policy
from edgeheal.core import safeguards as ladder
from edgeheal.core import uplink_ladder as uplink
from tests.remediation.support import Clock, ScriptedRemedy, World, make_config


def remediator(world: World, remedies: dict[str, ScriptedRemedy]) -> Remediator:
    return Remediator(world.ctx, remedy_factory=remedies.get,
                      boot_clock=lambda: world.clock.now + 4000.0, boot="boot-a", tick=0.001)


def gauge(world: World, name: str) -> float | None:
    return world.registry.get_sample_value(f"edgeheal_remediation_{name}", {"ladder": "flannel"})


def skips(*modules: ModuleType) -> set[str]:
    """Every ``Action("skip", <reason>)`` in the modules' source: a constant, a module
    constant, or ``view.reason`` (the uplink verdicts it never acts on)."""
    found: set[str] = set()
    for module in modules:
        for node in ast.walk(ast.parse(Path(str(module.__file__)).read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Action"
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == "skip"):
                reason = node.args[1]
                if isinstance(reason, ast.Constant):
                    found.add(reason.value)
                elif isinstance(reason, ast.Name):
                    found.add(getattr(module, reason.id))
                else:
                    assert ast.unparse(reason) == "view.reason", ast.unparse(reason)
                    found |= uplink.NO_RUNG_REASONS
    return found


def test_the_skip_reasons_are_the_policys() -> None:
    """Every skip reason of the Flannel ladder (its policy and the shared safeguards) is
    initialised, no more."""
    assert skips(policy, ladder) == set(SKIP_REASONS)


def test_the_uplink_ladders_skip_reasons_are_its_own() -> None:
    assert skips(uplink, ladder) == set(uplink.SKIP_REASONS)
    counted = {r for a, r in UplinkRemediator.COUNTED if a == "skip"}
    assert counted == {*uplink.SKIP_REASONS, "alert_not_durable"}


async def test_every_known_pair_exists_at_zero_before_anything_happens(tmp_path: Path) -> None:
    world = World(make_config(tmp_path, 'mode = "pod"'), Clock(step=0.01))
    remediator(world, {"pod": ScriptedRemedy("pod")})
    for action, result in KNOWN:
        assert world.metric(action, result) == 0.0
        assert world.registry.get_sample_value("edgeheal_remediations_total", {
            "ladder": "flannel", "action": action, "result": result}) == 0.0
    assert world.registry.get_sample_value(
        "edgeheal_remediation_duration_seconds_count", {"ladder": "flannel"}) == 0.0
    assert (gauge(world, "circuit_open"), gauge(world, "paused")) == (0.0, 0.0)
    assert (gauge(world, "budget_remaining"), gauge(world, "failures_in_row")) == (3.0, 0.0)


async def test_the_circuit_gauge_survives_a_restart_the_counter_does_not(
        tmp_path: Path) -> None:
    config = make_config(tmp_path, 'mode = "pod"\ngive_up_after = 2\ncooldown = "0s"')
    world = World(config, Clock(step=0.05))
    rem = remediator(world, {"pod": ScriptedRemedy("pod")})
    await rem.resolve()
    for _ in range(4):
        await rem.evaluate(world.snap)
    assert world.metric("open_circuit", "opened") == 1.0
    assert world.metric("restart", "not_recovered") == 2.0
    assert (gauge(world, "circuit_open"), gauge(world, "failures_in_row")) == (1.0, 2.0)
    assert gauge(world, "budget_remaining") == 1.0  # max_per_hour 3, two in the hour

    again = World(config, world.clock)  # the agent restarted on the same boot
    remediator(again, {"pod": ScriptedRemedy("pod")})
    assert again.metric("open_circuit", "opened") == 0.0
    assert (gauge(again, "circuit_open"), gauge(again, "failures_in_row")) == (1.0, 2.0)
    assert gauge(again, "budget_remaining") == 1.0


async def test_a_pause_shows_and_ends(tmp_path: Path) -> None:
    world = World(make_config(tmp_path, 'mode = "pod"'), Clock(step=0.01))
    remediator(world, {"pod": ScriptedRemedy("pod")})
    await world.handlers["remediation.pause"]({"for": "60s"})
    assert gauge(world, "paused") == 1.0
    world.clock.advance(61)
    assert gauge(world, "paused") == 0.0
