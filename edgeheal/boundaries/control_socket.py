"""The local control channel: operator commands to the running agent.

The HTTP port is for kubelets and Prometheus and stays read-only. Commands that change
something (``alert test``, ``remediation pause``...) go over a unix stream socket,
``<state_dir>/control.sock``, mode 0600, whose server also checks the caller's
credentials (``SO_PEERCRED``): only root or the agent's own user may talk to it.

Protocol: one JSON request line ``{"command": NAME, "args": {...}}``, one JSON reply line
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``. Subsystems register
handlers through :class:`ControlServer.register` (exposed to checks as ``ctx.control``).
Whatever bytes arrive, the caller gets one reply line: a request that is not one JSON
object with a string ``command`` gets ``bad request: ...``, a handler that fails in an
unexpected way gets ``internal error``; the server goes on serving either way.

The socket is bound under a umask of 0177 (so it is 0600 from its first instant; it is
never chmodded by path, which a swapped name would redirect). A state directory the socket
cannot be made in (read-only, full) leaves the agent running without it
(:attr:`ControlServer.unavailable`). :func:`call` trusts an answer only from a socket owned
by root, the caller or the state directory's owner, whose peer (``SO_PEERCRED``) is that
same user. The state directory itself (its lock, its ownership rules) is
:mod:`edgeheal.boundaries.state_dir`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from edgeheal.boundaries.state_dir import (  # re-exported: where callers found them before
    LOCK_NAME,
    StateDirBusy,
    StateLock,
    lock_state_dir,
)

__all__ = ["LOCK_NAME", "SOCKET_NAME", "ControlError", "ControlServer", "StateDirBusy",
           "StateLock", "call", "lock_state_dir", "parse_request", "socket_path"]
from edgeheal.base import compat

log = logging.getLogger("edgeheal.control")  # the name operators grep for

SOCKET_NAME = "control.sock"
MAX_REQUEST = 64 * 1024
"""Bytes of one request line; a longer line is a bad request."""
READ_TIMEOUT = 5.0
"""Seconds a caller may take to send its request line."""

Handler = Callable[[Mapping[str, Any]], Awaitable[Any]]


class ControlError(Exception):
    """The agent could not be reached, or refused or failed the command."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def socket_path(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / SOCKET_NAME


class ControlServer:
    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = socket_path(state_dir)
        self._handlers: dict[str, Handler] = {}
        self._server: asyncio.AbstractServer | None = None
        self.bad_requests = 0
        """Requests refused as malformed or unknown (since start)."""
        self.unavailable = ""
        """Why the socket could not be made ("" while it serves): operator commands wait."""
        self.register("ping", self._ping)

    def register(self, name: str, handler: Handler) -> None:
        if name in self._handlers:
            raise ValueError(f"control command {name!r} registered twice")
        self._handlers[name] = handler

    @property
    def commands(self) -> list[str]:
        return sorted(self._handlers)

    async def _ping(self, args: Mapping[str, Any]) -> Any:
        return {"pong": True, "commands": self.commands}

    async def start(self) -> None:
        """Bind the socket, 0600 from the start (a umask, never a chmod by path); on a state
        directory that cannot be written, log it and run without (:attr:`unavailable`)."""
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            old = os.umask(0o177)
            try:
                self._server = await asyncio.start_unix_server(self._serve,
                                                               path=str(self.path))
            finally:
                os.umask(old)
        except OSError as err:
            self.unavailable = f"cannot make {self.path}: {err.strerror or err}"
            log.error("control socket: %s; operator commands (edgeheal alert test, "
                      "remediation pause...) are unavailable until a restart",
                      self.unavailable)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
            with contextlib.suppress(OSError):  # ours to remove; a read-only dir keeps it
                self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            uid = _peer_uid(sock) if sock is not None else -1
            if uid not in (0, os.geteuid()):
                await _reply(writer, {"ok": False, "error": "permission denied: root only"})
                log.warning("control: refused a caller with uid %d", uid)
                return
            await _reply(writer, await self.answer(reader))
        except (ConnectionError, OSError) as err:
            log.debug("control: connection dropped: %s", err)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def answer(self, reader: asyncio.StreamReader) -> dict[str, Any]:
        """Read one request line and return the reply to it; never raises on bad input."""
        try:
            async with compat.timeout(READ_TIMEOUT):
                line = await reader.readline()
            name, args = parse_request(line)
        except compat.TimeoutErrors:
            self.bad_requests += 1
            return {"ok": False, "error": f"bad request: no request line within "
                    f"{READ_TIMEOUT:g}s"}
        except ValueError as err:  # also a line over the reader's limit (MAX_REQUEST)
            self.bad_requests += 1
            log.info("control: bad request: %s", err)
            return {"ok": False, "error": f"bad request: {err}"}
        handler = self._handlers.get(name)
        if handler is None:
            self.bad_requests += 1
            return {"ok": False, "error": f"unknown command {_clip(name)!r}; "
                    f"known: {', '.join(self.commands)}"}
        log.info("control: %s %s", name, _clip(json.dumps(args, sort_keys=True), 200))
        try:
            result = await handler(args)
            json.dumps(result, default=str)  # a reply the caller can read
        except (ValueError, KeyError, TypeError) as err:
            return {"ok": False, "error": str(err)}
        except Exception as err:
            log.exception("control: command %s failed", name)
            return {"ok": False, "error": f"internal error in {name}: "
                    f"{type(err).__name__} (see the agent's log)"}
        return {"ok": True, "result": result}


