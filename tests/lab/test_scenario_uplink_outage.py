"""End to end: `edgeheal lab --scenario uplink-outage --quick` passes, leaving nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.support import leftovers, run_lab

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def test_uplink_outage_meets_its_expectations_and_cleans_up(tmp_path: Path) -> None:
    code, report, output, pid = run_lab("uplink-outage", tmp_path)
    assert report, output[-3000:]
    failed = [e for e in report["expectations"] if not e["held"]]
    assert report["passed"], f"{report.get('error')} {failed}\n{output[-3000:]}"
    assert code == 0
    assert (tmp_path / "report.svg").exists()
    assert leftovers(pid) == []
