"""The root-only control socket: registered commands, clear errors, unreachable agent."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from edgeheal import control
from edgeheal.control import ControlError, ControlServer


async def test_a_registered_command_is_called_with_its_args(tmp_path: Path) -> None:
    server = ControlServer(tmp_path)
    calls: list[Mapping[str, Any]] = []

    async def echo(args: Mapping[str, Any]) -> Any:
        calls.append(args)
        return {"echo": dict(args)}

    server.register("echo", echo)
    await server.start()
    try:
        mode = stat.S_IMODE(os.stat(control.socket_path(tmp_path)).st_mode)
        assert mode == 0o600
        result = await asyncio.to_thread(control.call, tmp_path, "echo", {"n": 3})
        assert result == {"echo": {"n": 3}}
        assert calls == [{"n": 3}]
        pong = await asyncio.to_thread(control.call, tmp_path, "ping")
        assert pong["commands"] == ["echo", "ping"]
        with pytest.raises(ControlError, match="unknown command 'nope'; known: echo, ping"):
            await asyncio.to_thread(control.call, tmp_path, "nope")
    finally:
        await server.close()
    assert not control.socket_path(tmp_path).exists()


async def test_a_handler_rejecting_bad_args_answers_with_the_error(tmp_path: Path) -> None:
    server = ControlServer(tmp_path)

    async def strict(args: Mapping[str, Any]) -> Any:
        raise ValueError(f"count must be a positive integer, got {args.get('count')!r}")

    server.register("strict", strict)
    await server.start()
    try:
        with pytest.raises(ControlError, match="count must be a positive integer, got -1"):
            await asyncio.to_thread(control.call, tmp_path, "strict", {"count": -1})
    finally:
        await server.close()


def test_calling_an_agent_that_is_not_running_is_an_environment_problem(
        tmp_path: Path) -> None:
    with pytest.raises(ControlError, match="the agent is not running") as caught:
        control.call(tmp_path, "ping")
    assert caught.value.unreachable


def test_a_command_cannot_be_registered_twice(tmp_path: Path) -> None:
    server = ControlServer(tmp_path)
    with pytest.raises(ValueError, match="registered twice"):
        server.register("ping", server._ping)
