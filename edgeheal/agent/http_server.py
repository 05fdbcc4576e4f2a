"""The HTTP server the endpoints are served on, and what a connection may cost.

Why apart from the endpoints (:mod:`edgeheal.agent.endpoints`): they render the snapshot,
this module keeps the sockets. Any local user can open connections to the port, so the
server bounds what they cost:

- a connection must send a complete request within :data:`REQUEST_TIMEOUT` of connecting
  (checked every second), and may stay idle between requests for :data:`IDLE_TIMEOUT`;
  then it is closed;
- at most :func:`connection_cap` connections are open at once (:data:`MAX_CONNECTIONS`,
  less on a low ``RLIMIT_NOFILE``, so descriptors stay free for the checks); a new
  connection beyond that closes the oldest one, so a kubelet's fresh probe is answered
  even while idle connections pile up;
- header lines and fields are bounded, a body over 4 KB is refused;
- a malformed request gets a 400 and one ``info`` line without traceback, and is counted
  (``edgeheal_http_bad_requests_total``), never an ``error`` line per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from edgeheal.agent.endpoints import Source, make_app
from edgeheal.boundaries.aiohttp_light import HttpProcessingError, Site, web
from edgeheal.boundaries.aiohttp_light import bind as bind  # noqa: PLC0414 - re-exported

log = logging.getLogger("edgeheal.http")  # the name operators grep for

REQUEST_TIMEOUT = 5.0
"""Seconds a new connection has to send its first complete request."""
IDLE_TIMEOUT = 10.0
"""Seconds a kept-alive connection may sit idle between requests."""
MAX_CONNECTIONS = 256
"""Open connections at most (kubelets, Prometheus and operators need a handful)."""
RESERVED_FDS = 256
"""File descriptors never given to HTTP connections: the checks, the outbox, netlink."""


def connection_cap(soft_limit: int | None = None) -> int:
    """How many connections may be open at once under the ``RLIMIT_NOFILE`` soft limit.

    Half of what :data:`RESERVED_FDS` leaves, because a burst of connects can be accepted
    (one listen backlog per socket and round) before the oldest ones are closed."""
    if soft_limit is None:
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_limit == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(8, min(MAX_CONNECTIONS, (soft_limit - RESERVED_FDS) // 2))


class _Stats:
    """The server's own metrics, and ``edgeheal_ready``, on the agent's registry."""

    def __init__(self, agent: Source) -> None:
        from prometheus_client import Counter, Gauge

        registry = agent.registry
        self.ready = Gauge(
            "edgeheal_ready", "1 while /readyz answers 200 (every required check has "
            "completed a run and is ok or degraded), else 0; read from the same snapshot.",
            registry=registry)
        self.ready.set_function(lambda: 1.0 if agent.snapshot.ready else 0.0)
        self.bad_requests = Counter(
            "edgeheal_http_bad_requests",
            "Malformed HTTP requests answered with 400 (bad request line, header, method).",
            registry=registry)
        self.closed = Counter(
            "edgeheal_http_connections_closed",
            "Connections the server closed itself, by reason: no_request (no complete "
            "request within the request timeout), over_limit (the oldest, to admit a new "
            "one over the connection cap).", ["reason"], registry=registry)
        for reason in ("no_request", "over_limit"):
            self.closed.labels(reason=reason)
        self.open = Gauge("edgeheal_http_connections", "Open HTTP connections.",
                          registry=registry)
        self.cap = Gauge("edgeheal_http_connections_max",
                         "Open HTTP connections allowed (from RLIMIT_NOFILE).",
                         registry=registry)


class _ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger: a malformed request is one info line, counted; anything
    else (a bug in a handler) keeps its error and traceback."""

    def __init__(self, stats: _Stats) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.stats = stats

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        info = kwargs.get("exc_info")
        err = info if isinstance(info, BaseException) else None
        if isinstance(err, HttpProcessingError):
            self.stats.bad_requests.inc()
            peer = args[0] if args else "?"
            log.info("bad HTTP request from %s: %d %s", peer, err.code,
                     type(err).__name__)
            return
        super().log(level, msg, *args, **kwargs)


class _Guard:
    """The connection cap and the request timeout, shared by every listening socket.

    RequestHandler objects cannot be weakly referenced, so nothing here holds one for
    longer than a sweep: once a second the live connections are listed, the ones that have
    sent no complete request for :data:`REQUEST_TIMEOUT` are closed, and what is kept about
    the rest is rebuilt from that list (bounded by the cap)."""

    def __init__(self, stats: _Stats, cap: int) -> None:
        self.stats, self.cap = stats, cap
        self.server: web.Server | None = None
        self.first_seen: dict[Any, float] = {}
        """Live connection -> when a sweep first saw it; ``inf`` once it sent a request."""

    def admit(self) -> asyncio.BaseProtocol:
        """The protocol factory: make room under the cap (closing the oldest), then hand
        the new connection to aiohttp."""
        server = self.server
        if server is None:  # the runner was cleaned up while a connect was in flight
            raise ConnectionAbortedError("the HTTP server is stopping")
        open_ = [c for c in server.connections if c.transport is not None]
        if len(open_) >= self.cap:
            open_[0].force_close()  # the oldest: a fresh probe must get through
            self.stats.closed.labels(reason="over_limit").inc()
        return server()

    def served(self, handler: Any) -> None:
        self.first_seen[handler] = float("inf")

    def sweep(self, now: float) -> None:
        live = self.server.connections if self.server is not None else []
        seen = {h: self.first_seen.get(h, now) for h in live}
        for handler, since in seen.items():
            if now - since >= REQUEST_TIMEOUT and handler.transport is not None:
                handler.force_close()
                self.stats.closed.labels(reason="no_request").inc()
        self.first_seen = seen

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            self.sweep(loop.time())


@web.middleware
async def _mark_served(request: web.Request,
                       handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                       ) -> web.StreamResponse:
    guard = request.app.get(GUARD)
    if guard is not None:
        guard.served(request.protocol)
    return await handler(request)


GUARD: web.AppKey[_Guard] = web.AppKey("guard")


async def start(agent: Source, listen: Iterable[str | socket.socket]) -> web.AppRunner:
    """Serve on every ``[http] listen`` address, or on sockets from :func:`bind`; raise
    OSError naming an address that cannot be bound."""
    stats = _Stats(agent)
    guard = _Guard(stats, connection_cap())
    stats.cap.set(guard.cap)
    app = make_app(agent, middlewares=[_mark_served])
    app[GUARD] = guard
    tasks: list[asyncio.Task[None]] = []

    async def stop_sweeper(_app: web.Application) -> None:
        guard.server = None
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.on_cleanup.append(stop_sweeper)
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=0.5,
        keepalive_timeout=IDLE_TIMEOUT, logger=_ServerLog(stats),
        max_line_size=8190, max_field_size=8190, lingering_time=1.0)
    await runner.setup()
    guard.server = server = runner.server
    stats.open.set_function(lambda: len(server.connections) if server is not None else 0)
    tasks.append(asyncio.create_task(guard.run(), name="edgeheal.http.sweep"))
    items = list(listen)
    try:
        sockets = bind([a for a in items if isinstance(a, str)])
        sockets += [a for a in items if isinstance(a, socket.socket)]
        for sock in sockets:
            await Site(runner, sock, guard.admit).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def bound_ports(runner: web.AppRunner) -> list[int]:
    """The ports actually bound (``:0`` in tests picks a free one)."""
    return [site.sock.getsockname()[1] for site in runner.sites if isinstance(site, Site)]


async def stop(runner: web.AppRunner) -> None:
    await runner.cleanup()
