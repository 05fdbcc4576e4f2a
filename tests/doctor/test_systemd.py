"""k3s-service mode (the unit, the polkit rule) and the service itself: recorded unit
properties for the logic, a real dbus-daemon with the stand-in systemd for the boundary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from edgeheal.lab.netns import Sandbox
from edgeheal.lab.systemd_bus import FakeSystemd, start_system_bus
from edgeheal.tools.doctor import k3s_service, service
from edgeheal.tools.doctor.finding import Result
from edgeheal.tools.doctor.system import NoBus, unit_properties
from tests.doctor.support import config, edge

SHIPPED_RULE = Path(__file__).resolve().parents[2] / "systemd/50-edgeheal-k3s-restart.rules"
AGENT = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running",
         "UnitFileState": "enabled", "User": "edgeheal", "DropInPaths": [],
         **service.HARDENING}
K3S_MODE = '[remediation]\nmode = "k3s-service"\n'


def units(**extra: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"edgeheal.service": dict(AGENT), "k3s-agent.service": {
        "LoadState": "loaded", "ActiveState": "active"}, **extra}


def rule(tmp_path: Path, text: str | None = None, mode: int = 0o644) -> Path:
    path = tmp_path / "50-edgeheal-k3s-restart.rules"
    path.write_text(SHIPPED_RULE.read_text() if text is None else text)
    path.chmod(mode)
    return path


async def test_the_shipped_rule_grants_exactly_the_restart(tmp_path: Path) -> None:
    node = edge()
    node.units = units()
    system = node.system(tmp_path, polkit_rule=rule(tmp_path))
    found, unit = await k3s_service.unit(config(K3S_MODE), system)
    assert (found.result, unit) == (Result.OK, "k3s-agent.service")
    found = await k3s_service.polkit(config(K3S_MODE), system, unit)
    assert found.result is Result.OK, found.found
    assert "lets edgeheal restart exactly k3s-agent.service" in found.found


@pytest.mark.parametrize(("change", "problem"), [
    (('"restart"', '"restart" || action.lookup("verb") === "stop"'), "not exactly restart"),
    (('"k3s-agent.service", ', ""), "do not list k3s-agent.service"),
    (('var USER = "edgeheal"', 'var USER = "nobody"'), "not edgeheal"),
    (("return polkit.Result.NO;", "return polkit.Result.YES;"), "NO to everything else"),
])
async def test_a_rule_that_grants_more_or_else_fails(tmp_path: Path, change: tuple[str, str],
                                                     problem: str) -> None:
    text = SHIPPED_RULE.read_text()
    assert change[0] in text
    node = edge()
    node.units = units()
    system = node.system(tmp_path, polkit_rule=rule(tmp_path, text.replace(*change)))
    found = await k3s_service.polkit(config(K3S_MODE), system, "k3s-agent.service")
    assert found.result is Result.FAIL
    assert problem in found.found


async def test_a_rule_others_can_edit_fails(tmp_path: Path) -> None:
    node = edge()
    node.units = units()
    system = node.system(tmp_path, polkit_rule=rule(tmp_path, mode=0o666))
    found = await k3s_service.polkit(config(K3S_MODE), system, "k3s-agent.service")
    assert found.result is Result.FAIL
    assert "writable by others" in found.found


async def test_a_missing_rule_fails_with_the_install_line(tmp_path: Path) -> None:
    node = edge()
    node.units = units()
    found = await k3s_service.polkit(config(K3S_MODE), node.system(tmp_path),
                                     "k3s-agent.service")
    assert found.result is Result.FAIL
    assert "install -m 0644" in found.fix


async def test_a_node_without_k3s_unit_fails_in_k3s_service_mode() -> None:
    node = edge()
    node.units = {"edgeheal.service": AGENT}
    found, unit = await k3s_service.unit(config(K3S_MODE), node.system())
    assert (found.result, unit) == (Result.FAIL, None)
    found, _ = await k3s_service.unit(config('[remediation]\nmode = "auto"\n'), node.system())
    assert found.result is Result.SKIP


async def test_without_a_system_bus_both_are_skipped_with_the_reason() -> None:
    node = edge()  # units None: no bus
    found, _ = await k3s_service.unit(config(K3S_MODE), node.system())
    assert found.result is Result.SKIP
    assert "no system bus" in found.found
    props = await service.read(node.system())
    assert service.running(props).result is Result.SKIP
    assert service.hardening(props).result is Result.SKIP


def test_an_enabled_running_service_as_shipped_is_ok() -> None:
    assert service.running(dict(AGENT)).result is Result.OK
    found = service.hardening(dict(AGENT))
    assert (found.result, found.found) == (Result.OK, "as shipped (user edgeheal)")


def test_a_stopped_or_disabled_service_fails() -> None:
    found = service.running({**AGENT, "UnitFileState": "disabled", "ActiveState": "failed",
                             "SubState": "failed"})
    assert found.result is Result.FAIL
    assert "not enabled (disabled)" in found.found
    assert "not running (failed/failed)" in found.found
    assert service.running({}).result is Result.FAIL  # not installed


def test_a_drop_in_that_weakens_the_hardening_warns_and_is_named() -> None:
    found = service.hardening({**AGENT, "ProtectSystem": "no", "User": "root",
                               "DropInPaths": ["/etc/systemd/system/edgeheal.service.d/x.conf"]})
    assert found.result is Result.WARN
    assert "ProtectSystem=no (shipped strict)" in found.found
    assert "x.conf" in found.found
    assert "User" not in found.detail["weakened"][0]


@pytest.mark.netns
async def test_unit_properties_are_read_over_a_real_bus(sandbox: Sandbox) -> None:
    bus = start_system_bus(sandbox)
    async with FakeSystemd.with_units(bus.address, {"k3s-agent.service": "active"}):
        props = await unit_properties(bus.address, "k3s-agent.service")
        assert (props["LoadState"], props["ActiveState"]) == ("loaded", "active")
        assert await unit_properties(bus.address, "edgeheal.service") == {}  # not-found


async def test_no_bus_socket_is_no_bus(tmp_path: Path) -> None:
    with pytest.raises(NoBus, match="no system bus"):
        await unit_properties(f"unix:path={tmp_path / 'nothing'}", "k3s.service")
    assert os.listdir(tmp_path) == []
