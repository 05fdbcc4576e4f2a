"""Issue 17, finding 3: ``edgeheal remediation pause --for 1000000000d`` was applied and
persisted although the command reported a failure; the status view then raised
``OverflowError`` on every read and every later start.

Now a pause lasts 1 s to 30 days (without ``--for``: until resumed). The CLI refuses anything
else with exit 2 before it talks to the agent; the control handler refuses it before the
history is touched; a persisted pause beyond the bound is dropped at start with a warning.
Tested through the real CLI (a subprocess) against a real control socket served by a real
remediator, through the socket's raw protocol, and through a history file left behind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from edgeheal.agent.remediation import Remediator
from edgeheal.agent.remediation.history import HISTORY_FILE, Timeline, save
from edgeheal.agent.remediation.operator import PAUSE_MAX
from edgeheal.boundaries import control_socket as control
from edgeheal.core.flannel_ladder import History
from tests.remediation.support import Clock, ScriptedRemedy, World, make_config

BOOT_OFFSET = 4000.0
"""The tests' boottime runs this far ahead of the fake monotonic clock."""

ABSURD_FOR = ["1000000000d", "31d", "2592001", "0s", "500ms", "nan", "inf", "-1s", "1e9",
              "soon", "", "9" * 400 + "d", "1" * 40]
ABSURD_ARGS: list[Any] = [
    "1000000000d", "31d", 2592001, 1e308, 10 ** 400, float("nan"), float("inf"), -5, 0,
    0.5, "soon", True, [1], {"d": 1}, "9" * 400 + "d"]
"""(``""`` and a missing ``for`` mean "until resumed": the protocol's indefinite pause.)"""


def remediator(world: World) -> Remediator:
    return Remediator(world.ctx, remedy_factory={"pod": ScriptedRemedy("pod")}.get,
                      boot_clock=lambda: world.clock.now + BOOT_OFFSET, boot="boot-a",
                      tick=0.001)


class Served:
    """A remediator whose commands are served on a real control socket in state_dir."""

    def __init__(self, tmp_path: Path) -> None:
        self.config = make_config(tmp_path, 'mode = "pod"')
        self.world = World(self.config, Clock(step=0.01))
        self.rem = remediator(self.world)
        self.server = control.ControlServer(self.config.agent.state_dir)
        for name, handler in self.world.handlers.items():
            self.server.register(name, handler)
        self.config_file = tmp_path / "edge.toml"
        self.config_file.write_text(
            f'[agent]\nnode_name = "edge-1"\nstate_dir = "{self.config.agent.state_dir}"\n',
            encoding="utf-8")

    @property
    def history_file(self) -> Path:
        return Path(self.config.agent.state_dir) / HISTORY_FILE

    async def cli(self, *args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "edgeheal", "remediation", "pause", *args,
            "--config", str(self.config_file), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, (out + err).decode()


async def test_the_cli_refuses_an_absurd_pause_with_exit_2_and_applies_nothing(
        tmp_path: Path) -> None:
    served = Served(tmp_path)
    await served.server.start()
    try:
        limit = asyncio.Semaphore(3)

        async def one(value: str) -> tuple[str, int, str]:
            async with limit:
                code, text = await served.cli(f"--for={value}")  # "-1s" is no option
            return value, code, text

        results = await asyncio.gather(*(one(v) for v in ABSURD_FOR))
        assert served.rem.history.paused_until is None
        assert not served.history_file.exists(), "a refused pause was persisted"
        # the socket works: a pause within the bound is applied and persisted
        code, text = await served.cli("--for", "30d")
    finally:
        await served.server.close()
    for value, code_, out in results:
        assert code_ == 2, (value, out)
        assert "edgeheal: --for: " in out, (value, out)
        assert "Traceback" not in out
        assert len(out) < 400, out
    assert "a pause lasts 1s to 30d, got 1000000000d" in dict(
        (v, o) for v, _, o in results)["1000000000d"]
    assert code == 0, text
    assert "remediation paused until 20" in text
    assert served.rem.history.paused_until is not None
    assert json.loads(served.history_file.read_text())["paused_until_boottime"] is not None


@pytest.mark.parametrize("value", ABSURD_ARGS, ids=lambda v: repr(v)[:20])
async def test_the_control_socket_refuses_an_absurd_pause(tmp_path: Path, value: Any) -> None:
    served = Served(tmp_path)
    await served.server.start()
    try:
        with pytest.raises(control.ControlError) as refused:
            await asyncio.to_thread(control.call, served.config.agent.state_dir,
                                    "remediation.pause", {"for": value}, timeout=10)
        view = await asyncio.to_thread(control.call, served.config.agent.state_dir,
                                       "remediation.resume", {}, timeout=10)
    finally:
        await served.server.close()
    assert not refused.value.unreachable
    assert "internal error" not in str(refused.value)
    assert served.rem.history.paused_until is None
    assert view["paused_until"] is None
    history = json.loads(served.history_file.read_text())  # written by the resume only
    assert history["paused_until_boottime"] is None


async def test_a_persisted_pause_beyond_the_bound_is_dropped_at_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The history the finding left behind (a pause 10^9 days long) no longer breaks the
    start: the pause is dropped with a warning and the view renders."""
    config = make_config(tmp_path, 'mode = "pod"')
    clock = Clock(step=0.01)
    path = Path(config.agent.state_dir) / HISTORY_FILE
    save(path, History(paused_until=clock.now + 1e9 * 86400),
         Timeline(boot_id="boot-a", offset=BOOT_OFFSET))
    caplog.set_level(logging.WARNING)
    rem = remediator(World(config, clock))
    view = rem.view()
    assert view["paused_until"] is None
    assert rem.history.paused_until is None
    await rem._store.written()  # the drop is written off the event loop
    assert json.loads(path.read_text())["paused_until_boottime"] is None
    assert "outside the 30-day limit; dropped" in caplog.text


async def test_a_persisted_pause_within_the_bound_survives_the_start(tmp_path: Path) -> None:
    config = make_config(tmp_path, 'mode = "pod"')
    clock = Clock(step=0.01)
    path = Path(config.agent.state_dir) / HISTORY_FILE
    save(path, History(paused_until=clock.now + PAUSE_MAX - 60),
         Timeline(boot_id="boot-a", offset=BOOT_OFFSET))
    rem = remediator(World(config, clock))
    assert rem.view()["paused_until"] is not None
    assert rem.history.paused_until is not None
    assert math.isfinite(rem.history.paused_until)
