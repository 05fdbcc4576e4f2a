"""Probe, status and metrics endpoints, answered from the agent's snapshot only.

No handler ever awaits a check or touches the network: each one renders the current
immutable :class:`~edgeheal.model.Snapshot`, so a kubelet's probe is answered in
microseconds even while a check waits out its timeout. The server is read-only; operator
commands go through the root-only control socket (:mod:`edgeheal.control`).

- ``/livez``: 200 while the supervisor ticks. Never depends on the network: a liveness
  probe that does would restart healthy pods during every outage.
- ``/readyz``: 200 when every ``required`` check has completed a run and is ok/degraded.
- ``/probe/{check}``: 200 for ok/degraded, 503 for failed/unknown (or no run yet).
- ``/status``: the whole snapshot as JSON. ``/metrics``: Prometheus text.

The JSON shapes are in ``schemas/`` (JSON Schema) and the tests validate real responses.

The server sits below the supervisor: it reads the agent through :class:`Source`, the few
things it renders, and never imports :mod:`edgeheal.agent`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from edgeheal import __version__
from edgeheal.config import split_hostport
from edgeheal.model import CheckStatus, Snapshot

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


class Source(Protocol):
    """What the endpoints read (the agent is one): the snapshot, liveness, the metrics."""

    @property
    def snapshot(self) -> Snapshot: ...

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


def status_document(agent: Source) -> dict[str, Any]:
    snap = agent.snapshot
    extras = dict(snap.extras)
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


async def status(request: web.Request) -> web.Response:
    return web.json_response(status_document(request.app[AGENT]))


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[AGENT].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(agent: Source) -> web.Application:
    app = web.Application(handler_args={"max_field_size": 8190, "max_line_size": 8190},
                          client_max_size=4096)
    app[AGENT] = agent
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/probe/{check}", probe)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    return app


async def start(agent: Source, listen: Iterable[str]) -> web.AppRunner:
    """Bind every ``listen`` address (``[http] listen``); raise OSError naming the one that
    failed."""
    runner = web.AppRunner(make_app(agent), access_log=None, handle_signals=False,
                           shutdown_timeout=0.5)
    await runner.setup()
    try:
        for addr in listen:
            host, port = split_hostport(addr)
            site = web.TCPSite(runner, host, port, reuse_address=True)
            try:
                await site.start()
            except OSError as err:
                raise OSError(err.errno, f"cannot listen on {addr}: {err.strerror}") from err
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def bound_ports(runner: web.AppRunner) -> list[int]:
    """The ports actually bound (``:0`` in tests picks a free one)."""
    ports = []
    for site in runner.sites:
        server = getattr(site, "_server", None)
        for sock in getattr(server, "sockets", None) or []:
            ports.append(sock.getsockname()[1])
    return ports


async def stop(runner: web.AppRunner) -> None:
    await runner.cleanup()
