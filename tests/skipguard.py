"""Under ``CI=true`` a skipped or xfailed test fails the run, unless it is allowed by name.

A skip is how a suite stops testing something without anyone noticing: a program missing on
the CI machine, a variable nobody sets, a fixture that gives up. Locally a skip is fine (a
developer without root still runs the pure tests); in CI every skip must be one we chose, so
each allowed node id carries the reason next to it (``tests/conftest.py``).

With pytest-xdist the workers run the tests and the controller sees every report again, so the
guard lives on the controller only (or in the single process without xdist): it collects
skips in ``pytest_runtest_logreport`` / ``pytest_collectreport`` and sets the exit status in
``pytest_sessionfinish``, which is what pytest returns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def install(config: pytest.Config, allowed: Mapping[str, str]) -> None:
    """Register the guard on ``config`` when running in CI, on the controller only."""
    if in_ci() and not hasattr(config, "workerinput"):
        config.pluginmanager.register(SkipGuard(allowed), "edgeheal-skip-guard")


def _base(nodeid: str) -> str:
    """``path::test[param]`` -> ``path::test``: an entry allows every parametrization."""
    return nodeid.split("[", 1)[0]


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    if hasattr(report, "wasxfail"):
        return f"xfail: {report.wasxfail or 'no reason given'}"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: why")
        return str(longrepr[2])
    return str(longrepr)


class SkipGuard:
    def __init__(self, allowed: Mapping[str, str]) -> None:
        self.allowed = allowed
        self.unexplained: dict[str, str] = {}

    def _note(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        nodeid = report.nodeid
        if nodeid in self.allowed or _base(nodeid) in self.allowed:
            return
        self.unexplained.setdefault(nodeid, _reason(report))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # a skip (setup or call), an xfail (reported as skipped), or an xpass (passed)
        if report.skipped or hasattr(report, "wasxfail"):
            self._note(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a module-level skip or importorskip
            self._note(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unexplained and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.unexplained:
            return
        terminalreporter.section("skips CI does not allow", sep="=", red=True, bold=True)
        for nodeid, reason in sorted(self.unexplained.items()):
            terminalreporter.line(f"{nodeid}: {reason}")
        terminalreporter.line(
            f"{len(self.unexplained)} test(s) did not run under CI=true: make them run, or "
            "allow them by node id with the reason in tests/conftest.py (CI_ALLOWED_SKIPS)")
