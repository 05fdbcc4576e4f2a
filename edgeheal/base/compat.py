"""What Python 3.10 lacks, in one place: edge fleets run 3.10 (Ubuntu 22.04, JetPack 6) to 3.13.

On 3.11 and later every name here *is* the standard library's own object (``UTC is
datetime.UTC``, ``timeout is asyncio.timeout``, ``tomllib`` the module, ``Self is
typing.Self``): no behaviour changes there. On 3.10:

- ``UTC``: ``datetime.timezone.utc`` (what ``datetime.UTC`` is an alias of).
- ``timeout``: the ``async-timeout`` package (a dependency there), not a copy of our own:
  aiohttp already imports it on 3.10 (``aiohttp.helpers``), so it costs the agent no memory.
  Its ``timeout(delay)`` raises ``asyncio.TimeoutError`` when it expires.
- ``TimeoutErrors``: before 3.11 ``asyncio.TimeoutError`` (raised by ``asyncio.wait_for``
  and ``timeout``) is not the builtin ``TimeoutError``: an ``except TimeoutError`` misses it.
  Catch ``except TimeoutErrors:``, ``except (*TimeoutErrors, OSError):``,
  ``contextlib.suppress(*TimeoutErrors)``. On 3.11+ it is ``(TimeoutError,)``.
- ``tomllib``: the ``tomli`` package (a dependency there), which it was made from.
- ``Self``: only for annotations, which every module using it postpones
  (``from __future__ import annotations``); mypy reads ``typing_extensions.Self``.
- ``sock_sendto``: ``loop.sock_sendto`` is 3.11+; on 3.10 a non-blocking ``sendto`` that
  waits for the socket to become writable.
- ``bus_auth_timeout``: dbus-fast's ``MessageBus(auth_timeout=)`` appeared in 5.2, which
  needs 3.11; on 3.10 (dbus-fast 5.0.x) it is left out, and every connect stays bounded by
  its caller's own ``wait_for``/``timeout``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio as _asyncio
    import socket as _socket

if sys.version_info >= (3, 11):
    from asyncio import timeout
    from datetime import UTC
    from typing import Self

    import tomllib

    TimeoutErrors = (TimeoutError,)
else:
    import asyncio
    from datetime import timezone

    import tomli as tomllib

    UTC = timezone.utc
    TimeoutErrors = (TimeoutError, asyncio.TimeoutError)
    if TYPE_CHECKING:
        from contextlib import AbstractAsyncContextManager

        from typing_extensions import Self

        def timeout(delay: float | None) -> AbstractAsyncContextManager[None]: ...
    else:
        from async_timeout import timeout

        Self = Any  # named only in postponed annotations

__all__ = ["UTC", "Self", "TimeoutErrors", "bus_auth_timeout", "sock_sendto", "timeout",
           "tomllib"]


if sys.version_info >= (3, 11):
    async def sock_sendto(loop: _asyncio.AbstractEventLoop, sock: _socket.socket, data: bytes,
                          address: Any) -> int:
        """``loop.sock_sendto(sock, data, address)`` (``sock`` non-blocking)."""
        return await loop.sock_sendto(sock, data, address)

    def bus_auth_timeout(seconds: float | None) -> dict[str, Any]:
        """The keyword arguments that bound dbus-fast's SASL handshake, where it has one:
        ``MessageBus(..., **bus_auth_timeout(5.0))``."""
        return {"auth_timeout": seconds}
else:
    async def sock_sendto(loop: _asyncio.AbstractEventLoop, sock: _socket.socket, data: bytes,
                          address: Any) -> int:
        """``loop.sock_sendto(sock, data, address)`` (``sock`` non-blocking)."""
        while True:
            try:
                return sock.sendto(data, address)
            except (BlockingIOError, InterruptedError):
                writable: _asyncio.Future[None] = loop.create_future()
                loop.add_writer(sock.fileno(), _ready, writable)
                try:
                    await writable
                finally:
                    loop.remove_writer(sock.fileno())

    def _ready(writable: _asyncio.Future[None]) -> None:
        if not writable.done():
            writable.set_result(None)

    def bus_auth_timeout(seconds: float | None) -> dict[str, Any]:
        """dbus-fast 5.0 (the last for 3.10) has no ``auth_timeout``: nothing to pass."""
        return {}
