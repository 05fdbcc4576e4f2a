from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edgeheal.config import MqttTarget
from edgeheal.lab.mosquitto import Mosquitto
from edgeheal.lab.netns import Sandbox

USER, PASSWORD = "edge", "pw-Zq81-never-logged"


@pytest.fixture
def broker(sandbox: Sandbox, tmp_path: Path) -> Mosquitto:
    b = Mosquitto(sandbox, tmp_path, users={USER: PASSWORD}, tls=True, extra_listener=True)
    b.start()
    return b


def target_for(broker: Mosquitto, **kw: object) -> MqttTarget:
    base = MqttTarget(name="broker", host=broker.host, port=broker.port, username=USER,
                      password_file=broker.password_file_for(USER), timeout=3.0)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


@dataclasses.dataclass
class FakePeer:
    port: int
    connections: int = 0


async def _serve(handler: object) -> AsyncIterator[tuple[asyncio.Server, FakePeer]]:
    peer = FakePeer(0)
    writers: list[asyncio.StreamWriter] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer.connections += 1
        writers.append(writer)
        await handler(reader, writer)  # type: ignore[operator]

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    peer.port = server.sockets[0].getsockname()[1]
    try:
        yield server, peer
    finally:
        for w in writers:
            w.close()
        server.close()
        await server.wait_closed()


@pytest.fixture
async def garbage_peer() -> AsyncIterator[FakePeer]:
    """Accepts, reads the CONNECT, answers with an HTTP error page."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async for _server, peer in _serve(handler):
        yield peer


@pytest.fixture
async def silent_peer() -> AsyncIterator[FakePeer]:
    """Accepts and never answers (until the test ends)."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)

    async for _server, peer in _serve(handler):
        yield peer
