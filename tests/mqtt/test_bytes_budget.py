"""The probing traffic of the example config with the shipped defaults: under 1 MB/day on a
healthy node (issue 32), and bounded while a dead path is being confirmed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "mqtt_bytes.py"


@pytest.mark.netns
@pytest.mark.slow
def test_probing_with_the_shipped_defaults_costs_less_than_1_mb_a_day() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--json", "--probes", "5",
                           "--link-seconds", "2.5"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    measured, per_day = result["measured"], result["per_day_bytes"]
    # sanity: the counters saw a real MQTT exchange, not nothing
    assert 300 < measured["probe_plain"]["bytes"] < 2000
    assert measured["probe_tls_resumed"]["bytes"] <= measured["probe_tls_full"]["bytes"]
    assert 100 < measured["keepalive_round"]["bytes"] < 400
    # a check on the kept-open session is one ping round, far less than a connection
    assert 100 < measured["session_ping_plain"]["bytes"] < measured["probe_plain"]["bytes"] / 2
    # a probe into a blackhole sends SYNs only (each 60 bytes with options), a few of them
    hole = measured["probe_blackholed"]
    assert 2 <= hole["packets"] <= 6
    assert hole["bytes"] == pytest.approx(60 * hole["packets"], abs=8 * hole["packets"])
    assert per_day["example_config_plain"] < 1_000_000  # healthy: the promise
    assert per_day["example_config_tls"] < 1_000_000
    # while a fault is confirmed the rate is higher, but the quick retries last 5 minutes
    # at most (QUICK_RETRY_FOR) and then stay within the healthy budget (SYNs into the hole
    # every interval cost more than a ping on the kept-open session: 0.9 against 0.7 MB)
    assert per_day["fault_example_config_quick"] < 10_000_000
    assert per_day["fault_example_config_after_quick"] < 1_000_000
