"""The kubelet's /healthz boundary on loopback: each way it can fail has its own word."""

from __future__ import annotations

import asyncio
import socket

from edgeheal.boundaries.kube import kubelet


async def test_an_answer_a_refusal_a_silence_and_garbage() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        ok = request.startswith(b"GET /healthz HTTP/1.1\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nok" if ok else b"HTTP/1.1 404 No\r\n\r\n")
        await writer.drain()
        writer.close()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH\r\n")
        await writer.drain()
        writer.close()

    servers = [await asyncio.start_server(h, "127.0.0.1", 0) for h in (answer, silent,
                                                                          garbage)]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
    try:
        assert await kubelet.healthz("127.0.0.1", ports[0], "/healthz", 2.0) == "ok"
        assert await kubelet.healthz("127.0.0.1", ports[0], "/other", 2.0) == "http 404"
        assert await kubelet.healthz("127.0.0.1", ports[1], "/healthz", 0.3) == "timeout"
        assert await kubelet.healthz("127.0.0.1", ports[2], "/healthz", 2.0) == "not http"
        assert await kubelet.healthz("127.0.0.1", closed.getsockname()[1], "/healthz",
                                     2.0) == "refused"
    finally:
        closed.close()
        for server in servers:
            server.close()
            await server.wait_closed()
