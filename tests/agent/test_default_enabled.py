"""A new check ships off: without its section in the file, its module builds no check."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from edgeheal import checks, config
from edgeheal.model import CheckResult, State
from tests.support import context


class _Probe:
    name = "probe"

    def __init__(self) -> None:
        self.settings = config.CheckSettings()

    async def run(self) -> CheckResult:
        return CheckResult(State.OK, "ok")


@pytest.fixture
def new_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check module registered the way a new one would be: ``default_enabled`` left off."""
    reg = checks.Registration("offload_extra", lambda ctx: [_Probe()],
                              names=lambda cfg: ("probe",), reasons=("ok",))
    monkeypatch.setitem(checks._REGISTRY, reg.module, reg)
    monkeypatch.setattr(checks, "BUILTIN", (*checks.BUILTIN, reg.module))
    monkeypatch.setattr(checks.importlib, "import_module",
                        _skip(reg.module, checks.importlib.import_module))


def _skip(module: str, real: Any) -> Any:
    return lambda name: None if name.endswith(f".{module}") else real(name)


def test_the_shipped_checks_are_on_by_default_and_say_so() -> None:
    on = {reg.module for reg in checks.registrations() if reg.default_enabled}
    assert on == {"offload", "wireguard", "mqtt", "uplink"}


def test_the_file_records_which_sections_it_sets() -> None:
    cfg = config.loads_generic('[offload]\ninterfaces = ["wwan0"]\n[[mqtt.targets]]\nname = "b"\n'
                       'host = "h"\n')
    assert cfg.sections == {"offload", "mqtt"}
    assert "sections" not in {key.split(".")[0] for key, _, _ in config.reference()}


@pytest.mark.usefixtures("new_module")
def test_a_new_check_builds_nothing_until_its_section_is_there() -> None:
    cfg = config.loads_generic('[offload]\ninterfaces = ["lo"]\n')
    without = checks.build(context(config=cfg).ctx)
    assert "probe" not in [c.name for c in without]
    assert "offload" in [c.name for c in without]  # the shipped ones still run
    # its settings class in config/schema/checks.py gives it a section; the file setting it is:
    cfg = dataclasses.replace(cfg, sections=cfg.sections | {"offload_extra"})
    assert "probe" in [c.name for c in checks.build(context(config=cfg).ctx)]
