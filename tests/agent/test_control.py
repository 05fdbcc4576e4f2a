"""The root-only control socket: registered commands, clear errors for any bytes (a table
and a Hypothesis fuzzer), unreachable agent, and the state directory's lock."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgeheal.boundaries import control_socket as control
from edgeheal.boundaries.control_socket import ControlError, ControlServer


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


# --- bad input (issue 17, finding 12) and the state directory's lock (finding 9) ---------

class ServerThread:
    """A ControlServer on its own event loop in a thread, so that synchronous tests (and
    Hypothesis) can talk to it over its real socket, example after example."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.server = ControlServer(state_dir)
        self.loop = asyncio.new_event_loop()
        self.server.register("echo", self._echo)
        self.server.register("boom", self._boom)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)

    @staticmethod
    async def _echo(args: Mapping[str, Any]) -> Any:
        return {"echo": dict(args)}

    @staticmethod
    async def _boom(args: Mapping[str, Any]) -> Any:
        raise RuntimeError("a bug in a handler")

    def send(self, payload: bytes, timeout: float = 10.0) -> bytes:
        """Send raw bytes (then end our side) and read the whole reply."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(control.socket_path(self.state_dir)))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)
            data = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    data += chunk
        return data

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServerThread]:
    thread = ServerThread(tmp_path)
    try:
        yield thread
    finally:
        thread.close()


def _reply(raw: bytes) -> dict[str, Any]:
    """The one reply line, checked for the protocol's shape."""
    assert raw.endswith(b"\n"), raw[:200]
    assert raw.count(b"\n") == 1, raw[:200]
    reply = json.loads(raw)
    assert isinstance(reply, dict)
    assert isinstance(reply.get("ok"), bool)
    if not reply["ok"]:
        assert isinstance(reply.get("error"), str)
        assert reply["error"]
        assert len(reply["error"]) < 1000  # never the whole request echoed back
    return reply


BAD_CONTROL_REQUESTS: list[tuple[bytes, str]] = [
    (b"", "empty request"),
    (b"\n", "empty request"),
    (b"   \t \n", "empty request"),
    (b"null\n", "expected a JSON object, got NoneType"),
    (b"[]\n", "expected a JSON object, got list"),
    (b"42\n", "expected a JSON object, got int"),
    (b'"ping"\n', "expected a JSON object, got str"),
    (b"{}\n", '"command" must be a non-empty string'),
    (b'{"command": 1}\n', '"command" must be a non-empty string'),
    (b'{"command": ""}\n', '"command" must be a non-empty string'),
    (b'{"command": null}\n', '"command" must be a non-empty string'),
    (b'{"command": "ping", "args": []}\n', '"args" must be an object, got list'),
    (b'{"command": "ping", "args": "x"}\n', '"args" must be an object, got str'),
    (b'{"command": "ping", "extra": 1}\n', "unknown field(s) extra"),
    (b'{"command": "nope"}\n', "unknown command 'nope'"),
    (b'{"command": "' + b"n" * 5000 + b'"}\n', "unknown command 'nnnn"),
    (b"\xff\xfe\xfd\n", "not JSON"),
    (b'{"command": "ping"', "not JSON"),
    (b"{'command': 'ping'}\n", "not JSON"),
    (b'{"command": "ping"}{"command": "ping"}\n', "not JSON"),
    (b"1" * 5000 + b"\n", "not JSON"),  # an integer too long to convert
    (b"[" * 50000 + b"\n", "nested too deeply"),
    (b'{"a":' * 12000 + b"\n", "nested too deeply"),
    (b'{"command": "' + b"a" * 70000 + b'"}\n', "bad request"),  # over MAX_REQUEST
    (b"x" * 200000, "bad request"),  # no line end at all, over the limit
    (b'{"command": "boom"}\n', "internal error in boom: RuntimeError"),
    (b"\x00" * 100 + b"\n", "not JSON"),
    (b'{"command": "ping"}\r\n\x00garbage after the line', ""),  # the line is what counts
]


def test_every_malformed_request_gets_one_clear_error_line(served: ServerThread) -> None:
    handled = 0
    for payload, expected in BAD_CONTROL_REQUESTS:
        reply = _reply(served.send(payload))
        if expected:
            assert reply["ok"] is False, payload[:80]
            assert expected in reply["error"], (payload[:80], reply)
        else:
            assert reply["ok"] is True, (payload[:80], reply)
        handled += 1
    assert handled == len(BAD_CONTROL_REQUESTS)
    assert served.server.bad_requests >= len(BAD_CONTROL_REQUESTS) - 2  # boom and the last
    assert control.call(served.state_dir, "ping", timeout=5)["pong"] is True


def test_a_caller_that_sends_nothing_gets_an_error_and_the_server_moves_on(
        served: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "READ_TIMEOUT", 0.3)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(control.socket_path(served.state_dir)))
        reply = _reply(sock.recv(4096))
    assert "no request line within 0.3s" in reply["error"]
    assert control.call(served.state_dir, "ping", timeout=5)["pong"] is True


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20)
_requests = st.one_of(
    st.binary(max_size=512),
    _json.map(lambda v: json.dumps(v).encode() + b"\n"),
    st.fixed_dictionaries({"command": st.sampled_from(["ping", "echo", "boom", "nope"])
                           | st.text(max_size=10) | _json},
                          optional={"args": _json, "x": _json})
    .map(lambda v: json.dumps(v).encode() + b"\n"),
    st.binary(max_size=64).map(lambda b: b'{"command": "echo", "args": ' + b + b"}\n"),
)


@given(payload=_requests)
def test_fuzz_any_bytes_get_one_reply_and_never_wedge_the_server(
        served_for_fuzz: ServerThread, payload: bytes) -> None:
    reply = _reply(served_for_fuzz.send(payload))
    if reply["ok"]:
        assert isinstance(reply.get("result"), dict)


@pytest.fixture(scope="module")
def served_for_fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    thread = ServerThread(tmp_path_factory.mktemp("control-fuzz"))
    try:
        yield thread
        # after every example: still serving
        assert control.call(thread.state_dir, "ping", timeout=5)["pong"] is True
    finally:
        thread.close()


def test_the_state_directory_is_held_by_one_process(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with control.lock_state_dir(state) as lock:
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert stat.S_IMODE(lock.path.stat().st_mode) == 0o600
        assert lock.path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(control.StateDirBusy, match=f"in use by PID {os.getpid()}") as busy:
            control.lock_state_dir(state)  # a second open file: flock says no
        assert busy.value.pid == os.getpid()
    with control.lock_state_dir(state):  # released: free again
        pass


def test_a_lock_holder_that_wrote_no_pid_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / control.LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # like `flock(1)`: a lock, no PID in the file
        with pytest.raises(control.StateDirBusy, match="in use by another process"):
            control.lock_state_dir(tmp_path)
    finally:
        os.close(fd)
