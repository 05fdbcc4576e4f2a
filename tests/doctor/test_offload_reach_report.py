"""Offload (recorded driver feature sets), reachability (an injected probe), the table, the
JSON document against its schema, and the command's exit statuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edgeheal.boundaries.kernel.ethtool import Feature
from edgeheal.boundaries.mqtt import ProbeResult
from edgeheal.tools import doctor
from edgeheal.tools.doctor import offload, reach
from edgeheal.tools.doctor.finding import Result, fail, ok, skip, warn
from tests.agent.support import validate
from tests.doctor.support import config, edge
from tests.offload.helpers import FixtureSource, fixture

OFFLOAD = '[offload]\ninterfaces = ["wwan*"]\n'


def test_offload_on_is_a_failure_with_the_command_that_fixes_it() -> None:
    source = FixtureSource({"wwan0": fixture("e1000e")})
    found = offload.features(config(OFFLOAD), edge().system(features=lambda: source))
    assert found.result is Result.FAIL
    assert "wwan0 tx-checksum-ip-generic (on)" in found.found
    assert "edgeheal offload apply" in found.fix
    assert source.disabled == []  # read, never changed


def test_offload_off_everywhere_is_ok() -> None:
    features = {n: Feature(n, False, f.fixed) for n, f in fixture("e1000e").items()}
    source = FixtureSource({"wwan0": features})
    found = offload.features(config(OFFLOAD), edge().system(features=lambda: source))
    assert found.result is Result.OK
    assert found.detail["interfaces"] == ["wwan0"]


def test_no_matching_uplink_only_warns_unless_required() -> None:
    source = FixtureSource({"eth0": fixture("e1000e")})
    system = edge().system(features=lambda: source)
    assert offload.features(config(OFFLOAD), system).result is Result.WARN
    required = OFFLOAD + "require_interface = true\n"
    assert offload.features(config(required), system).result is Result.FAIL


BOTH = """
[[mqtt.targets]]
name = "broker-tunnel"
host = "10.43.0.20"
path = "tunnel"
[[mqtt.targets]]
name = "broker-direct"
host = "192.0.2.10"
path = "direct"
"""


async def test_a_dead_tunnel_beside_a_live_direct_path_blames_the_tunnel() -> None:
    limits = []

    async def probe(target: object, node: str, limit: float) -> ProbeResult:
        limits.append(limit)
        if getattr(target, "path", "") == "tunnel":
            return ProbeResult("timeout", None, "broker-tunnel (10.43.0.20:1883): no CONNACK")
        return ProbeResult("ok", 0.05, "CONNACK in 50.0 ms")

    tunnel, direct = await reach.brokers(config(BOTH), edge().system(mqtt_probe=probe))
    assert (tunnel.check, tunnel.result) == ("mqtt.tunnel", Result.FAIL)
    assert "the tunnel is at fault" in tunnel.found
    assert (direct.check, direct.result) == ("mqtt.direct", Result.OK)
    assert max(limits) <= reach.LIMIT


def test_the_table_puts_the_fix_under_what_was_found() -> None:
    text = doctor.render([ok("config", "valid"), fail("mtu", "too big", "lower it")])
    lines = text.splitlines()
    assert lines[0].split() == ["CHECK", "RESULT", "FOUND", "/", "FIX"]
    assert lines[2].split()[:2] == ["mtu", "fail"]
    assert lines[3].strip() == "fix: lower it"
    assert lines[-1] == "1 ok, 0 warn, 1 fail, 0 skip"


def test_the_json_document_follows_its_schema() -> None:
    rows = [ok("config", "valid", source="x"), warn("time", "unsynchronized", "enable NTP"),
            fail("mtu", "1560 > 1500", "lower it", mtu=1500), skip("kubernetes", "none")]
    doc = doctor.to_json(config(), rows)
    validate(doc, "doctor.schema.json")
    assert (doc["result"], doc["exit_code"]) == ("fail", 1)
    assert doc["counts"] == {"ok": 1, "warn": 1, "fail": 1, "skip": 1}
    clean = doctor.to_json(config(), rows[:2])
    validate(clean, "doctor.schema.json")
    assert (clean["result"], clean["exit_code"]) == ("warn", 0)


def test_a_bad_config_is_exit_status_2_before_any_check(tmp_path: Path) -> None:
    conf = tmp_path / "edgeheal.toml"
    conf.write_text("[agent]\nno_such_key = 1\n")
    proc = subprocess.run([sys.executable, "-m", "edgeheal", "doctor", "--config", str(conf)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "no_such_key" in proc.stderr
    assert proc.stdout == ""
    proc = subprocess.run([sys.executable, "-m", "edgeheal", "doctor", "--bogus"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
