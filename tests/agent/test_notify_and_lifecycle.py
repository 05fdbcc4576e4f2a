"""systemd's notify protocol on a real datagram socket, and `edgeheal run` as a process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeheal.base import compat
from edgeheal.boundaries.sd_notify import Notifier
from edgeheal.config import CheckSettings
from tests.agent.fakes import ScriptedCheck, ok
from tests.agent.support import running_agent
from tests.support import until


class NotifyListener:
    """A NOTIFY_SOCKET as systemd would have it; records (arrival time, message)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except compat.TimeoutErrors:
                continue
            for line in data.decode().splitlines():
                self.messages.append((time.monotonic(), line))

    def seen(self, line: str) -> list[float]:
        return [t for t, m in self.messages if m == line]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[NotifyListener]:
    lst = NotifyListener(tmp_path / "notify.sock")
    yield lst
    lst.close()


async def test_ready_watchdog_and_stopping_reach_the_notify_socket(
        tmp_path: Path, listener: NotifyListener) -> None:
    notifier = Notifier(address=listener.path, watchdog_usec="400000")  # ping every 0.2 s
    check = ScriptedCheck("c", CheckSettings(interval=0.2), [ok()], delay=0.3)
    async with running_agent(tmp_path, [check], notifier=notifier):
        await until(lambda: bool(listener.seen("READY=1")))
        ready_at = listener.seen("READY=1")[0]
        assert check.runs >= 1  # READY only after the first full round
        await until(lambda: len(listener.seen("WATCHDOG=1")) >= 3)
        assert any(m.startswith("STATUS=ready") for _, m in listener.messages)

        # Wedge the event loop (a blocking call in the supervisor's loop): pings must stop.
        pings_before = len(listener.seen("WATCHDOG=1"))
        wedge_start = time.monotonic()
        time.sleep(2.0)  # noqa: ASYNC251 - deliberately wedges the loop the agent runs on
        wedge_end = time.monotonic()
        during = [t for t in listener.seen("WATCHDOG=1") if wedge_start + 0.1 < t < wedge_end]
        assert during == [], "the watchdog was pinged while the loop was wedged"
        assert len(listener.seen("WATCHDOG=1")) == pings_before
        await until(lambda: len(listener.seen("WATCHDOG=1")) > pings_before)
        assert ready_at < wedge_start
    await asyncio.sleep(0.2)
    assert listener.seen("STOPPING=1")


def test_the_watchdog_is_not_pinged_for_another_process() -> None:
    os.environ["WATCHDOG_PID"] = "1"
    try:
        assert Notifier(address="", watchdog_usec="1000000").watchdog_interval is None
    finally:
        del os.environ["WATCHDOG_PID"]
    assert Notifier(address="", watchdog_usec="1000000").watchdog_interval == 0.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_edgeheal_run_serves_and_exits_0_within_5s_of_sigterm(
        tmp_path: Path, listener: NotifyListener) -> None:
    port = _free_port()
    cfg = tmp_path / "edgeheal.toml"
    cfg.write_text(f'[agent]\nstate_dir = "{tmp_path}/state"\n[http]\n'
                   f'listen = ["127.0.0.1:{port}"]\n[wireguard]\nenabled = false\n')
    env = {**os.environ, "NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": "2000000"}
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen([sys.executable, "-m", "edgeheal", "run", "--config", str(cfg)],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        doc = None
        while time.monotonic() < deadline and doc is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=1) as r:
                    doc = json.load(r)
            except OSError:
                time.sleep(0.1)
        assert doc is not None, "the agent never served /status"
        assert doc["version"]
        while time.monotonic() < deadline and not listener.seen("READY=1"):
            time.sleep(0.05)
        assert listener.seen("READY=1")
        assert (tmp_path / "state" / "control.sock").exists()
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr = ""
        if proc.stderr:
            stderr = proc.stderr.read()
            proc.stderr.close()
    assert code == 0, stderr
    assert took < 5.0, f"shutdown took {took:.1f}s"
    assert listener.seen("STOPPING=1")
    assert not (tmp_path / "state" / "control.sock").exists()
    assert "level=info logger=edgeheal.agent msg=stopped" in stderr