def parse_request(line: bytes) -> tuple[str, dict[str, Any]]:
    """``{"command": NAME, "args": {...}}`` -> (NAME, args); ValueError saying what is wrong
    with anything else."""
    if len(line) > MAX_REQUEST:
        raise ValueError(f"request over {MAX_REQUEST} bytes")
    if not line.strip():
        raise ValueError("empty request: expected one JSON object on one line")
    try:
        request = json.loads(line)
    except RecursionError:
        raise ValueError("request nested too deeply") from None
    except ValueError as err:  # also not UTF-8, or an integer too long to convert
        raise ValueError(f"not JSON: {_clip(str(err), 120)}") from None
    if not isinstance(request, dict):
        raise ValueError(f"expected a JSON object, got {type(request).__name__}")
    name = request.get("command")
    args = request.get("args")
    if not isinstance(name, str) or not name:
        raise ValueError('"command" must be a non-empty string')
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError(f'"args" must be an object, got {type(args).__name__}')
    unknown = sorted(set(request) - {"command", "args"})
    if unknown:
        raise ValueError(f"unknown field(s) {_clip(', '.join(map(str, unknown)))}")
    return name, args


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


MAX_REPLY = 4 * 1024 * 1024
"""The largest reply the command line reads (``/status``-sized answers are far smaller)."""


def _trusted_uids(path: Path) -> set[int]:
    """Who may answer on ``path``: root, the caller, the state directory's owner (the
    agent's user). The socket itself must be a socket one of them owns, not a symlink."""
    trusted = {0, os.geteuid(), path.parent.stat().st_uid}
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid not in trusted:
        raise ControlError(f"refusing {path}: not a socket owned by root or the agent's user "
                           f"(uid {st.st_uid}); another user may have planted it",
                           unreachable=True)
    return trusted


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


async def _reply(writer: asyncio.StreamWriter, payload: Mapping[str, Any]) -> None:
    writer.write(json.dumps(payload, default=str).encode() + b"\n")
    await writer.drain()


def call(state_dir: str | os.PathLike[str], command: str,
         args: Mapping[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
    """Send one command to the running agent; return its result or raise ControlError."""
    path = socket_path(state_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            trusted = _trusted_uids(path)
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as err:
            raise ControlError(f"the agent is not running (no control socket at {path}): "
                               f"{err.strerror}", unreachable=True) from err
        except PermissionError as err:
            raise ControlError(f"permission denied on {path}: run as root",
                               unreachable=True) from err
        peer = _peer_uid(sock)
        if peer not in trusted:
            raise ControlError(f"refusing the answer on {path}: it comes from uid {peer}, "
                               "neither root, you, nor the state directory's owner (a socket "
                               "planted by another user?)", unreachable=True)
        sock.sendall(json.dumps({"command": command, "args": dict(args or {})}).encode()
                     + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_REPLY:
                raise ControlError(f"the agent's reply is over {MAX_REPLY} bytes; refused",
                                   unreachable=True)
    try:
        reply = json.loads(data)
    except ValueError as err:
        raise ControlError("the agent sent no valid reply", unreachable=True) from err
    if not reply.get("ok"):
        raise ControlError(str(reply.get("error", "command failed")))
    return reply.get("result")
