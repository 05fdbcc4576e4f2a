"""The supervisor: runs the checks, keeps the one snapshot, and stops in order.

Every check runs as its own named task (``edgeheal.check.<name>``: its loop, on its
cadence and under its timeout, is :mod:`edgeheal.agent.check_loop`). Long-running parts (a
check's ``serve()``, the alert engine, the remediator, the HTTP server) run as named,
guarded tasks that are restarted with capped backoff if they crash.

The agent builds what several parts share, once, before the checks: the connection to
``[alerts] target`` (:func:`edgeheal.boundaries.mqtt.link.for_alerts`) goes to that target's check
through ``Context.alert_link`` and to the alert engine's constructor, which runs it.

After every run the raw result is debounced (:mod:`edgeheal.core.debounce`) and a new immutable
:class:`~edgeheal.model.Snapshot` replaces the old one; HTTP, metrics, alerts and the
remediator only ever read that snapshot, so a request never waits on a network check.

systemd: ``READY=1`` once every check has completed one run, ``WATCHDOG=1`` from the
supervisor tick only while every check loop is making progress, ``STATUS=`` on every change
of the one-line summary, ``STOPPING=1`` on SIGTERM/SIGINT. Shutdown is ordered and bounded
(:data:`STOP_BUDGET`): checks and actors are cancelled, the alert engine publishes
``offline`` and marks a clean exit, the HTTP server and the control socket close.
SIGHUP, SIGUSR1 and SIGUSR2 are logged and ignored (:data:`IGNORED_SIGNALS`).

One agent per state directory: :func:`run_forever` locks it
(:func:`edgeheal.boundaries.control_socket.lock_state_dir`) and binds the HTTP port before the
agent is built, because building it opens the outbox and writes the running marker there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from edgeheal import __version__
from edgeheal import checks as registry
from edgeheal.agent.check_loop import CheckLoops
from edgeheal.agent.tasks import (
    IGNORED_SIGNALS,
    allocations,
    ignore_signal,
    release_startup_memory,
    spawn,
)
from edgeheal.base import compat
from edgeheal.base.compat import UTC
from edgeheal.boundaries.control_socket import ControlServer, lock_state_dir
from edgeheal.boundaries.sd_notify import Notifier
from edgeheal.checks import Check, Serving
from edgeheal.config import Config
from edgeheal.core.path_verdict import path_verdict
from edgeheal.model import Context, Event, Snapshot

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

    from edgeheal.base.statefile import Newer

log = logging.getLogger("edgeheal.agent")  # the name operators grep for

TICK = 0.5
"""Supervisor tick, seconds: liveness, watchdog pings and the STATUS= line."""
STOP_BUDGET = 4.0
"""Seconds the whole shutdown may take (systemd and the spec allow 5)."""
HASTEN_SPACING = 2.0
"""Least seconds between the end of a check's run and a run asked for with ``hasten``: a
suspicion raised on every tick cannot become a probe storm."""


class Agent:
    def __init__(self, config: Config, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 notifier: Notifier | None = None,
                 checks: list[Check] | None = None,
                 hasten_spacing: float = HASTEN_SPACING) -> None:
        """``checks`` replaces the registry's checks (tests inject their own)."""
        from prometheus_client import CollectorRegistry

        from edgeheal.agent import remediation  # the actors load with an agent
        from edgeheal.agent.alerts.engine import AlertEngine
        from edgeheal.boundaries.mqtt.link import for_alerts
        from edgeheal.boundaries.prometheus import AgentMetrics

        self.config = config
        self.clock, self.wall = clock, wall
        self.notifier = notifier or Notifier()
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics = AgentMetrics(self.registry)
        self.control = ControlServer(config.agent.state_dir)
        self.control.register("debug.allocations", allocations())
        self.started_mono = clock()
        self.stop_event = asyncio.Event()
        self.last_tick = self.started_mono
        self._snapshot = Snapshot(node=config.node, checks={}, started_mono=self.started_mono,
                                  taken_mono=self.started_mono)
        self._published = asyncio.Event()
        """Set and replaced at every publication: what :meth:`changed` awaits."""
        self._ready_sent = False
        self._summary = ""
        self.loops = CheckLoops(config, self.metrics, clock=clock, wall=wall,
                                publish=self._publish, hasten_spacing=hasten_spacing)
        self.alert_link = for_alerts(config, clock=clock)
        """The one connection to ``[alerts] target``: the alert engine runs it, its check
        reads it (``Context.alert_link``)."""
        self.ctx = Context(config=config, registry=self.registry, clock=clock, wall=wall,
                           snapshot=lambda: self._snapshot, emit=self._emit,
                           control=self.control.register, alert_link=self.alert_link,
                           hasten=self.loops.hasten, changed=self.changed)
        self.checks: list[Check] = (
            list(checks) if checks is not None else registry.build(self.ctx))
        self.http_runner: Any = None
        names = [c.name for c in self.checks]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate check names: {names}")
        self.loops.add(self.checks, lambda name: registry.reasons(config, name))
        self.alerts = AlertEngine(self.ctx, link=self.alert_link)
        self.remediator = remediation.build(self.ctx)
        self.uplink_remediator = remediation.build_uplink(
            self.ctx, durable=lambda: self.alerts.outbox.fault is None)
        """The uplink ladder (``[remediation.uplink] enabled``); its reboot rung goes ahead
        only while the outbox writes alerts durably."""
        self.control_remediator = remediation.build_control(self.ctx, others=self.acting)
        """The control ladder (``[remediation.control] enabled``): restarts the K3s agent,
        never while another ladder acts (:meth:`acting`)."""
        if self.control_remediator is not None:
            control = self.control_remediator
            for actor in (self.remediator, self.uplink_remediator):
                if actor is not None:  # and they wait while it restarts the K3s agent
                    actor.yield_to = lambda: ("control",) if control.busy else ()
                    actor.restarts.labels(action="skip", result="other_ladder")
        self.registry.register(_NewerStateFiles(self))
        self._publish()

    def acting(self) -> tuple[str, ...]:
        """The Flannel and uplink ladders acting now (the control ladder waits for them)."""
        return tuple(name for name, actor in (("flannel", self.remediator),
                                              ("uplink", self.uplink_remediator))
                     if actor is not None and actor.busy is not None)

    # --- the snapshot ---------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def _publish(self) -> None:
        """Build the snapshot once from the checks' statuses and wake every follower."""
        statuses = self.loops.statuses
        round_complete = all(s.completed for s in statuses.values())
        self._snapshot = Snapshot(
            node=self.config.node, checks=statuses, started_mono=self.started_mono,
            taken_mono=self.clock(), round_complete=round_complete,
            extras={"path": path_verdict(statuses, self.config)},
            version=self._snapshot.version + 1)
        woken, self._published = self._published, asyncio.Event()
        woken.set()

    async def changed(self, version: int, at_most: float | None) -> None:
        """Return once a snapshot newer than ``version`` is out, or after ``at_most`` s."""
        if self._snapshot.version != version:
            return
        with contextlib.suppress(*compat.TimeoutErrors):
            async with compat.timeout(at_most):  # wait_for before 3.12 can swallow a cancel
                await self._published.wait()

    def views(self) -> dict[str, Any]:
        """What the actors show in ``/status``: asked at request time, never snapshotted."""
        out: dict[str, Any] = {}
        if self.remediator is not None:
            out["remediation"] = self.remediator.view()
        if self.uplink_remediator is not None:
            out["uplink_remediation"] = self.uplink_remediator.view()
        if self.control_remediator is not None:
            out["control_remediation"] = self.control_remediator.view()
        out["alerts"] = self.alerts.view()
        if newer := self.newer_state_files():
            out["state_files"] = {"newer": [n.detail() for n in newer]}
        return out

    def newer_state_files(self) -> list[Newer]:
        """The state files of a newer format than this build reads (a downgrade): each left
        untouched, its state kept in memory (:mod:`edgeheal.base.statefile`)."""
        found = [self.alerts.outbox.newer]
        found += [actor.state_newer for actor in (self.remediator, self.uplink_remediator,
                                                     self.control_remediator)
                  if actor is not None]
        return [n for n in found if n is not None]

    async def _follow_for_alerts(self) -> None:
        """Hand every new snapshot to the alert engine, the same way the ladders follow it."""
        seen = -1
        while True:
            snap = self._snapshot
            if snap.version != seen:
                seen = snap.version
                self.alerts.observe(snap)
            await self.changed(seen, None)

    def _emit(self, event: Event) -> None:
        log.info("event %s: %s", event.kind, event.message, extra={"kind": event.kind})
        self.alerts.event(event)

    # --- the tasks ------------------------------------------------------------------------

    async def _supervise(self) -> None:
        """The tick: liveness, watchdog (only while checks progress), STATUS= updates."""
        last_ping = -1e9
        while True:
            now = self.clock()
            self.last_tick = now
            stuck = self.loops.stuck(now, self.started_mono)
            snap = self._snapshot
            if snap.round_complete and not self._ready_sent:
                self._ready_sent = True
                self._summary = snap.summary()
                self.notifier.ready(self._summary)
                log.info("first round complete: %s", self._summary)
                release_startup_memory()
            elif self._ready_sent and snap.summary() != self._summary:
                self._summary = snap.summary()
                self.notifier.status(self._summary)
            wd = self.notifier.watchdog_interval
            if wd is not None and now - last_ping >= wd:
                if stuck:
                    log.error("not pinging the watchdog: checks %s are making no progress",
                              ", ".join(stuck))
                else:
                    self.notifier.watchdog()
                    last_ping = now
            await asyncio.sleep(TICK)

    @property
    def live(self) -> bool:
        return self.clock() - self.last_tick < 5 * TICK + 1.0

    async def run(self, *, listeners: list[socket.socket] | None = None) -> None:
        """Run until :attr:`stop_event` is set (SIGTERM/SIGINT set it). ``listeners``:
        sockets already bound to ``[http] listen`` (:func:`run_forever` binds them first).
        A start that fails (control socket, HTTP) goes through the same ordered stop, so
        it leaves no socket and no running marker behind."""
        from edgeheal.agent import http_server as http  # aiohttp only for `run`

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.stop_event.set)
        for sig in IGNORED_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, ignore_signal, sig)
        tasks: list[asyncio.Task[None]] = []
        web = None
        try:
            await self.control.start()
            web = self.http_runner = await http.start(
                self, listeners if listeners is not None else self.config.http.listen)
            log.info("edgeheal %s on %s: checks %s; http %s", __version__, self.config.node,
                     ", ".join(c.name for c in self.checks) or "none",
                     ", ".join(self.config.http.listen))
            tasks.append(spawn("edgeheal.supervisor", self._supervise))
            tasks.append(spawn("edgeheal.alerts.follow", self._follow_for_alerts))
            for check in self.checks:
                tasks.append(spawn(f"edgeheal.check.{check.name}",
                                    lambda c=check: self.loops.run(c)))  # type: ignore[misc]
                if isinstance(check, Serving):
                    tasks.append(spawn(f"edgeheal.serve.{check.name}", check.serve))
            for name, actor in (("edgeheal.alerts", self.alerts),
                                ("edgeheal.remediation", self.remediator),
                                ("edgeheal.remediation.uplink", self.uplink_remediator),
                                ("edgeheal.remediation.control", self.control_remediator)):
                if actor is not None:
                    tasks.append(spawn(name, actor.serve))
            await self.stop_event.wait()
        finally:
            await self._shutdown(tasks, web)

    async def _shutdown(self, tasks: list[asyncio.Task[None]], web: Any) -> None:
        from edgeheal.agent import http_server as http

        log.info("stopping")
        self.notifier.stopping()
        deadline = self.clock() + STOP_BUDGET
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=max(0.1, deadline - self.clock() - 2.5)) if tasks \
            else None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.alerts.close(), max(0.1, deadline - self.clock() - 1.0))
        if web is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(http.stop(web), max(0.1, deadline - self.clock() - 0.3))
        await self.control.close()
        for check in self.checks:
            close = getattr(check, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(close(), 0.2)
        self.notifier.close()
        log.info("stopped")


class _NewerStateFiles:
    """``edgeheal_state_file_newer{file}``: 1 for each state file of a newer format, read
    from the agent at scrape time (a file an operator moved aside drops out)."""

    NAME = "edgeheal_state_file_newer"
    HELP = ("1 for each state file of a newer format than this build reads (a downgrade): "
            "left untouched, its state kept in memory for this run.")

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def _family(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        return GaugeMetricFamily(self.NAME, self.HELP, labels=["file"])

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for newer in self.agent.newer_state_files():
            family.add_metric([newer.file], 1.0)
        yield family


def run_forever(config: Config) -> None:
    """The agent as ``edgeheal run`` starts it: lock the state directory (StateDirBusy,
    an OSError naming the PID that holds it), bind the HTTP port, and only then build the
    agent, which opens the outbox and the markers in that directory."""
    from edgeheal.agent import http_server as http

    async def main() -> None:
        with lock_state_dir(config.agent.state_dir):
            listeners = http.bind(config.http.listen)
            try:
                agent = Agent(config)
            except BaseException:
                for sock in listeners:
                    sock.close()
                raise
            await agent.run(listeners=listeners)

    asyncio.run(main())
