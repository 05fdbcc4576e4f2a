"""The CI skip guard (:mod:`tests.skipguard`) on a tiny generated suite, run by a real pytest
in a subprocess, alone and under xdist (where the workers skip and the controller decides)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]

SUITE = '''
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("needs a program CI forgot")

@pytest.mark.xfail(reason="known bug")
def test_fails_as_expected():
    raise AssertionError

@pytest.mark.parametrize("n", [1, 2])
def test_allowed(n):
    pytest.skip("needs a real cluster")
'''

CONFTEST = '''
from tests import skipguard

def pytest_configure(config):
    skipguard.install(config, {"test_tiny.py::test_allowed": "needs a real cluster"})
'''

ALLOWED_ONLY = '''
import pytest

def test_runs():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_allowed(n):
    pytest.skip("needs a real cluster")
'''

MODES = {"alone": ["-p", "no:xdist"], "xdist": ["-n", "2"]}


def run(tmp_path: Path, mode: str, ci: str | None, suite: str = SUITE, args: tuple[str, ...] = (),
        **more: str) -> subprocess.CompletedProcess[str]:
    """Run ``suite`` as test_tiny.py (and ``more`` as further files) under the guard."""
    for name, text in {"test_tiny": suite, **more}.items():
        (tmp_path / f"{name}.py").write_text(text)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(CHECKOUT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), *MODES[mode], *args, str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("mode", MODES)
def test_under_ci_an_unexplained_skip_or_xfail_fails_the_run_and_is_named(
        tmp_path: Path, mode: str) -> None:
    proc = run(tmp_path, mode, ci="true")
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout + proc.stderr
    assert "skips CI does not allow" in proc.stdout
    assert "test_tiny.py::test_skips: Skipped: needs a program CI forgot" in proc.stdout
    assert "test_tiny.py::test_fails_as_expected: xfail: known bug" in proc.stdout
    assert "test_allowed" not in proc.stdout.split("skips CI does not allow")[1]
    assert "2 test(s) did not run under CI=true" in proc.stdout


@pytest.mark.parametrize("mode", MODES)
def test_outside_ci_skips_pass(tmp_path: Path, mode: str) -> None:
    proc = run(tmp_path, mode, ci=None)
    assert proc.returncode == pytest.ExitCode.OK, proc.stdout + proc.stderr
    assert "skips CI does not allow" not in proc.stdout


def test_under_ci_allowed_skips_pass(tmp_path: Path) -> None:
    proc = run(tmp_path, "xdist", ci="true", suite=ALLOWED_ONLY)
    assert proc.returncode == pytest.ExitCode.OK, proc.stdout + proc.stderr
    assert "2 skipped" in proc.stdout


def test_under_ci_a_module_level_skip_fails_the_run(tmp_path: Path) -> None:
    proc = run(tmp_path, "xdist", ci="true", suite="def test_runs():\n    pass\n",
               test_gone='import pytest\npytest.importorskip("no_such_module_here")\n')
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout + proc.stderr
    assert "test_gone.py: Skipped: could not import 'no_such_module_here'" in proc.stdout


def test_a_failure_keeps_its_own_exit_status(tmp_path: Path) -> None:
    proc = run(tmp_path, "alone", ci="true",
               suite=SUITE + "\ndef test_fails():\n    raise AssertionError\n")
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, proc.stdout + proc.stderr
    assert "skips CI does not allow" in proc.stdout


@pytest.mark.parametrize("mode", MODES)
def test_under_ci_a_test_deselected_by_its_marker_is_not_a_skip(tmp_path: Path,
                                                                 mode: str) -> None:
    """``scripts/test --fast`` deselects the root, daemon and vm tiers with ``-m``: what does
    not run there was chosen, so the guard must not report it."""
    suite = ("import pytest\n\ndef test_runs():\n    pass\n\n@pytest.mark.daemon\n"
             "def test_needs_a_daemon():\n    pytest.skip('no daemon here')\n")
    proc = run(tmp_path, mode, ci="true", suite=suite,
               args=("-o", "markers=daemon: needs a daemon", "-m", "not daemon"))
    assert proc.returncode == pytest.ExitCode.OK, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout  # (xdist's controller does not count the deselected)
    assert "skipped" not in proc.stdout
    assert "skips CI does not allow" not in proc.stdout
