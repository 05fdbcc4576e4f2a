"""The probing traffic of the example config stays under the 4G budget (10 MB/day)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "mqtt_bytes.py"


@pytest.mark.netns
@pytest.mark.slow
def test_probing_with_default_intervals_costs_less_than_10_mb_a_day() -> None:
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
    assert per_day["example_config_plain"] < 10_000_000
    assert per_day["example_config_tls"] < 10_000_000
