"""Issue 27, finding 7: the root command line trusts no answer from a socket another user
planted in the state directory.

A real unprivileged process (uid ``nobody``, through ``setpriv``, with Debian's own
``python3``) binds ``control.sock`` in a state directory it can write and answers every
command with a forged reply; the CLI's client must refuse it, whether it checks the file's
owner or the peer's credentials."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeheal.boundaries import control_socket as control

pytestmark = pytest.mark.root

NOBODY = 65534
FORGER = r"""
import os, socket, sys
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
os.chmod(path, 0o777)
srv.listen(4)
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    conn.recv(65536)
    conn.sendall(b'{"ok": true, "result": {"forged": true}}\n')
    conn.close()
"""


def _forger(state: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         "/usr/bin/python3", "-c", FORGER, str(state / "control.sock")],
        stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


@pytest.fixture
def open_state() -> Iterator[Path]:
    """A state directory any user can write (what the agent itself now refuses to use), in
    a place ``nobody`` can reach (pytest's own temporary directories are root's only)."""
    base = Path(tempfile.mkdtemp(prefix="edgeheal-trust-"))
    try:
        state = base / "state"
        state.mkdir()
        base.chmod(0o755)  # nobody must reach it
        state.chmod(0o1777)  # the point: another user writes here
        yield state
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_socket_planted_by_another_user_is_refused(open_state: Path) -> None:
    proc = _forger(open_state)
    try:
        with pytest.raises(control.ControlError, match="planted"):
            control.call(open_state, "remediation.status", timeout=5.0)
    finally:
        _stop(proc)


def test_a_root_owned_path_with_a_foreign_peer_is_refused(open_state: Path) -> None:
    """The file is made root's after bind (as a swap would leave it): the peer's own
    credentials still give the forger away."""
    proc = _forger(open_state)
    try:
        os.chown(open_state / "control.sock", 0, 0)
        began = time.monotonic()
        with pytest.raises(control.ControlError, match="uid 65534"):
            control.call(open_state, "remediation.status", timeout=5.0)
        assert time.monotonic() - began < 5.0
    finally:
        _stop(proc)
