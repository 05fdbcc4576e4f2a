"""The kubelet's local health endpoint (``http://127.0.0.1:10248/healthz``).

Why: it is free evidence — loopback, plain HTTP, no credentials — that the kubelet inside
the K3s agent is alive (kubelet's ``healthzBindAddress`` 127.0.0.1 and ``healthzPort``
10248 by default, ``pkg/kubelet/apis/config/v1beta1/defaults.go``; K3s does not change
them). It answers ``ok`` while its sync loop runs (``pkg/kubelet/server/server.go``,
``InstallDefaultHandlers``: ``healthz.PingHealthz``, ``syncLoop`` health), whatever the
server says: a kubelet that answers here and whose lease is not renewed has lost its way
to the server, not its life. One GET with ``Connection: close``; the answer is read up to
:data:`ANSWER_MAX` bytes.
"""

from __future__ import annotations

import asyncio
import errno

from edgeheal.base import compat

ANSWER_MAX = 4096


async def healthz(host: str, port: int, path: str, timeout: float) -> str:
    """``ok`` for a 200 answer, else what went wrong (``refused``, ``timeout``,
    ``http 500``, the errno's name)."""
    try:
        async with compat.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                             "User-Agent: edgeheal\r\nConnection: close\r\n\r\n".encode())
                await writer.drain()
                head = await reader.read(ANSWER_MAX)
            finally:
                writer.close()
    except compat.TimeoutErrors:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as err:
        return errno.errorcode.get(err.errno or 0, type(err).__name__)
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or not status[0].startswith(b"HTTP/"):
        return "not http"
    return "ok" if status[1] == b"200" else f"http {status[1].decode(errors='replace')}"
