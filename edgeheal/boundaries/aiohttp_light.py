"""aiohttp's server half, without the package ``__init__`` (which loads the client too).

The agent only serves HTTP (:mod:`edgeheal.agent.endpoints`). ``import aiohttp`` also imports the
client: requests and responses, websockets, the cookie jar (and pickle), happy eyeballs,
and the connector, which builds two TLS contexts at import, one loading the system's CA
certificates. Measured in the lab edge's agent with every feature on, skipping it saves
2.9 MB of RSS (docs/footprint.md), against a 60 MB budget.
:func:`edgeheal.base.bare_import.skip_init` explains the mechanism; any later use of a
package-level name (``aiohttp.ClientSession`` in a test or the lab) still works.

Also the server's sockets: :func:`bind` (every listen address, bound early) and
:class:`Site` (one bound socket, its connections made by the caller's protocol factory:
the endpoints' connection guard).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterable

from edgeheal.base.bare_import import skip_init
from edgeheal.config import split_hostport

skip_init("aiohttp", literals=("__version__",))  # aiohttp.http reads it from the package

from aiohttp import web  # noqa: E402 - after skip_init, on purpose
from aiohttp.http_exceptions import HttpProcessingError  # noqa: E402

__all__ = ["BACKLOG", "HttpProcessingError", "Site", "bind", "web"]

BACKLOG = 64
"""The listen queue of each socket (also how many connections one accept round takes)."""


def bind(listen: Iterable[str]) -> list[socket.socket]:
    """Listening sockets for every ``[http] listen`` address, bound now (before the agent
    touches its state, so a port in use fails the start early); OSError names the address.
    IPv6 sockets are v6-only, as asyncio makes them."""
    sockets: list[socket.socket] = []
    try:
        for addr in listen:
            host, port = split_hostport(addr)
            try:
                infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                           flags=socket.AI_PASSIVE)
                for family, kind, proto, _, sockaddr in dict.fromkeys(infos):
                    sock = socket.socket(family, kind, proto)
                    sockets.append(sock)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    if family == socket.AF_INET6:
                        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    sock.bind(sockaddr)
                    sock.listen(BACKLOG)
                    sock.setblocking(False)
            except OSError as err:
                raise OSError(err.errno, f"cannot listen on {addr}: "
                              f"{err.strerror or err}") from err
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Site(web.BaseSite):
    """One listening socket; ``admit`` makes each new connection's protocol."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket,
                 admit: Callable[[], asyncio.BaseProtocol]) -> None:
        super().__init__(runner, backlog=BACKLOG)
        self.sock, self.admit = sock, admit
        host, port = sock.getsockname()[:2]
        self._name = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.admit, sock=self.sock,
                                                backlog=self._backlog)
