"""The k3s-service remedy against a real dbus-daemon and the stand-in systemd on it."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeheal.config import ServiceSettings
from edgeheal.lab.netns import Sandbox, stop_process
from edgeheal.lab.systemd_bus import Behaviour, FakeSystemd, SystemBus
from edgeheal.remedies import RemedyError
from edgeheal.remedies.k3s_service import K3sServiceRemedy

AGENT = "k3s-agent.service"
SERVER = "k3s.service"


def remedy(bus: SystemBus | str, unit: str = "auto", timeout: float = 10.0) -> K3sServiceRemedy:
    address = bus if isinstance(bus, str) else bus.address
    return K3sServiceRemedy(ServiceSettings(unit=unit, timeout=timeout), bus_address=address)


def methods(fake: FakeSystemd) -> list[str]:
    return [name for name, _ in fake.calls]


async def test_a_restart_subscribes_first_and_returns_once_the_unit_is_active_again(
        system_bus: SystemBus) -> None:
    hooked: list[str] = []
    fake = FakeSystemd.with_units(system_bus.address, {AGENT: "active"},
                                  on_restart=hooked.append, restart_delay=0.3)
    async with fake:
        outcome = await remedy(system_bus).restart()
        assert outcome.target == AGENT
        assert "done" in outcome.detail
        assert fake.restarts == [AGENT]
        assert hooked == [AGENT]
        assert fake.units[AGENT].active_state == "active"
        calls = methods(fake)
        assert calls.index("Subscribe") < calls.index("RestartUnit") < calls.index("Unsubscribe")
        assert fake.subscribers == 0


async def test_the_remedy_waits_for_the_job_and_the_unit_not_just_the_method_reply(
        system_bus: SystemBus) -> None:
    fake = FakeSystemd.with_units(system_bus.address, {AGENT: "active"}, restart_delay=1.0)
    async with fake:
        started = time.monotonic()
        await remedy(system_bus).restart()
        # causal bound: the job takes 1 s in the stand-in, so returning sooner means the
        # remedy did not wait for JobRemoved / ActiveState
        assert time.monotonic() - started >= 1.0


async def test_a_restart_job_that_fails_raises_naming_the_job_result(
        system_bus: SystemBus) -> None:
    fake = FakeSystemd.with_units(system_bus.address, {AGENT: "active"},
                                  behaviour=Behaviour.JOB_FAILS)
    async with fake:
        with pytest.raises(RemedyError, match=r"ended 'failed' \(unit is failed\)") as info:
            await remedy(system_bus).restart()
        assert info.value.config_problem is False
        assert fake.restarts == [AGENT]
        assert fake.subscribers == 0, "the remedy unsubscribes even when the job fails"


async def test_a_unit_that_does_not_come_back_raises_after_the_timeout(
        system_bus: SystemBus) -> None:
    fake = FakeSystemd.with_units(system_bus.address, {AGENT: "active"},
                                  behaviour=Behaviour.NEVER_ACTIVE, restart_delay=0.1)
    async with fake:
        started = time.monotonic()
        with pytest.raises(RemedyError, match=r"not active 1.5s later \(ActiveState "
                                              r"activating\)") as info:
            await remedy(system_bus, timeout=1.5).restart()
        took = time.monotonic() - started
        assert 1.5 <= took < 1.5 + 5.0
        assert info.value.config_problem is False
        assert fake.restarts == [AGENT]


async def test_a_missing_bus_is_an_error_naming_its_address(tmp_path: Path) -> None:
    address = f"unix:path={tmp_path}/no_bus_here"
    with pytest.raises(RemedyError, match="cannot connect to the D-Bus system bus at "
                                          f"unix:path={tmp_path}/no_bus_here") as info:
        await remedy(address).restart()
    assert info.value.config_problem is False
    availability = await remedy(address).probe()
    assert availability.usable is False
    assert address in availability.why


async def test_a_bus_without_systemd_on_it_is_an_error_saying_so(
        system_bus: SystemBus) -> None:
    with pytest.raises(RemedyError, match=r"org\.freedesktop\.systemd1.*ServiceUnknown"):
        await remedy(system_bus).restart()


async def test_a_call_denied_by_the_bus_policy_is_a_configuration_problem(
        denying_bus: SystemBus) -> None:
    fake = FakeSystemd.with_units(denying_bus.address, {AGENT: "active"})
    async with fake:
        with pytest.raises(RemedyError, match="AccessDenied") as info:
            await remedy(denying_bus).restart()
        assert info.value.config_problem is True
        assert "50-edgeheal-k3s-restart.rules" in str(info.value)
        assert fake.restarts == []
        assert fake.subscribers == 0


async def test_a_call_polkit_refuses_is_a_configuration_problem_naming_the_rule(
        system_bus: SystemBus) -> None:
    fake = FakeSystemd.with_units(system_bus.address, {AGENT: "active"},
                                  behaviour=Behaviour.POLKIT_DENIED)
    async with fake:
        with pytest.raises(RemedyError, match="InteractiveAuthorizationRequired") as info:
            await remedy(system_bus).restart()
        assert info.value.config_problem is True
        assert "/etc/polkit-1/rules.d/50-edgeheal-k3s-restart.rules" in str(info.value)
        assert fake.restarts == []


@pytest.mark.parametrize(("units", "picked", "why"), [
    ({AGENT: "active"}, AGENT, "K3s agent"),
    ({SERVER: "active"}, SERVER, "K3s server"),
    ({AGENT: "failed"}, AGENT, r"loaded \(failed\)"),
    ({AGENT: "active", SERVER: "inactive"}, AGENT, "the active one"),
    ({AGENT: "inactive", SERVER: "active"}, SERVER, "the active one"),
    ({AGENT: "active", SERVER: "active"}, None, "ambiguous.*both active"),
    ({AGENT: "inactive", SERVER: "inactive"}, None, "ambiguous.*neither active"),
    ({}, None, "no K3s unit on this node"),
    ({"sshd.service": "active"}, None, "no K3s unit on this node"),
])
async def test_unit_auto_picks_the_k3s_unit_of_this_node_and_says_why(
        system_bus: SystemBus, units: dict[str, str], picked: str | None, why: str) -> None:
    fake = FakeSystemd.with_units(system_bus.address, units)
    async with fake:
        availability = await remedy(system_bus).probe()
        assert availability.usable is (picked is not None)
        assert availability.why
        assert re.search(why, availability.why), availability.why
        if picked is None:
            with pytest.raises(RemedyError, match="cannot restart K3s") as info:
                await remedy(system_bus).restart()
            assert info.value.config_problem is True
            assert fake.restarts == []
        else:
            outcome = await remedy(system_bus).restart()
            assert outcome.target == picked
            assert fake.restarts == [picked]


async def test_a_configured_unit_is_the_only_one_restarted(system_bus: SystemBus) -> None:
    fake = FakeSystemd.with_units(system_bus.address, {AGENT: "active", SERVER: "active"})
    async with fake:
        assert (await remedy(system_bus, unit=SERVER).probe()).usable
        outcome = await remedy(system_bus, unit=SERVER).restart()
        assert outcome.target == SERVER
        assert fake.restarts == [SERVER]


async def test_a_configured_unit_that_is_not_installed_is_a_configuration_problem(
        system_bus: SystemBus) -> None:
    fake = FakeSystemd.with_units(system_bus.address, {AGENT: "active"})
    async with fake:
        availability = await remedy(system_bus, unit=SERVER).probe()
        assert availability.usable is False
        assert "k3s.service is not loaded (LoadState not-found)" in availability.why
        with pytest.raises(RemedyError, match="not loaded") as info:
            await remedy(system_bus, unit=SERVER).restart()
        assert info.value.config_problem is True
        assert fake.restarts == []


async def test_a_hook_failure_in_the_stand_in_fails_the_job(system_bus: SystemBus) -> None:
    """The lab's on_restart re-creates a tunnel device; if that breaks, the job fails."""
    def broken(unit: str) -> None:
        raise RuntimeError(f"cannot re-create the tunnel for {unit}")

    fake = FakeSystemd.with_units(system_bus.address, {AGENT: "active"}, on_restart=broken)
    async with fake:
        with pytest.raises(RemedyError, match="ended 'failed'"):
            await remedy(system_bus).restart()


