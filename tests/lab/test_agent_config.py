"""The lab edge's agent config, rendered once for the lab and the benchmarks: it loads, and
the shipped variant sets only what names the world."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgeheal import config
from edgeheal.base.compat import tomllib
from edgeheal.lab.agent_config import render
from edgeheal.lab.world import AGENT_PORT, BROKER_CLUSTER_IP, Edge

NAMING = {"node_name", "state_dir", "listen", "interfaces", "name", "host", "port", "path",
          "required", "target", "kubeconfig", "mode", "dbus_address", "enabled"}
"""Keys that name this world (or switch a feature on), not tune the agent."""


def _edge(tmp_path: Path, *, modem: bool) -> Edge:
    return Edge(index=3, name="edge-3", ns="ns3", carrier="g3", uplink="u3", wg_ifname="wg3",
                private_key="k", public_key="p", overlay="10.201.0.13",
                pod_cidr="10.42.13.0/24", workdir=tmp_path / "edge-3",
                modem_bus="unix:path=/run/lab-bus" if modem else "")


def _keys(doc: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for key, value in doc.items():
        rows = value if isinstance(value, list) else [value]
        for row in rows:
            out |= _keys(row) if isinstance(row, dict) else {key}
    return out


@pytest.mark.parametrize("shipped", [False, True])
@pytest.mark.parametrize("uplink", [False, True])
def test_every_variant_loads_and_names_this_edge(tmp_path: Path, shipped: bool,
                                                 uplink: bool) -> None:
    edge = _edge(tmp_path, modem=uplink)
    cfg = config.loads_generic(render(edge, mqtt_port=18830, shipped=shipped, uplink=uplink,
                              remediation="off"))
    assert (cfg.node, cfg.agent.state_dir) == ("edge-3", str(edge.state_dir))
    assert list(cfg.http.listen) == [f"127.0.0.1:{AGENT_PORT}"]
    assert [(t.name, t.host, t.port, t.path) for t in cfg.mqtt.targets] == [
        ("broker-tunnel", BROKER_CLUSTER_IP, 18830, "tunnel"),
        ("broker-direct", edge.cloud_ip, 18830, "direct")]
    assert (cfg.alerts.target, cfg.remediation.mode) == ("broker-direct", "off")
    assert list(cfg.uplink.interfaces) == (["u3"] if uplink else [])


@pytest.mark.parametrize("uplink", [False, True])
def test_the_shipped_variant_sets_only_what_names_the_world(tmp_path: Path,
                                                            uplink: bool) -> None:
    edge = _edge(tmp_path, modem=uplink)
    shipped = tomllib.loads(render(edge, mqtt_port=1, shipped=True, uplink=uplink))
    assert _keys(shipped) <= NAMING
    tuned = tomllib.loads(render(edge, mqtt_port=1, shipped=False, uplink=uplink))
    assert _keys(tuned) - NAMING >= {"check_interval", "fail_after", "cooldown"}


def test_extra_comes_after_the_base_and_before_the_uplink_sections(tmp_path: Path) -> None:
    text = render(_edge(tmp_path, modem=True), mqtt_port=1, shipped=False, uplink=True,
                  extra="[x]\ny = 1\n")
    assert text.index('mode = "pod"') < text.index("[x]\ny = 1\n") < text.index("[uplink]")


def test_the_pmtu_scenario_opts_in_to_the_clamp_and_tunes_only_at_the_labs_tuning(
        tmp_path: Path) -> None:
    from edgeheal import settings
    from edgeheal.lab.scenarios import SCENARIOS

    scenario = SCENARIOS["pmtu-blackhole"]
    edge = _edge(tmp_path, modem=False)
    extra = scenario.agent_extra.replace("{wg}", edge.wg_ifname)
    shipped = render(edge, mqtt_port=1, shipped=True, uplink=False, extra=extra)
    assert _keys(tomllib.loads(shipped)) <= NAMING | {"interface", "clamp"}  # no tuning
    cfg = settings.loads(shipped)
    assert (cfg.pmtu.interface, cfg.pmtu.clamp, cfg.pmtu.interval) == ("wg3", True, 3600.0)
    tuned = settings.loads(render(edge, mqtt_port=1, shipped=False, uplink=False,
                                  extra=extra + scenario.agent_extra_tuned))
    assert tuned.pmtu.interval == 20.0
