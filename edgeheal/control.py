"""The local control channel: operator commands to the running agent.

The HTTP port is for kubelets and Prometheus and stays read-only. Commands that change
something (``alert test``, ``remediation pause``...) go over a unix stream socket,
``<state_dir>/control.sock``, mode 0600, whose server also checks the caller's
credentials (``SO_PEERCRED``): only root or the agent's own user may talk to it.

Protocol: one JSON request line ``{"command": NAME, "args": {...}}``, one JSON reply line
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``. Subsystems register
handlers through :class:`ControlServer.register` (exposed to checks as ``ctx.control``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SOCKET_NAME = "control.sock"
MAX_REQUEST = 64 * 1024

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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            uid = _peer_uid(sock) if sock is not None else -1
            if uid not in (0, os.geteuid()):
                await _reply(writer, {"ok": False, "error": "permission denied: root only"})
                log.warning("control: refused a caller with uid %d", uid)
                return
            try:
                line = await asyncio.wait_for(reader.readline(), 5.0)
                request = json.loads(line[:MAX_REQUEST] or b"null")
                name = request["command"]
                args = request.get("args") or {}
                if not isinstance(name, str) or not isinstance(args, dict):
                    raise TypeError("command must be a string and args an object")
            except (ValueError, KeyError, TypeError, TimeoutError) as err:
                await _reply(writer, {"ok": False, "error": f"bad request: {err}"})
                return
            handler = self._handlers.get(name)
            if handler is None:
                await _reply(writer, {"ok": False, "error": f"unknown command {name!r}; "
                                      f"known: {', '.join(self.commands)}"})
                return
            log.info("control: %s %s", name, json.dumps(args, sort_keys=True))
            try:
                result = await handler(args)
            except (ValueError, KeyError, TypeError) as err:
                await _reply(writer, {"ok": False, "error": str(err)})
                return
            await _reply(writer, {"ok": True, "result": result})
        except (ConnectionError, OSError) as err:
            log.debug("control: connection dropped: %s", err)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


async def _reply(writer: asyncio.StreamWriter, payload: Mapping[str, Any]) -> None:
    writer.write(json.dumps(payload).encode() + b"\n")
    await writer.drain()


def call(state_dir: str | os.PathLike[str], command: str,
         args: Mapping[str, Any] | None = None, *, timeout: float = 30.0) -> Any:
    """Send one command to the running agent; return its result or raise ControlError."""
    path = socket_path(state_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as err:
            raise ControlError(f"the agent is not running (no control socket at {path}): "
                               f"{err.strerror}", unreachable=True) from err
        except PermissionError as err:
            raise ControlError(f"permission denied on {path}: run as root",
                               unreachable=True) from err
        sock.sendall(json.dumps({"command": command, "args": dict(args or {})}).encode()
                     + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    try:
        reply = json.loads(data)
    except ValueError as err:
        raise ControlError("the agent sent no valid reply", unreachable=True) from err
    if not reply.get("ok"):
        raise ControlError(str(reply.get("error", "command failed")))
    return reply.get("result")
