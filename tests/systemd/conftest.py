"""A booted Debian 12 container with a real systemd, edgeheal installed the operator's way.

The root file system is built once with debootstrap and cached under
``$EDGEHEAL_TEST_CACHE`` (default ``/var/cache/edgeheal-test``), keyed by its inputs; each
run boots it on a throw-away overlay inside a network namespace of its own, so everything
(overlay, container, veth, namespace) goes away afterwards, also when a test fails.

Skipped, with the reason, only where ``systemd-nspawn`` cannot boot a container at all.
A missing ``debootstrap``/``systemd-nspawn`` is a failure: CI installs them
(``install.sh --dev``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeheal.lab import nspawn
from edgeheal.lab.netns import Sandbox

CHECKOUT = Path(__file__).resolve().parents[2]
SRC = "/mnt/edgeheal"
"""Where the checkout is bind-mounted (read-only) inside the container."""
WHEELS = "/mnt/wheelhouse"

STAND_IN_K3S = """\
[Unit]
Description=Stand-in for K3s's agent (edgeheal test): logs the NIC's offload when it starts
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
KillMode=process
ExecStartPre=/bin/sh -c 'ethtool -k host0 | grep -E "^[[:space:]]*tx-checksum-ip-generic:" \
| sed "s/^[[:space:]]*/stand-in k3s-agent sees /"'
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
"""

AGENT_CONFIG = """\
# edgeheal test configuration: only the offload check, on the container's veth
[agent]
state_dir = "/var/lib/edgeheal"
check_interval = "2s"

[http]
listen = ["127.0.0.1:9917"]   # the container's own loopback (a private network namespace)

[offload]
interfaces = ["host0"]
interval = "5s"
required = true

[wireguard]
enabled = false

[remediation]
mode = "none"
"""


@pytest.fixture(scope="session")
def debian_rootfs() -> Path:
    if os.geteuid() != 0:
        pytest.skip("the systemd container tests need root (systemd-nspawn)")
    missing = [p for p in ("debootstrap", "systemd-nspawn", "nsenter") if not shutil.which(p)]
    if missing:
        pytest.fail(f"missing program(s) {', '.join(missing)}: apt-get install debootstrap "
                    "systemd-container (install.sh --dev does)")
    cache = Path(os.environ.get("EDGEHEAL_TEST_CACHE", str(nspawn.DEFAULT_CACHE)))
    return nspawn.debian_rootfs(cache)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Wheels of this checkout and its dependencies, as an operator prepares them elsewhere
    for an air-gapped node. Built from a copy, so the checkout gets no build/ directory."""
    base = tmp_path_factory.mktemp("wheelhouse")
    src = base / "src"
    shutil.copytree(CHECKOUT / "edgeheal", src / "edgeheal",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(CHECKOUT / name, src / name)
    out = base / "wheels"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--wheel-dir", str(out), f"{src}[kubernetes,dbus]", "setuptools", "wheel"],
        capture_output=True, text=True, timeout=300, check=False)
    try:
        assert proc.returncode == 0, f"pip wheel failed: {proc.stderr[-2000:]}"
        yield out
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def container(debian_rootfs: Path, wheelhouse: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[nspawn.Container]:
    """A booted container (checkout and wheelhouse mounted read-only), with the stand-in
    ``k3s-agent.service`` enabled and edgeheal's test configuration in place."""
    nspawn.sweep()  # containers of runs that were killed before they could clean up
    sandbox = Sandbox()
    box = nspawn.Container(
        lower=debian_rootfs, workdir=tmp_path_factory.mktemp("nspawn"),
        binds=(nspawn.Bind(CHECKOUT, SRC), nspawn.Bind(wheelhouse, WHEELS)))
    try:
        box.netns = sandbox.netns("s")
        try:
            box.boot(timeout=120.0)
        except nspawn.CannotBoot as err:
            pytest.skip(f"systemd-nspawn cannot boot a container here: {err}")
        box.write("/etc/systemd/system/k3s-agent.service", STAND_IN_K3S)
        box.systemctl("daemon-reload")
        box.systemctl("enable", "--now", "k3s-agent.service")
        box.write("/etc/edgeheal/edgeheal.toml", AGENT_CONFIG, mode=0o640)
        yield box
    finally:
        box.close()
        sandbox.close()

