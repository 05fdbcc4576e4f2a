"""The lab's command line: listing, refusing bad input, and cleaning up when interrupted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgeheal.lab.scenarios import SCENARIOS
from tests.lab.support import interrupt_after, leftovers


def _lab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgeheal", "lab", *args],
                          capture_output=True, text=True, check=False, timeout=60)


def test_list_names_every_scenario() -> None:
    proc = _lab("--list")
    assert proc.returncode == 0
    for name in SCENARIOS:
        assert name in proc.stdout


def test_an_unknown_scenario_is_a_usage_error() -> None:
    proc = _lab("--scenario", "nope")
    assert proc.returncode == 2
    assert "no scenario 'nope'; known: boot-with-offload" in proc.stderr


def test_a_missing_program_is_an_environment_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "edgeheal", "lab"], capture_output=True,
                          text=True, check=False, timeout=60,
                          env={"PATH": str(tmp_path)})
    assert proc.returncode == 3
    assert "install.sh --lab" in proc.stderr


@pytest.mark.slow
@pytest.mark.netns
def test_an_interrupted_lab_leaves_nothing_behind() -> None:
    code, output, pid = interrupt_after("agents started", Path("."))
    assert "interrupted; everything it made was removed" in output, output[-2000:]
    assert code == 1
    assert leftovers(pid) == []