async def test_two_restarts_in_a_row_each_wait_for_their_own_job(
        system_bus: SystemBus) -> None:
    fake = FakeSystemd.with_units(system_bus.address, {AGENT: "active"}, restart_delay=0.1)
    async with fake:
        first = await remedy(system_bus).restart()
        second = await remedy(system_bus).restart()
        assert "/job/1 " in first.detail
        assert "/job/2 " in second.detail
        assert fake.restarts == [AGENT, AGENT]


async def test_a_bus_that_goes_away_mid_restart_is_an_error_not_a_hang(
        system_bus: SystemBus, sandbox: Sandbox) -> None:
    daemon = sandbox.processes[0]

    async def kill_the_bus(unit: str) -> None:
        await asyncio.to_thread(stop_process, daemon)

    fake = FakeSystemd.with_units(system_bus.address, {AGENT: "active"},
                                  on_restart=kill_the_bus, restart_delay=0.1)
    async with fake:
        started = time.monotonic()
        with pytest.raises(RemedyError, match="lost the bus"):
            await remedy(system_bus, timeout=30.0).restart()
        assert time.monotonic() - started < 15.0


def test_importing_the_remedy_does_not_load_dbus_fast() -> None:
    code = ("import sys, edgeheal.remedies.k3s_service, edgeheal.config; "
            "assert 'dbus_fast' not in sys.modules, 'dbus_fast imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_a_malformed_bus_address_is_a_configuration_problem() -> None:
    with pytest.raises(RemedyError, match="not a usable D-Bus address: no-transport-here") \
            as info:
        await remedy("no-transport-here").restart()
    assert info.value.config_problem is True
