"""Suite-wide guards: every test leaves no namespace, process or task behind, and under
``CI=true`` no test skips unless it is allowed below, with its reason.

The test tiers are markers: ``root``, ``daemon``, ``vm`` and ``slow`` (pyproject.toml). A test
that uses one of the fixtures in :data:`FIXTURE_MARKS` gets that fixture's markers here, so a
new test written with the usual fixtures is in the right tier without anyone marking it; a
test that makes its namespaces or daemons by hand marks its module (``pytestmark``). The fast
tier (``scripts/test --fast``, ``EDGEHEAL_TEST_TIER=fast``) deselects them and then checks the
marking: there a test that starts a daemon, a VM or a root-only program fails, naming the
marker it lacks, and a test that skips fails too (a skip there is a test that needed what the
tier leaves out). ``scripts/test --arm64-unit`` runs the fast tier as arm64 code under
qemu-user (:mod:`tests.qemu_user`)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from edgeheal.lab import netns
from edgeheal.lab.netns import Sandbox
from tests import qemu_user, skipguard

CI_ALLOWED_SKIPS: dict[str, str] = {
    # node id (without parameters: an entry covers every parametrization) -> why CI may skip it
    "tests/remediation/test_kube_real.py::test_the_node_has_exactly_one_flannel_pod":
        "needs a real K3s cluster (EDGEHEAL_TEST_KUBECONFIG, EDGEHEAL_TEST_NODE)",
    "tests/remediation/test_kube_real.py::test_events_and_the_node_condition_are_allowed":
        "needs a real K3s cluster (EDGEHEAL_TEST_KUBECONFIG, EDGEHEAL_TEST_NODE)",
    "tests/remediation/test_kube_real.py::test_restarting_this_nodes_flannel_pod":
        "needs a real K3s cluster and restarts a pod on it (EDGEHEAL_TEST_RESTART=1)",
}
"""Skips CI accepts. Everything else that skips or xfails under ``CI=true`` fails the run
(:mod:`tests.skipguard`): a program missing from install.sh must not quietly turn tests off."""


settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          max_examples=100, print_blob=True)
"""The fuzzers in CI: the same examples every run (derandomized), bounded in number."""
settings.register_profile("long", deadline=None, max_examples=5000)
"""A local hunt: ``EDGEHEAL_HYPOTHESIS_PROFILE=long pytest tests/hardening``."""
settings.load_profile(os.environ.get("EDGEHEAL_HYPOTHESIS_PROFILE", "ci"))


FIXTURE_MARKS: dict[str, tuple[str, ...]] = {
    # fixture -> the tiers a test using it (directly or through another fixture) is in
    "sandbox": ("root",),  # network namespaces
    "broker": ("root", "daemon"),  # mosquitto in a namespace (tests/mqtt)
    "system_bus": ("root", "daemon"),  # dbus-daemon (tests/remediation_dbus)
    "denying_bus": ("root", "daemon"),
    "modem_bus": ("root", "daemon"),  # dbus-daemon and ModemManager (tests/modem)
    "mesh": ("root", "daemon"),  # wireguard-go peers in namespaces (tests/wireguard)
    "mesh3": ("root", "daemon"),
    "lab": ("root",),  # veth pairs in namespaces (tests/offload)
    "guest_image": ("root", "vm"),  # the QEMU bed (tests/qemu)
    "vm": ("root", "vm"),
    "arm_image": ("root", "vm"),  # the arm64 guest (tests/qemu/test_guest_arm64.py)
    "arm_vm": ("root", "vm"),
    "debian_rootfs": ("root", "vm"),  # systemd-nspawn containers (tests/systemd)
    "container": ("root", "vm"),
}
MARK_IMPLIES: dict[str, tuple[str, ...]] = {"netns": ("root",)}
"""``netns`` (network namespaces) is a kind of ``root``: it stays as the finer name."""

FAST_TIER = os.environ.get("EDGEHEAL_TEST_TIER", "") == "fast"

FAST_REFUSED: dict[str, str] = {
    # program (basename) a fast-tier test may not start -> the marker a test that does lacks
    "mosquitto": "daemon", "dbus-daemon": "daemon", "dbus-run-session": "daemon",
    "wireguard-go": "daemon", "prometheus": "daemon", "ModemManager": "daemon",
    "qemu-system-x86_64": "vm", "systemd-nspawn": "vm", "debootstrap": "vm",
    "nsenter": "root", "unshare": "root", "mount": "root", "umount": "root", "nft": "root",
}
IP_WRITES = {"add", "del", "delete", "set", "exec", "attach", "change", "replace", "flush"}


def pytest_configure(config: pytest.Config) -> None:
    skipguard.install(config, CI_ALLOWED_SKIPS)
    if qemu_user.active():  # scripts/test --arm64-unit: what qemu-user cannot run, deselected
        config.pluginmanager.register(qemu_user.QemuUserTier(), "edgeheal-qemu-user")
    if FAST_TIER:
        if (not hasattr(config, "workerinput")
                and not config.pluginmanager.has_plugin("edgeheal-skip-guard")):
            # the fast tier skips nothing: what it cannot run, -m has already deselected
            config.pluginmanager.register(skipguard.SkipGuard(CI_ALLOWED_SKIPS),
                                          "edgeheal-skip-guard")
        _refuse_tier_programs()
    elif not hasattr(config, "workerinput") and os.geteuid() == 0 and shutil.which("ip"):
        netns.sweep()  # namespaces (and what runs in them) of runs killed before cleanup


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        wanted: set[str] = set()
        for name in getattr(item, "fixturenames", ()):
            wanted.update(FIXTURE_MARKS.get(name, ()))
        for mark in list(item.iter_markers()):
            wanted.update(MARK_IMPLIES.get(mark.name, ()))
        for name in sorted(wanted - {m.name for m in item.iter_markers()}):
            item.add_marker(name)


class TierViolation(PermissionError):
    """A fast-tier test started a program its tier leaves out (a PermissionError, as it
    would be without root, but recorded: catching it does not hide it)."""


_violations: list[str] = []


def _refused(argv: Sequence[Any]) -> str | None:
    """The marker a test running ``argv`` needs, if the fast tier refuses it."""
    words = [os.fsdecode(a) for a in argv]
    if not words:
        return None
    program = Path(words[0]).name
    if program.startswith("qemu-system-"):
        return "vm"
    if program == "ip":  # reading (ip netns list, ip link show) is fine; changing is root
        return "root" if IP_WRITES & set(words[1:]) else None
    return FAST_REFUSED.get(program)


def _refuse_tier_programs() -> None:
    """Patch the one place every subprocess goes through (subprocess.run, Popen and asyncio's
    create_subprocess_exec all end in ``Popen._execute_child``)."""
    original = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> Any:
        argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
        marker = _refused(argv)
        if marker is not None:
            what = f"`{' '.join(os.fsdecode(a) for a in argv)}`"
            _violations.append(f"it ran {what}: mark it `{marker}`")
            raise TierViolation(f"the fast tier does not run {what} (a `{marker}` test)")
        return original(self, args, *rest, **kw)

    subprocess.Popen._execute_child = guarded  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def tier_is_honest() -> Iterator[None]:
    """In the fast tier, fail a test that started what its markers say it does not need."""
    del _violations[:]
    yield
    if _violations:
        found = sorted(set(_violations))
        del _violations[:]
        pytest.fail("the fast tier runs no root, daemon or VM test, but this one needs one: "
                    + "; ".join(found), pytrace=False)


def _own_namespaces() -> set[str]:
    if shutil.which("ip") is None:
        return set()
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         check=False).stdout
    mine = netns.prefix_of(os.getpid())
    return {line.split()[0] for line in out.splitlines() if line.startswith(mine)}


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    """Namespaces, processes and files a test makes; removed even when the test fails."""
    box = Sandbox()
    try:
        yield box
    finally:
        box.close()


@pytest.fixture(autouse=True)
def root_logging_restored() -> Iterator[None]:
    """A test that runs the CLI in this process installs the agent's stderr handler on the
    stream pytest captured for that test; later tests would log to a closed file ("---
    Logging error ---"). Put the root logger's handlers and level back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def no_leaked_namespaces() -> object:
    before = _own_namespaces()
    yield
    leaked = _own_namespaces() - before
    for name in leaked:  # clean up so one leak does not cascade, then fail the test
        subprocess.run(["ip", "netns", "del", name], check=False)
    assert not leaked, f"test leaked network namespaces: {sorted(leaked)}"


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """kopf's lesson: a test that leaves asyncio tasks running has a shutdown bug."""
    yield
    current = asyncio.current_task()
    leftover = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in leftover:
        task.cancel()
    assert not leftover, f"test leaked asyncio tasks: {[t.get_name() for t in leftover]}"
