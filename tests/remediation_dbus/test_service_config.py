"""[remediation.service]: the unit is `auto` or a K3s unit, never an arbitrary one."""

from __future__ import annotations

import pytest

from edgeheal.config import ConfigError
from edgeheal.settings import loads


@pytest.mark.parametrize(("toml", "unit", "timeout"), [
    ("", "auto", 120.0),
    ('[remediation.service]\nunit = "k3s-agent.service"', "k3s-agent.service", 120.0),
    ('[remediation.service]\nunit = "k3s.service"\ntimeout = "90s"', "k3s.service", 90.0),
    ('[remediation.service]\nunit = "k3s-edge.service"', "k3s-edge.service", 120.0),
])
def test_valid_service_settings_load(toml: str, unit: str, timeout: float) -> None:
    service = loads(toml).remediation.service
    assert (service.unit, service.timeout) == (unit, timeout)


@pytest.mark.parametrize(("toml", "key", "problem"), [
    ('unit = "sshd.service"', "remediation.service.unit", "K3s service unit"),
    ('unit = "k3s-agent"', "remediation.service.unit", "got 'k3s-agent'"),
    ('unit = "k3s.socket"', "remediation.service.unit", "K3s service unit"),
    ('unit = "k3s.service; reboot"', "remediation.service.unit", "K3s service unit"),
    ('unit = ""', "remediation.service.unit", "K3s service unit"),
    ("timeout = 0", "remediation.service.timeout", "greater than zero"),
    ('timeout = "soon"', "remediation.service.timeout", "duration"),
    ('unti = "auto"', "remediation.service.unti", "did you mean 'unit'"),
])
def test_bad_service_settings_name_the_key(toml: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads(f"[remediation.service]\n{toml}", source="edge.toml")
    assert info.value.key == key
    assert problem in info.value.problem
    assert str(info.value).startswith("edge.toml: ")
