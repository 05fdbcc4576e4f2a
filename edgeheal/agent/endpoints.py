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

The endpoints sit below the supervisor: they read the agent through :class:`Source`, the
few things they render, and never import :mod:`edgeheal.agent.supervisor`. The server
they are served on, and what a connection may cost, is :mod:`edgeheal.agent.http_server`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST

from edgeheal import __version__
from edgeheal.base import compat
from edgeheal.base.render import Renderer
from edgeheal.boundaries.aiohttp_light import web
from edgeheal.boundaries.prometheus import Scrape
from edgeheal.model import CheckStatus, Snapshot

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

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


def make_app(agent: Source, *, middlewares: Iterable[Any] = ()) -> web.Application:
    """The routes, each answered from ``agent``; ``middlewares`` run around every handler
    (the server's: :func:`edgeheal.agent.http_server.start`)."""
    app = web.Application(middlewares=list(middlewares), client_max_size=4096)
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
