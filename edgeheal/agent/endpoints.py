"""Probe, status and metrics endpoints, answered from the agent's snapshot only.

No handler ever awaits a check or touches the network: each one renders the current
immutable :class:`~edgeheal.model.Snapshot`, so a kubelet's probe is answered in
microseconds even while a check waits out its timeout, at any size of node. The server is
read-only; operator commands go through the root-only control socket.

- ``/livez``: 200 while the supervisor ticks. Never depends on the network: a liveness
  probe that does would restart healthy pods during every outage.
- ``/readyz``: 200 when every ``required`` check has completed a run and is ok/degraded.
- ``/probe/{check}``: 200 for ok/degraded, 503 for failed/unknown (or no run yet).
- ``/status``: the whole snapshot as JSON. ``/metrics``: Prometheus text.

``/status`` and ``/metrics`` grow with the checks' detail (5,000 WireGuard peers: 1.7 MB,
3.4 MB taking a second to render), so they are rendered on one thread off the loop
(:mod:`edgeheal.base.render`): ``/metrics`` once for every scraper within ``SCRAPE_TTL``
(:mod:`edgeheal.boundaries.prometheus`), the checks of ``/status`` once per snapshot; at
most :data:`MAX_HEAVY` are served at once (until sent, :data:`WRITE_TIMEOUT` at most; a
slot is awaited :data:`HEAVY_WAIT`, then 503): a scrape flood costs the probes nothing.

The JSON shapes are in ``schemas/`` (JSON Schema) and the tests validate real responses.

The server sits below the supervisor: it reads the agent through :class:`Source`, the few
things it renders, and never imports :mod:`edgeheal.agent.supervisor`.

Any local user can open connections to the port, so the server bounds what they cost:

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
import json
import logging
import resource
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST

from edgeheal import __version__
from edgeheal.base import compat
from edgeheal.base.render import Renderer
from edgeheal.boundaries.aiohttp_light import HttpProcessingError, Site, web
from edgeheal.boundaries.aiohttp_light import bind as bind  # noqa: PLC0414 - re-exported
from edgeheal.boundaries.prometheus import Scrape
from edgeheal.model import CheckStatus, Snapshot

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("edgeheal.http")  # the name operators grep for

REQUEST_TIMEOUT = 5.0
"""Seconds a new connection has to send its first complete request."""
IDLE_TIMEOUT = 10.0
"""Seconds a kept-alive connection may sit idle between requests."""
MAX_CONNECTIONS = 256
"""Open connections at most (kubelets, Prometheus and operators need a handful)."""
RESERVED_FDS = 256
"""File descriptors never given to HTTP connections: the checks, the outbox, netlink."""
MAX_HEAVY = 4
"""``/metrics`` and ``/status`` requests served at once (rendering or sending)."""
HEAVY_WAIT = 5.0
"""Seconds a ``/metrics`` or ``/status`` request waits for a slot before a 503."""
WRITE_TIMEOUT = 10.0
"""Seconds a ``/metrics`` or ``/status`` body may take to send (then the connection is
closed: a client that does not read must not hold a slot)."""


class Source(Protocol):
    """What the endpoints read (the agent is one): the snapshot, liveness, the metrics."""

    @property
    def snapshot(self) -> Snapshot: ...

    def views(self) -> Mapping[str, Any]:
        """The actors' own views for ``/status`` (remediation, alerts), asked per request."""

    @property
    def live(self) -> bool:
        """True while the supervisor ticks (``/livez``)."""

    @property
    def last_tick(self) -> float:
        """Monotonic time of the supervisor's last tick."""

    @property
    def clock(self) -> Callable[[], float]:
        """The monotonic clock the snapshot's times are on."""

    @property
    def registry(self) -> CollectorRegistry: ...


AGENT: web.AppKey[Source] = web.AppKey("agent")
RENDER: web.AppKey[Renderer] = web.AppKey("render")
SCRAPE: web.AppKey[Scrape] = web.AppKey("scrape")
SLOTS: web.AppKey[asyncio.Semaphore] = web.AppKey("slots")


