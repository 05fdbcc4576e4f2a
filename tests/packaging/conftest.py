"""The Debian packages, built once per run by ``packaging/build`` from this checkout.

Two builds for this machine's architecture (a previous one, ``0.2.0~test1``, and this
release, so an upgrade is a real upgrade between two builds) and one for arm64, whose
contents are checked (it cannot run here). The dependency wheels are cached under
``$EDGEHEAL_TEST_CACHE`` (``deb-wheels-<arch>``): only the first run downloads them; a build
is then about 45 s. The packages are removed after the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeheal.lab import nspawn
from tests.systemd.conftest import debian_rootfs

__all__ = ["debian_rootfs"]  # the booted-container tests' cached Debian 12 tree

CHECKOUT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("EDGEHEAL_TEST_CACHE", str(nspawn.DEFAULT_CACHE)))
PREVIOUS = "0.2.0~test1"
"""The previous build's version: sorts before the release's."""
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "")


def build(arch: str, out: Path, version: str | None = None) -> Path:
    argv = [str(CHECKOUT / "packaging" / "build"), "--arch", arch, "--out", str(out),
            "--wheels", str(CACHE / f"deb-wheels-{arch}")]
    if version is not None:
        argv += ["--version", version]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, f"packaging/build {arch} failed:\n{proc.stderr[-3000:]}"
    print(proc.stderr.strip().splitlines()[-1])  # its size and build time
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def debs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """{"previous", "release", "other"}: the .deb files (other: the other architecture,
    arm64 on amd64)."""
    if not HOST_ARCH:
        pytest.fail(f"no package for {os.uname().machine}")
    out = tmp_path_factory.mktemp("debs")
    try:
        yield {"previous": build(HOST_ARCH, out, PREVIOUS), "release": build(HOST_ARCH, out),
               "other": build("arm64" if HOST_ARCH == "amd64" else "amd64", out)}
    finally:
        shutil.rmtree(out, ignore_errors=True)
