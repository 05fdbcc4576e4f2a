"""`edgeheal offload apply|status` against a real kernel, inside a namespace made by the
test; the outcome is verified with the independent `ethtool -k` program."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgeheal.boundaries.kernel.ethtool import Ethtool
from edgeheal.checks.offload.feature_table import KERNEL_FEATURES
from tests.offload.conftest import Lab
from tests.offload.helpers import edgeheal, write_config

pytestmark = pytest.mark.netns

OFF_FIXED, OFF, ON = (False, True), (False, False), (True, False)


def test_apply_turns_tx_checksum_offload_off(lab: Lab, tmp_path: Path) -> None:
    lab.veth("wwan0", "peer0")
    config = write_config(tmp_path / "e.toml", ["wwan0"])
    proc = edgeheal(lab.ns, "offload", "apply", "--config", str(config))
    assert proc.returncode == 0, proc.stderr
    assert lab.checksums("wwan0") == {"tx-checksum-ipv4": OFF_FIXED,
                                      "tx-checksum-ip-generic": OFF,
                                      "tx-checksum-ipv6": OFF_FIXED}
    assert lab.checksums("peer0")["tx-checksum-ip-generic"] == ON  # not configured
    rows = {tuple(line.split()[:2]): line.split()[-1] for line in proc.stdout.splitlines()}
    assert rows[("wwan0", "tx-checksum-ip-generic")] == "changed"
    assert rows[("wwan0", "tx-checksum-ipv4")] == "fixed-off"
    again = edgeheal(lab.ns, "offload", "apply", "--config", str(config))
    assert again.returncode == 0
    assert "already-off" in again.stdout
    assert "changed" not in again.stdout


def test_dry_run_changes_nothing_and_says_what_it_would_do(lab: Lab, tmp_path: Path) -> None:
    lab.veth("wwan0", "peer0")
    config = write_config(tmp_path / "e.toml", ["wwan0"])
    proc = edgeheal(lab.ns, "offload", "apply", "--dry-run", "--config", str(config))
    assert proc.returncode == 1  # a feature would stay on
    assert "would turn off" in proc.stdout
    assert lab.checksums("wwan0")["tx-checksum-ip-generic"] == ON
    status = edgeheal(lab.ns, "offload", "status", "--config", str(config))
    assert status.returncode == 1, status.stdout
    assert lab.checksums("wwan0")["tx-checksum-ip-generic"] == ON


def test_a_glob_matches_several_interfaces(lab: Lab, tmp_path: Path) -> None:
    lab.veth("wwan0", "wwan1")
    lab.veth("wwan7", "eth5")
    config = write_config(tmp_path / "e.toml", ["wwan*"])
    proc = edgeheal(lab.ns, "offload", "apply", "--config", str(config))
    assert proc.returncode == 0, proc.stderr
    for name in ("wwan0", "wwan1", "wwan7"):
        assert lab.checksums(name)["tx-checksum-ip-generic"] == OFF, name
    assert lab.checksums("eth5")["tx-checksum-ip-generic"] == ON
    status = edgeheal(lab.ns, "offload", "status", "--config", str(config))
    assert status.returncode == 0, status.stdout


def test_a_missing_interface_does_not_fail_boot_unless_required(
        lab: Lab, tmp_path: Path) -> None:
    config = write_config(tmp_path / "e.toml", ["wwan0"])
    proc = edgeheal(lab.ns, "offload", "apply", "--config", str(config), timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert "no interface matches 'wwan0'" in proc.stderr
    required = write_config(tmp_path / "r.toml", ["wwan0"], extra="require_interface = true\n")
    proc = edgeheal(lab.ns, "offload", "apply", "--config", str(required), timeout=20)
    assert proc.returncode == 1


def test_an_unknown_feature_name_is_a_config_error_listing_valid_names(
        lab: Lab, tmp_path: Path) -> None:
    config = write_config(tmp_path / "e.toml", ["wwan0"], features=["tx-checksum-ip-genric"])
    proc = edgeheal(lab.ns, "offload", "apply", "--config", str(config))
    assert proc.returncode == 2
    assert "offload.features[0]" in proc.stderr
    assert "did you mean 'tx-checksum-ip-generic'" in proc.stderr
    assert "tx-udp_tnl-csum-segmentation" in proc.stderr  # the list of valid names


def test_a_fixed_on_feature_is_an_error_that_explains_why(lab: Lab, tmp_path: Path) -> None:
    # the loopback device reports tx-checksum-ip-generic "on [fixed]"
    config = write_config(tmp_path / "e.toml", ["lo"])
    proc = edgeheal(lab.ns, "offload", "apply", "--config", str(config))
    assert proc.returncode == 1
    assert "fixed-on" in proc.stdout
    assert "cannot be switched to software checksums" in proc.stderr


def test_the_feature_table_knows_every_name_this_kernel_reports() -> None:
    with Ethtool() as ethtool:
        names = set(ethtool.features("lo"))
    assert names, "the kernel reported no features"
    assert names <= set(KERNEL_FEATURES), names - set(KERNEL_FEATURES)


def test_without_cap_net_admin_apply_exits_3_and_changes_nothing(
        lab: Lab, tmp_path: Path) -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv (util-linux) to drop CAP_NET_ADMIN")
    lab.veth("wwan0", "peer0")
    config = write_config(tmp_path / "e.toml", ["wwan0"])
    proc = subprocess.run(
        ["ip", "netns", "exec", lab.ns, setpriv, "--bounding-set=-net_admin",
         "--inh-caps=-net_admin", sys.executable, "-m", "edgeheal", "offload", "apply",
         "--config", str(config)], capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "CAP_NET_ADMIN" in proc.stderr
    assert lab.checksums("wwan0")["tx-checksum-ip-generic"] == ON
