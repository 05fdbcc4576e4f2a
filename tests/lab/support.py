"""Run `edgeheal lab` as an operator would, and check it leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgeheal.lab.netns import prefix_of

WG_DIR = Path("/var/run/wireguard")


def leftovers(pid: int) -> list[str]:
    """Namespaces, wireguard-go sockets and processes of the lab run ``pid``."""
    prefix = prefix_of(pid)
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         check=False).stdout
    found = [f"netns {line.split()[0]}" for line in out.splitlines()
             if line.startswith(prefix)]
    if WG_DIR.exists():
        found += [f"socket {p.name}" for p in WG_DIR.iterdir() if p.name.startswith(prefix)]
    procs = subprocess.run(["pgrep", "-a", "-f", prefix], capture_output=True, text=True,
                           check=False).stdout
    found += [f"process {line}" for line in procs.splitlines() if "pgrep" not in line]
    return found


def run_lab(scenario: str, tmp_path: Path, *extra: str, timeout: float = 900,
            ) -> tuple[int, dict[str, Any], str, int]:
    report = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeheal", "lab", "--scenario", scenario, "--quick",
         "--report", str(report), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    doc = json.loads(report.read_text()) if report.exists() else {}
    return proc.returncode, doc, output, proc.pid


def interrupt_after(marker: str, tmp_path: Path, scenario: str = "stuck-flannel",
                    deadline: float = 120) -> tuple[int, str, int]:
    """Start a lab run, SIGINT it once ``marker`` appears in its output.

    A thread reads the output with blocking reads and the marker is searched for in all of it
    so far, so a line the pipe delivers in pieces cannot hide it (a non-blocking readline
    returns such a piece as if it were a line). Bounded: if the marker has not appeared within
    ``deadline`` seconds the run is interrupted all the same and the call fails, naming it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeheal", "lab", "--scenario", scenario],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    stdout = proc.stdout
    output = bytearray()
    wanted = marker.encode()
    seen = threading.Event()

    def read() -> None:
        # os.read returns what the pipe holds (at most 64 KiB), b"" at the end of the output;
        # the marker is searched for in everything read so far, so a split cannot hide it
        while chunk := os.read(stdout.fileno(), 65536):
            output.extend(chunk)
            if wanted in output:
                seen.set()
        seen.set()  # the output ended: stop waiting (``found`` below tells which)

    reader = threading.Thread(target=read, name="lab-output", daemon=True)
    reader.start()
    try:
        seen.wait(deadline)
        found = wanted in output
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        stdout.close()
    text = bytes(output).decode(errors="replace")
    assert found, f"{marker!r} not in the lab's output within {deadline:g}s:\n{text[-3000:]}"
    return proc.returncode, text, proc.pid


def scenario_test(scenario: str, *extra: str) -> Callable[[Path], None]:
    """The end-to-end test of one scenario. Each scenario has a module of its own only so
    that pytest-xdist (``--dist loadfile``) runs them concurrently: they mostly wait."""

    @pytest.mark.slow
    @pytest.mark.netns
    def test(tmp_path: Path) -> None:
        code, report, output, pid = run_lab(scenario, tmp_path, *extra)
        assert report, output[-3000:]
        failed = [e for e in report["expectations"] if not e["held"]]
        assert report["passed"], f"{report.get('error')} {failed}\n{output[-3000:]}"
        assert code == 0
        assert report["field"] is ("--field" in extra)
        assert (tmp_path / "report.svg").exists()
        assert leftovers(pid) == []

    flags = " ".join(("--quick", *extra))
    test.__doc__ = f"`edgeheal lab --scenario {scenario} {flags}` passes, leaving nothing."
    return test
