"""`edgeheal diagnose` as an operator runs it: exit codes for what is missing or wrong."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DIAGNOSE = [sys.executable, "-m", "edgeheal", "diagnose"]


def config(tmp_path: Path) -> Path:
    path = tmp_path / "edgeheal.toml"
    path.write_text('[wireguard]\ninterfaces = ["ehnowg0"]\n[offload]\ninterfaces = ["lo"]\n')
    return path


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_without_cap_net_raw_it_exits_3_and_says_so(tmp_path: Path) -> None:
    proc = run(["setpriv", "--bounding-set=-net_raw", "--inh-caps=-net_raw", "--",
                *DIAGNOSE, "--config", str(config(tmp_path)), "--interface", "lo"])
    assert proc.returncode == 3, proc.stderr
    assert "needs CAP_NET_RAW" in proc.stderr
    assert proc.stdout == ""


def test_without_scapy_it_exits_3_and_says_so(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['scapy'] = None; from edgeheal.cli import main; "
            "sys.exit(main())")
    proc = run([sys.executable, "-c", code, "diagnose", "--config", str(config(tmp_path))])
    assert proc.returncode == 3, proc.stderr
    assert "scapy is not installed" in proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--seconds", "0"], "--seconds"),
    (["--seconds", "soon"], "--seconds"),
    # the interface is looked up after the CAP_NET_RAW check, so this one needs root
    pytest.param(["--interface", "ehnosuchif0"], "--interface ehnosuchif0: no such interface",
                 marks=pytest.mark.root),
])
def test_bad_arguments_exit_2_with_the_reason(tmp_path: Path, args: list[str],
                                             message: str) -> None:
    proc = run([*DIAGNOSE, "--config", str(config(tmp_path)), *args])
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


def test_a_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[wireguard]\ninterfaces = 3\n")
    proc = run([*DIAGNOSE, "--config", str(path)])
    assert proc.returncode == 2
    assert "wireguard.interfaces" in proc.stderr


@pytest.mark.root  # gets past the CAP_NET_RAW check first
def test_no_tunnel_device_is_a_problem_found_exit_1(tmp_path: Path) -> None:
    proc = run([*DIAGNOSE, "--config", str(config(tmp_path)), "--json"])
    assert proc.returncode == 1, proc.stderr
    assert '"code": "no_tunnel"' in proc.stdout


def test_the_agent_and_the_cli_parser_never_import_scapy() -> None:
    code = ("import sys; from edgeheal.cli import build_parser; build_parser(); "
            "import edgeheal.tools.diagnose, edgeheal.checks; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scapy'))")
    proc = run([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
