"""The fast tier under qemu-user (``scripts/test --arm64-unit``, which sets
``EDGEHEAL_TEST_QEMU_USER=aarch64``; :mod:`tests.qemu.arm64_chroot`).

qemu-user runs arm64 programs on this kernel by translating their system calls; a few it
does not translate, and those tests cannot run there, whatever the code does. They are
deselected by node id with the reason (:data:`UNRUNNABLE`), counted and printed; they never
count as passed, and an entry that matches no test fails the run (a renamed test must not
leave a stale excuse behind). Everything else runs as in ``scripts/test --fast``, skips
failing the run (tests/conftest.py registers the skip guard for the fast tier).

The run also has to prove it was arm64 code: the controller and every worker check
``platform.machine()``, and each worker reports the compiled extension modules it had
loaded by the end (their ELF headers read: machine 183, AArch64); a run that is not
aarch64, or that loaded an extension of another machine or none at all, fails.

With pytest-xdist the workers collect and deselect, and send what they saw to the
controller through ``config.workeroutput`` (xdist's channel for it), which prints and
judges it; without xdist the one process does both.
"""

from __future__ import annotations

import os
import platform
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

ENV = "EDGEHEAL_TEST_QEMU_USER"
MACHINE = "aarch64"
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
"""``e_machine`` values (the ELF specification's EM_X86_64, EM_AARCH64)."""

UNRUNNABLE: dict[str, str] = {
    # node id (without parameters: an entry covers every parametrization) or a test file
    # -> why it cannot run under qemu-user
    "tests/wireguard/test_netlink.py::test_without_the_kernel_module_a_device_is_reported_missing":
        "qemu-user (7.2) has no generic netlink: socket(AF_NETLINK, NETLINK_GENERIC) fails "
        "with EPROTONOSUPPORT before the kernel is asked (the arm64 guest proves this error "
        "on an arm64 kernel)",
}
"""What the fast tier cannot run under qemu-user, each with its reason."""

KEY = "edgeheal_qemu_user"


def active() -> str | None:
    """The machine the run must be (``aarch64``), or None outside the mode."""
    value = os.environ.get(ENV, "")
    if not value:
        return None
    if value != MACHINE:
        raise pytest.UsageError(f"${ENV}={value!r}: the only mode is {MACHINE!r}")
    return value


def entry_for(nodeid: str, entries: Iterable[str]) -> str | None:
    """The entry of ``entries`` that covers ``nodeid`` (itself, without its parameters, or
    its file)."""
    base = nodeid.split("[", 1)[0]
    path = nodeid.split("::", 1)[0]
    for candidate in (nodeid, base, path):
        if candidate in entries:
            return candidate
    return None


