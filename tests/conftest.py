"""Suite-wide guards: every test leaves no namespace, process or task behind, and under
``CI=true`` no test skips unless it is allowed below, with its reason."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import settings

from edgeheal.lab import netns
from edgeheal.lab.netns import Sandbox
from tests import skipguard

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


def pytest_configure(config: pytest.Config) -> None:
    skipguard.install(config, CI_ALLOWED_SKIPS)


def _own_namespaces() -> set[str]:
    if shutil.which("ip") is None:
        return set()
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         check=False).stdout
    mine = f"{netns.PREFIX}{os.getpid() % 10000:04d}"
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
