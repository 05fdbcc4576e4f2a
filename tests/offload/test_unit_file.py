"""The boot-time oneshot: ordered before network-pre and K3s, short timeout, and valid for
`systemd-analyze verify` (with ExecStart pointed at an existing binary, as scripts/test does:
verify insists that the ExecStart program exists on the machine it runs on)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "edgeheal-offload.service"


def _unit() -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text(encoding="utf-8"))
    return parser


def test_the_oneshot_runs_before_network_pre_and_k3s_without_blocking_boot() -> None:
    unit = _unit()
    assert unit["Unit"]["Wants"] == "network-pre.target"
    before = unit["Unit"]["Before"].split()
    assert {"network-pre.target", "k3s.service", "k3s-agent.service"} <= set(before)
    assert unit["Unit"]["DefaultDependencies"] == "no"
    assert unit["Service"]["Type"] == "oneshot"
    assert unit["Service"]["ExecStart"] == "/usr/local/bin/edgeheal offload apply"
    timeout = unit["Service"]["TimeoutStartSec"]
    assert timeout.endswith("s")
    assert int(timeout[:-1]) <= 30


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text(encoding="utf-8").replace(
        "/usr/local/bin/edgeheal", shutil.which("true") or "/bin/true"), encoding="utf-8")
    proc = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "edgeheal-offload.service" not in proc.stderr, proc.stderr
