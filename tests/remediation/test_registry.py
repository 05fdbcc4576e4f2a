"""The remedy registry: modes in probe order, each remedy's own settings rules and restart
bound, and nothing above the remedies listing their modes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from edgeheal import config as cfg
from edgeheal import remedies
from edgeheal.agent.remediation import Remediator
from edgeheal.agent.remediation.attempt import restart_bound
from tests.remediation.support import Clock, World, make_config

EDGEHEAL = Path(__file__).resolve().parents[2] / "edgeheal"


def with_remediation(config: cfg.Config, **changes: Any) -> cfg.Config:
    return dataclasses.replace(config, remediation=dataclasses.replace(config.remediation,
                                                                       **changes))


def test_auto_probes_pod_first_then_the_k3s_unit() -> None:
    # the shipped order; a new Flannel remedy goes after them unless it is the surer sign
    assert remedies.modes()[:2] == ("pod", "k3s-service")


def test_the_defaults_pass_every_remedys_rules() -> None:
    remedies.validate(cfg.loads_generic(""))


@pytest.mark.parametrize(("changes", "key", "problem"), [
    ({"mode": "bogus"}, "remediation.mode",
     "expected " + " or ".join(repr(m) for m in ("auto", *remedies.modes(), "none"))
     + ", got 'bogus'"),
    ({"mode": "pod"}, "remediation.mode", "\"pod\" needs a [kubernetes] section"),
    ({"pod": cfg.PodRemedySettings(namespace="Kube_Flannel")}, "remediation.pod.namespace",
     "not a Kubernetes namespace name"),
    ({"pod": cfg.PodRemedySettings(label_selector=" ")}, "remediation.pod.label_selector",
     "is required"),
    ({"pod": cfg.PodRemedySettings(ready_timeout=0.0)}, "remediation.pod.ready_timeout",
     "must be greater than zero"),
    ({"service": cfg.ServiceSettings(unit="sshd.service")}, "remediation.service.unit",
     "a K3s service unit"),
    ({"service": cfg.ServiceSettings(timeout=0.0)}, "remediation.service.timeout",
     "must be greater than zero"),
])
def test_a_bad_remedy_setting_is_a_config_error_naming_its_key(
        changes: dict[str, Any], key: str, problem: str) -> None:
    with pytest.raises(cfg.ConfigError) as info:
        remedies.validate(with_remediation(cfg.loads_generic(""), **changes))
    assert info.value.key == key
    assert problem in info.value.problem


def test_a_k3s_unit_of_a_named_install_is_allowed() -> None:
    remedies.validate(with_remediation(
        cfg.loads_generic(""), service=cfg.ServiceSettings(unit="k3s-edge.service")))


def test_a_restart_is_bounded_by_the_active_remedys_own_limit(tmp_path: Path) -> None:
    config = make_config(tmp_path, 'mode = "pod"\n[remediation.pod]\nready_timeout = "45s"'
                         '\n[remediation.service]\ntimeout = "5m"')
    rem = Remediator(World(config, Clock()).ctx, remedy_factory=lambda mode: None,
                     boot="b")
    assert restart_bound(config, rem.LADDER, rem.mode) == 45.0 + 120.0  # pod: its own, plus margin
    by_mode = {r.mode: r.restart_bound(config) for r in remedies.registrations()}
    assert {"pod": 45.0, "k3s-service": 300.0}.items() <= by_mode.items()


ABOVE_THE_REMEDIES = sorted(str(p.relative_to(EDGEHEAL)) for band in ("core", "agent")
                            for p in (EDGEHEAL / band).rglob("*.py"))
assert "agent/remediation/flannel_actor.py" in ABOVE_THE_REMEDIES  # the glob still finds them


@pytest.mark.parametrize("path", ABOVE_THE_REMEDIES)
def test_nothing_above_the_remedies_names_a_mode(path: str) -> None:
    source = (EDGEHEAL / path).read_text(encoding="utf-8")
    named = [m for m in remedies.modes() if f'"{m}"' in source]
    assert not named, f"edgeheal/{path} names remedy modes {named}: ask the registry"
