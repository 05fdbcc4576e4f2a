"""The arm64 chroot of ``scripts/test --arm64-unit`` works, and leaves the host as it was
(tests/qemu/arm64_chroot.py): a few of the fast tier's tests run in it as aarch64 code, and
the host's binfmt_misc and mount table are the same after it. The whole tier under
qemu-user is the documented option's (docs/testbed.md), not every run's."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from edgeheal.lab import nspawn
from tests.qemu import arm64_chroot

pytestmark = [pytest.mark.root, pytest.mark.vm]

HOST_BINFMT = Path("/proc/sys/fs/binfmt_misc")


def _host_state(cache: Path) -> tuple[list[str], list[str]]:
    """The host's binfmt_misc entries and its mounts that a run could leave: binfmt_misc,
    the ones named ``edgeheal`` (the run's binfmt_misc and overlay), any under the cache."""
    entries = sorted(p.name for p in HOST_BINFMT.iterdir()) if HOST_BINFMT.is_dir() else []
    ours = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        point, (fstype, source, *_) = fields.split()[4], fs.split()
        if fstype == "binfmt_misc" or source == "edgeheal" or point.startswith(str(cache)):
            ours.append(line)
    return entries, sorted(ours)


def _runs(cache: Path) -> set[str]:
    return {d.name for d in cache.iterdir() if d.name.startswith(arm64_chroot.WORK)}


def test_the_fast_tier_runs_as_arm64_code_and_the_host_is_unchanged() -> None:
    if os.geteuid() != 0:
        pytest.skip("the chroot's namespaces need root")
    cache = Path(os.environ.get("EDGEHEAL_TEST_CACHE", str(nspawn.DEFAULT_CACHE)))
    arm64_chroot.tree(cache)
    arm64_chroot.site(cache)  # built before the host's state is read
    before, runs = _host_state(cache), _runs(cache)
    done = arm64_chroot.run_tests(cache, ["tests/test_qemu_user.py"],
                                  markers="not root and not daemon and not vm and not slow",
                                  workers=1, timeout=900, capture=True)
    assert _host_state(cache) == before
    assert "edgeheal-aarch64" not in before[0]
    out = done.stdout
    assert done.returncode == 0, out[-4000:]
    assert re.search(r"ran as aarch64 in 1 session\(s\); \d+ compiled extension modules "
                     r"loaded, \d+ of them aarch64, [1-9]\d* of the dependencies'", out), \
        out[-4000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed, out[-4000:]
    assert int(passed.group(1)) >= 10
    assert "failed" not in out.rsplit("qemu-user (aarch64)", 1)[-1]
    assert _runs(cache) <= runs  # its overlay removed (another run's may be there)