def elf_machine(path: Path) -> int:
    """The ``e_machine`` of an ELF file (a ValueError when it is not one)."""
    with path.open("rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    return int.from_bytes(head[18:20], "big" if head[5] == 2 else "little")


def compiled_modules(modules: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Every loaded extension module's file -> its machine's name (or the number)."""
    found: dict[str, str] = {}
    for module in list((sys.modules if modules is None else modules).values()):
        file = getattr(module, "__file__", None) or ""
        if file.endswith(".so"):
            number = elf_machine(Path(file))
            found[file] = ELF_MACHINES.get(number, str(number))
    return found


def dependencies(compiled: Iterable[str]) -> list[str]:
    """The extension modules of ``compiled`` that are not the interpreter's own."""
    own = str(sysconfig.get_config_var("DESTSHARED"))  # lib-dynload (of the base, in a venv)
    return sorted(f for f in compiled if not f.startswith(own))


def problems(machine: str, reports: Iterable[Mapping[str, Any]], whole_suite: bool,
             entries: Iterable[str]) -> list[str]:
    """What makes a run in the mode fail: the wrong machine, extensions of another machine
    or none, stale entries (only judged when the whole suite was collected)."""
    found: list[str] = []
    if machine != MACHINE:
        found.append(f"the controller ran on {machine}, not {MACHINE}")
    reports = list(reports)
    matched: set[str] = set()
    for report in reports:
        if report["machine"] != MACHINE:
            found.append(f"a worker ran on {report['machine']}, not {MACHINE}")
        foreign = sorted(f for f, m in report["compiled"].items() if m != MACHINE)
        if foreign:
            found.append(f"extension modules not built for {MACHINE}: {', '.join(foreign)}")
        if not dependencies(report["compiled"]):
            found.append("a session loaded no compiled module of a dependency: nothing "
                         f"proves the {MACHINE} builds of the dependencies were used")
        matched.update(report["matched"])
    if not reports:
        found.append("no test session reported what it ran")
    if whole_suite and reports:
        stale = sorted(set(entries) - matched)
        if stale:
            found.append("UNRUNNABLE entries that match no test (remove or rename them in "
                         f"tests/qemu_user.py): {', '.join(stale)}")
    return found


class QemuUserTier:
    """The mode's plugin (registered by tests/conftest.py when :func:`active`)."""

    def __init__(self, entries: Mapping[str, str] = UNRUNNABLE) -> None:
        self.entries = entries
        self.deselected: dict[str, str] = {}
        self.matched: set[str] = set()
        self.reports: list[dict[str, Any]] = []
        self.whole_suite = False

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        machine = platform.machine()
        if machine != MACHINE:
            raise pytest.UsageError(f"${ENV}={MACHINE}, but this Python runs on {machine}: "
                                    "run it through scripts/test --arm64-unit")
        testpaths = [str(Path(session.config.rootpath, p))
                     for p in session.config.getini("testpaths")]
        args = [str(Path(session.config.invocation_params.dir, a.split("::")[0]).resolve())
                for a in session.config.args]
        self.whole_suite = sorted(args) == sorted(testpaths)

    @pytest.hookimpl(trylast=True)  # after -m: an entry for a test outside the tier is stale
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        keep, drop = [], []
        for item in items:
            entry = entry_for(item.nodeid, self.entries)
            if entry is None:
                keep.append(item)
            else:
                self.matched.add(entry)
                self.deselected[item.nodeid] = self.entries[entry]
                drop.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def _report(self) -> dict[str, Any]:
        return {"machine": platform.machine(), "compiled": compiled_modules(),
                "matched": sorted(self.matched), "deselected": self.deselected}

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        config = session.config
        if hasattr(config, "workerinput"):  # an xdist worker: tell the controller
            config.workeroutput[KEY] = self._report()  # type: ignore[attr-defined]
            return
        if not config.pluginmanager.has_plugin("dsession"):  # no xdist: this process ran them
            self.reports.append(self._report())
        found = problems(platform.machine(), self.reports, self.whole_suite, self.entries)
        if found and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.problems = found

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        report = getattr(node, "workeroutput", {}).get(KEY)
        if report is not None:
            self.reports.append(report)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        deselected: dict[str, str] = {}
        compiled: dict[str, str] = {}
        for report in self.reports:
            deselected.update(report["deselected"])
            compiled.update(report["compiled"])
        tr = terminalreporter
        tr.section(f"qemu-user ({MACHINE})", sep="=", bold=True)
        machines = sorted({r["machine"] for r in self.reports})
        tr.line(f"ran as {', '.join(machines) or 'nothing'} in {len(self.reports)} "
                f"session(s); {len(compiled)} compiled extension modules loaded, "
                f"{sum(m == MACHINE for m in compiled.values())} of them {MACHINE}, "
                f"{len(dependencies(compiled))} of the dependencies'")
        tr.line(f"{len(deselected)} test(s) deselected: qemu-user cannot run them "
                "(not passed, not run):")
        for nodeid, reason in sorted(deselected.items()):
            tr.line(f"  {nodeid}: {reason}")
        for problem in getattr(self, "problems", []):
            tr.line(f"FAILED: {problem}", red=True, bold=True)
