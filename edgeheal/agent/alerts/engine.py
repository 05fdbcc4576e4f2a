"""The alert engine: snapshots and events in, durable alerts out, delivered in order.

The agent drives it through exactly this contract::

    engine = AlertEngine(ctx, link=link)   # the outbox, agent.started, alert.test
    engine.observe(snapshot)     # after every published snapshot (states already debounced)
    engine.event(ev)             # ctx.emit(...) lands here (offload.drift_corrected, ...)
    await engine.serve()         # task edgeheal.agent.alerts: the MQTT link and the ordered drain
    await engine.close()         # clean shutdown: retained status "offline", clean-exit mark

When a problem opens, changes, repeats and closes is :mod:`edgeheal.agent.alerts.lifecycle`
(a pure function of the open problems, the snapshot's observations and ``now``); the engine
raises what it returns and keeps the open problems in the outbox database, so a restart
continues them (same correlation, and a recovery that is still sent) instead of opening
duplicates. Around it, split by job: the metric families (:mod:`~edgeheal.agent.alerts.metrics`),
the run marker (:mod:`~edgeheal.agent.alerts.markers`), ``alert.test``
(:mod:`~edgeheal.agent.alerts.selftest`), the retained status and a problem's ``detail``
(:mod:`~edgeheal.agent.alerts.render`), the link's task and its session takeovers
(:mod:`~edgeheal.agent.alerts.link_keeper`); every call to the outbox stays here.

Delivery: every alert is committed to the outbox before it is logged or counted; the drain
publishes the oldest row at QoS 1, waits for its PUBACK, deletes it, then takes the next —
one in flight, so order holds across reconnects and restarts. A lost PUBACK means the same
row (same ``id``) is sent again: at-least-once, duplicates only there. Bounds drop the
oldest rows and one ``alerts.dropped`` alert (updated in place while undelivered) says how
many were lost. Time is ``ctx.clock`` (monotonic) for reminders; the wall clock only stamps
``time`` and ages rows in the outbox (which must survive a reboot).

The connection to ``[alerts] target`` (:class:`edgeheal.boundaries.mqtt.link.Link`) is built once by
the agent and handed to the engine's constructor (the target's mqtt check reads the same
object through ``Context.alert_link``); the engine runs it, drains over it and closes it.
With ``[alerts] target`` empty there is no connection: alerts are kept (bounded) in the
outbox and written to the log.

Faults of the outbox itself (a full disk, a read-only or foreign-owned ``state_dir``, a
corrupt file) never stop an alert from being raised: the outbox holds what it cannot write
in a bounded memory queue (delivered from there, written later); ``/status``
(``alerts.outbox``) and ``edgeheal_alerts_outbox_fault{fault}`` say which fault is in
force, and every alert that is finally lost is counted
(``edgeheal_alerts_dropped_total{reason}``) and reported by an ``alerts.dropped`` alert.
``edgeheal_alerts_outbox_depth`` and ``edgeheal_alerts_outbox_oldest_age_seconds`` say how
much waits and for how long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeheal import checks
from edgeheal.agent.alerts import delivery, kinds, lifecycle, markers, render
from edgeheal.agent.alerts.link_keeper import LinkKeeper
from edgeheal.agent.alerts.markers import RUNNING_MARKER
from edgeheal.agent.alerts.metrics import DROP_REASONS, AlertMetrics
from edgeheal.agent.alerts.offloop import OffLoopOutbox
from edgeheal.agent.alerts.outbox import DROPPED_KIND, RETRY_EVERY, Outbox
from edgeheal.agent.alerts.payload import Alert, UlidFactory
from edgeheal.agent.alerts.payload import build as build_alert
from edgeheal.agent.alerts.selftest import AlertTest
from edgeheal.base import compat
from edgeheal.base.statefile import Reset
from edgeheal.core.path_verdict import targets
from edgeheal.model import CheckStatus, Snapshot, State, rfc3339

if TYPE_CHECKING:
    from edgeheal.boundaries.mqtt.link import Link
    from edgeheal.model import Context, Event

log = logging.getLogger("edgeheal.alerts.engine")  # the name operators grep for

OUTBOX_FILE = "alerts.sqlite3"
PRUNE_EVERY = 60.0

# what others import from here (the marker and the drop reasons from the modules owning them)
__all__ = ["DROP_REASONS", "OUTBOX_FILE", "RUNNING_MARKER", "AlertEngine"]

_LEVEL = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}


class AlertEngine:
    _depth = 0
    """The outbox's depth when a job last counted it (for /status, without waiting)."""
    _loop: asyncio.AbstractEventLoop | None = None
    """The loop :meth:`serve` runs on, woken from the outbox's thread."""

    def __init__(self, ctx: Context, *, link: Link | None = None) -> None:
        """``link``: the agent's connection to ``[alerts] target`` (None: log only)."""
        cfg = ctx.config
        self.ctx, self.settings, self.node = ctx, cfg.alerts, cfg.node
        self.wall = ctx.wall
        self.ids = UlidFactory()
        prefix = self.settings.topic_prefix.strip("/")
        self.alerts_topic = f"{prefix}/{self.node}/alerts"
        self.status_topic = f"{prefix}/{self.node}/status"
        self.state_dir = Path(cfg.agent.state_dir)
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # the outbox reports it (and keeps alerts in memory)
            log.error("cannot create state_dir %s: %s", self.state_dir, err.strerror or err)
        self.outbox = OffLoopOutbox(lambda: Outbox(
            self.state_dir / OUTBOX_FILE, max_count=self.settings.outbox_max_count,
            max_age=self.settings.outbox_max_age, wall=lambda: self.wall().timestamp(),
            clock=ctx.clock))  # written on its own thread: an fsync never stalls the loop
        self.link = link
        self._mqtt_paths = {t.name: t.path for t in cfg.mqtt.targets}
        self.metrics = AlertMetrics(ctx.registry, wall=self.wall)
        self._keeper = None if link is None else LinkKeeper(self, link)
        self._wake = asyncio.Event()
        self._alert_test = AlertTest(self)
        self._status_doc: dict[str, Any] | None = None
        self._status_sent: dict[str, Any] | None = None
        self._closed = False
        self._problems = self._load_problems()
        self._tunnel_checks = (checks.role("tunnel").module, *targets(cfg, "tunnel"))
        """The checks whose problem remediation acts on (see :meth:`tunnel_problem`)."""
        self._last_tunnel_problem = ""
        """Correlation of the tunnel problem closed last in this run."""
        self._last_prune = -1e18
        self.previous_run = markers.previous_run(self.state_dir,
                                                 outbox_existed=self.outbox.existed)
        markers.mark_running(self.state_dir)
        self.outbox.post(self._gauges)
        for reset in self.outbox.resets:
            self._state_reset(reset)
        if self.outbox.newer is not None:  # a downgrade: alerts in memory, the file untouched
            self.raise_alert("agent.state_newer", self.outbox.newer.describe(),
                             self.outbox.newer.detail())
        if self.outbox.lost_unknown:
            self.raise_alert(DROPPED_KIND, "the alert outbox was corrupt and was moved aside; "
                             "an unknown number of undelivered alerts were lost",
                             {"dropped": 0, "unknown": True, "bound": "outbox_corrupt",
                              "moved_aside": str(self.outbox.moved_aside)})
        ctx.control("alert.test", self._alert_test)
        self.raise_alert("agent.started", f"edgeheal agent started on {self.node} "
                         f"(previous run: {self.previous_run})",
                         {"previous_run": self.previous_run,
                          "version": _version(), "pid": os.getpid()})

    # --- open problems --------------------------------------------------------------------

    def _load_problems(self) -> lifecycle.Problems:
        raw = self.outbox.get_meta("problems")
        try:
            return lifecycle.restore(raw or "", now=self.ctx.clock())
        except (ValueError, TypeError) as err:  # moved aside (a meta key), said, counted
            aside = f"problems.corrupt-{int(self.wall().timestamp())}"
            self.outbox.set_meta(aside, raw or "")
            self.outbox.set_meta("problems", "")
            log.error("the open-problem record in the outbox is unusable (%s); moved aside "
                      "to the meta key %s, starting with no open problem", err, aside)
            self._state_reset(Reset(f"{OUTBOX_FILE} (open problems)", str(err), aside))
            return lifecycle.Problems()

    def _state_reset(self, reset: Reset) -> None:
        self.raise_alert("agent.state_reset", f"state {reset.file} was unusable "
                         f"({reset.reason}); started afresh", reset.detail())

    def _save_problems(self) -> None:
        self.outbox.post(self.outbox.set_meta, "problems", lifecycle.record(self._problems))

    # --- raising --------------------------------------------------------------------------

    def raise_alert(self, kind: str, message: str, detail: Mapping[str, Any] | None = None, *,
                    correlation: str = "", reminder: bool = False,
                    required: bool = True) -> Alert:
        """Build the alert; on the outbox's thread, commit it, then log and count it."""
        alert = build_alert(kind, node=self.node, message=message, wall=self.wall(),
                            detail=detail, correlation=correlation, reminder=reminder,
                            required=required, ids=self.ids)
        self.outbox.post(self._commit, alert, self.wall().timestamp(), reminder)
        return alert

    def _commit(self, alert: Alert, raised: float, reminder: bool) -> None:
        """A job on the outbox's thread: an alert is logged and counted once it is stored."""
        kind = alert.kind
        dropped = self.outbox.add(alert.id, kind, raised, alert.encode())
        self.metrics.raised.labels(kind=kind).inc()
        if self.outbox.fault is not None:
            alert_log = f" (held in memory: the outbox is {self.outbox.fault})"
        else:
            alert_log = ""
        log.log(_LEVEL[alert.severity], "alert %s %s%s%s: %s", alert.kind, alert.id,
                " (reminder)" if reminder else "", alert_log, alert.message,
                extra={"alert_id": alert.id, "kind": alert.kind,
                       "correlation": alert.correlation})
        if dropped:
            self._note_dropped(dropped, "outbox_max_count")
        self._collect_drops()
        self._gauges()
        self._wake_soon()

    def _wake_soon(self) -> None:
        """Wake the delivery loop from the outbox's thread (asyncio.Event is loop-bound)."""
        loop = self._loop
        if loop is None or not self.outbox.writer.on_thread():
            self._wake.set()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to wake
            loop.call_soon_threadsafe(self._wake.set)

    def _collect_drops(self) -> None:
        for bound, count in self.outbox.take_drops().items():
            self._note_dropped(count, bound)

    def _gauges(self) -> None:
        self._depth = self.outbox.depth()
        oldest = self.outbox.oldest()
        self.metrics.refresh(depth=self._depth,
                             oldest_raised=None if oldest is None else oldest.raised,
                             memory_depth=self.outbox.memory_depth, fault=self.outbox.fault)

    def _note_dropped(self, count: int, bound: str) -> None:
        self.metrics.dropped.labels(reason=bound).inc(count)
        log.warning("alert outbox (%s): dropped the %d oldest undelivered alert(s)",
                    bound, count, extra={"kind": DROPPED_KIND})
        pending = self.outbox.latest(DROPPED_KIND)
        if pending is not None:
            old = Alert.decode(pending.payload)
            total = int(old.detail.get("dropped", 0)) + count
            updated = Alert(old.id, old.node, old.time, old.severity, old.kind,
                            old.correlation, _dropped_message(total),
                            {**old.detail, "dropped": total, "bound": bound}, False)
            if self.outbox.replace(pending.seq, updated.encode()):
                return
        self.raise_alert(DROPPED_KIND, _dropped_message(count),
                         {"dropped": count, "bound": bound,
                          "max_count": self.settings.outbox_max_count,
                          "max_age_seconds": self.settings.outbox_max_age})

    def _prune(self) -> None:
        if self.outbox.fault is not None or self.outbox.memory_depth:
            self.outbox.retry()
            self._collect_drops()
            self._gauges()
        now = self.ctx.clock()
        if now - self._last_prune < PRUNE_EVERY:
            return
        self._last_prune = now
        dropped = self.outbox.prune()
        if dropped:
            self._note_dropped(dropped, "outbox_max_age")
        self._collect_drops()
        self._gauges()

    def pause(self) -> float:
        """How long the delivery loops sleep when idle: shorter while the outbox is faulty
        (its memory queue is retried)."""
        return RETRY_EVERY if self.outbox.fault is not None else PRUNE_EVERY

    # --- the agent's inputs -----------------------------------------------------------------

    def observe(self, snapshot: Snapshot) -> None:
        """Turn debounced transitions into alerts; reminders; the retained status doc."""
        if self._closed:
            return
        now = self.ctx.clock()
        observations = [self._observation(name, status)
                        for name, status in snapshot.checks.items() if status.completed]
        step = lifecycle.step(self._problems, observations, now=now,
                              reminder_interval=self.settings.reminder_interval)
        problems = step.state
        for r in step.alerts:
            alert = self.raise_alert(
                r.kind, r.message, render.check_detail(
                    r.check, snapshot.checks[r.check], opened=r.opened,
                    path=self._mqtt_paths.get(r.check)),
                correlation=r.correlation, reminder=r.reminder, required=r.required)
            if r.phase == "open":
                problems = lifecycle.opened(problems, r.check, alert.correlation)
            elif r.phase == "recover" and r.check in self._tunnel_checks:
                self._last_tunnel_problem = r.correlation
        self._problems = problems
        if step.changed:
            self._save_problems()
        if snapshot.round_complete:
            doc = render.status_doc(snapshot)
            if doc != self._status_doc:
                self._status_doc = doc
                self._wake.set()

    def _observation(self, name: str, status: CheckStatus) -> lifecycle.Observation:
        kind, recovery = ("", "") if status.state is State.OK else \
            checks.alert_kinds(self.ctx.config, name, status)
        return lifecycle.Observation(name, status.state, status.reason, status.message,
                                     rfc3339(status.since), status.required, kind, recovery)

    def event(self, ev: Event) -> None:
        """An event from a check or actor (``ctx.emit``) becomes one alert."""
        if self._closed:
            return
        if ev.kind not in kinds.KINDS:
            log.error("event kind %r is not in the alert kinds table "
                      "(edgeheal.agent.alerts.kinds.KINDS); not raised: %s", ev.kind, ev.message)
            return
        detail = render.jsonable(ev.detail)
        if ev.kind.startswith("remediation.") and self.tunnel_problem():
            detail["problem"] = self.tunnel_problem()
        self.raise_alert(ev.kind, ev.message, detail, correlation=ev.correlation)

    def tunnel_problem(self) -> str:
        """The correlation of the problem remediation acts on, for its alerts'
        ``detail.problem``: the open problem of the WireGuard check, else of the first
        tunnel-path MQTT target with one open, else the tunnel problem closed last in this
        run (the circuit closes *after* the check recovered); empty if there is none."""
        for name in self._tunnel_checks:
            if name in self._problems.open:
                return self._problems.open[name].correlation
        return self._last_tunnel_problem

    # --- delivery ---------------------------------------------------------------------------

    def will(self) -> tuple[str, bytes]:
        """The will registered with each CONNECT: retained ``offline`` if we vanish."""
        return self.status_topic, self._status_payload("offline", reason="connection_lost")

    def _status_payload(self, state: str, checks: Mapping[str, str] | None = None,
                        reason: str = "") -> bytes:
        return render.status_payload(state, wall=self.wall(), checks=checks, reason=reason)

    async def serve(self) -> None:
        """Own the MQTT link (if any) and drain the outbox in order; runs until cancelled."""
        self._loop = asyncio.get_running_loop()
        if self._keeper is None:
            while True:
                await self.outbox.run(self._prune)
                with contextlib.suppress(*compat.TimeoutErrors):
                    async with compat.timeout(self.pause()):  # a cancel is never swallowed
                        await self._wake.wait()
                self._wake.clear()
        link = self._keeper.link
        runner = asyncio.create_task(self._keeper.run(), name="edgeheal.alerts.link")
        try:
            await delivery.drain(self, link)
        except asyncio.CancelledError:
            raise  # shutdown: close() still says "offline" over this connection
        except BaseException:
            link.drop()  # a crash: the supervisor restarts serve() with a new connection
            raise
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    async def close(self) -> None:
        """Clean shutdown: retained ``offline`` status, DISCONNECT, clean-exit mark."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.link is not None:
                final = (self.status_topic, self._status_payload("offline", reason="shutdown"))
                await self.link.close(final, limit=1.0)
        finally:
            self._save_problems()
            lost = await self.outbox.run(self.outbox.close)
            self.outbox.shutdown()
            if lost:
                self.metrics.dropped.labels(reason="shutdown").inc(lost)
            markers.mark_stopped(self.state_dir)

    def view(self) -> dict[str, Any]:
        """For /status: delivery state at a glance."""
        box = self.outbox
        return {"target": self.settings.target,
                "connected": bool(self.link and self.link.connected),
                "outbox_depth": self._depth if not self._closed else None,
                "outbox": {"state": box.fault or "ok", "message": box.fault_message,
                           "memory_queue": box.memory_depth},
                "open_problems": {n: p.correlation for n, p in self._problems.open.items()},
                **(self._keeper.view() if self._keeper is not None else {})}


def _dropped_message(total: int) -> str:
    return (f"{total} undelivered alert(s) were dropped from the outbox (oldest first) "
            "because a bound was hit, it could not be written, or it was corrupt "
            "(detail.bound says which, last)")


def _version() -> str:
    from edgeheal import __version__

    return str(__version__)