def status_document(agent: Source, snap: Snapshot | None = None) -> dict[str, Any]:
    snap = agent.snapshot if snap is None else snap
    extras = {**snap.extras, **agent.views()}
    remediation = dict(extras.pop("remediation", {}) or {})
    actions = remediation.pop("actions", [])
    doc: dict[str, Any] = {
        "node": snap.node,
        "version": __version__,
        "uptime_seconds": round(agent.clock() - snap.started_mono, 3),
        "ready": snap.ready,
        "checks": {name: s.to_json() for name, s in snap.checks.items()},
        "actions": actions,
    }
    if remediation:
        doc["remediation"] = remediation
    doc.update(extras)
    return doc


def _entry(status: CheckStatus) -> dict[str, Any]:
    return {"check": status.name, "state": status.state.value if status.completed
            else "unknown", "reason": status.reason, "message": status.message}


async def livez(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    live = agent.live
    return web.json_response(
        {"live": live, "tick_age_seconds": round(agent.clock() - agent.last_tick, 3)},
        status=200 if live else 503)


async def readyz(request: web.Request) -> web.Response:
    snap = request.app[AGENT].snapshot
    failing = [_entry(s) for s in snap.failing_required]
    ready = snap.ready
    return web.json_response({"ready": ready, "failing": failing}, status=200 if ready else 503)


async def probe(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    name = request.match_info["check"]
    status = agent.snapshot.checks.get(name)
    if status is None:
        known = sorted(agent.snapshot.checks)
        return web.json_response(
            {"error": f"no check named {name!r}", "known_checks": known}, status=404)
    ok = status.completed and status.state.serving
    return web.json_response(status.to_json(), status=200 if ok else 503)


async def _status_body(request: web.Request) -> web.Response:
    """``json.dumps(status_document(agent))``: the checks encoded on the render thread once
    per snapshot (immutable), the rest (the actors' views, asked now) on the loop."""
    agent = request.app[AGENT]
    snap = agent.snapshot
    checks = await request.app[RENDER].render(("status", snap.version), lambda: json.dumps(
        {name: s.to_json() for name, s in snap.checks.items()}))
    doc = status_document(agent, snap)
    text = ", ".join(f"{json.dumps(k)}: {checks if k == 'checks' else json.dumps(v)}"
                     for k, v in doc.items())
    return web.Response(text="{" + text + "}", content_type="application/json")


async def _metrics_body(request: web.Request) -> web.Response:
    body = await request.app[SCRAPE].body()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _heavy(request: web.Request,
                 make: Callable[[web.Request], Awaitable[web.Response]]) -> web.Response:
    """Serve a render-sized response in one of :data:`MAX_HEAVY` slots, sent before the
    slot is given back."""
    slots = request.app[SLOTS]
    try:
        async with compat.timeout(HEAVY_WAIT):  # wait_for before 3.12: a cancel can keep a slot
            await slots.acquire()
    except compat.TimeoutErrors:
        return web.json_response({"error": "busy: too many /metrics and /status requests"},
                                 status=503, headers={"Retry-After": "1"})
    try:
        response = await make(request)
        try:
            async with compat.timeout(WRITE_TIMEOUT):
                await response.prepare(request)
                await response.write_eof()
        except compat.TimeoutErrors:  # aiohttp takes the closed connection for the client leaving
            if request.transport is not None:
                request.transport.abort()
        except ConnectionError:
            pass  # the client left first (its timeout on a busy box): routine, not an error
        return response
    finally:
        slots.release()


async def status(request: web.Request) -> web.Response:
    return await _heavy(request, _status_body)


async def metrics(request: web.Request) -> web.Response:
    return await _heavy(request, _metrics_body)


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


def make_app(agent: Source) -> web.Application:
    app = web.Application(middlewares=[_mark_served], client_max_size=4096)
    app[AGENT] = agent
    app[RENDER] = renderer = Renderer()
    app[SCRAPE] = scrape = Scrape(agent.registry, renderer)
    app[SLOTS] = asyncio.Semaphore(MAX_HEAVY)

    async def stop_rendering(_app: web.Application) -> None:
        scrape.close()
        renderer.close()

    app.on_cleanup.append(stop_rendering)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/probe/{check}", probe)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    return app


async def start(agent: Source, listen: Iterable[str | socket.socket]) -> web.AppRunner:
    """Serve on every ``[http] listen`` address, or on sockets from :func:`bind`; raise
    OSError naming an address that cannot be bound."""
    stats = _Stats(agent)
    guard = _Guard(stats, connection_cap())
    stats.cap.set(guard.cap)
    app = make_app(agent)
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
