"""The alert engine: snapshots and events in, durable alerts out, delivered in order.

The agent drives it through exactly this contract::

    engine = AlertEngine(ctx, link=link)   # the outbox, agent.started, alert.test
    engine.observe(snapshot)     # after every published snapshot (states already debounced)
    engine.event(ev)             # ctx.emit(...) lands here (offload.drift_corrected, ...)
    await engine.serve()         # task edgeheal.agent.alerts: the MQTT link and the ordered drain
    await engine.close()         # clean shutdown: retained status "offline", clean-exit mark

Why transitions and not results: a failing probe every 5 s must not become an alert every
5 s. A problem *opens* when a check's effective (debounced) state leaves ``ok``; a change of
state or kind while it lasts (``rekey_failing`` -> ``dead``) is one more alert with the same
``correlation``; every ``reminder_interval`` a ``reminder`` repeats it; the recovery alert
closes it, again with that ``correlation``. Open problems are kept in the outbox database,
so a restart continues them (same correlation, and a recovery that is still sent) instead
of opening duplicates.

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
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeheal import checks
from edgeheal.agent.alerts import kinds
from edgeheal.agent.alerts.offloop import OffLoopOutbox
from edgeheal.agent.alerts.outbox import DROPPED_KIND, FAULTS, RETRY_EVERY, Outbox
from edgeheal.agent.alerts.payload import Alert, UlidFactory
from edgeheal.agent.alerts.payload import build as build_alert
from edgeheal.boundaries.mqtt import MqttError
from edgeheal.boundaries.prometheus import CounterFamily
from edgeheal.checks.wireguard import NAME as WIREGUARD
from edgeheal.core.path_verdict import targets
from edgeheal.model import CheckStatus, Snapshot, State, rfc3339

if TYPE_CHECKING:
    from edgeheal.boundaries.mqtt.link import Link
    from edgeheal.model import Context, Event

log = logging.getLogger("edgeheal.alerts.engine")  # the name operators grep for

OUTBOX_FILE = "alerts.sqlite3"
RUNNING_MARKER = "agent.running"
"""Present while the agent runs; found at start-up, it means the last run did not end
cleanly (kill -9, crash, power loss)."""
MAX_TEST_ALERTS = 1000
MAX_TEST_WAIT = 30.0
"""Longest ``alert.test`` may wait for the broker's acknowledgements (seconds)."""
PRUNE_EVERY = 60.0
RETRY_AFTER_REJECT = 5.0
LINK_RESTART_MAX = 60.0
"""Longest pause before the link's task is restarted after a crash."""

NOT_YET = ("pending", "connecting")
"""Reasons that mean "no verdict yet": they never open a problem."""

DROP_REASONS = ("outbox_max_count", "outbox_max_age", "memory_queue", "outbox_corrupt",
                "shutdown")
"""Why undelivered alerts are lost (``edgeheal_alerts_dropped_total{reason}``): the
``detail.bound`` of the ``alerts.dropped`` alert, and ``shutdown`` (alerts held in memory
when the agent stopped: nothing is left to report them but the log and this counter)."""

_LEVEL = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}


@dataclass
class _Problem:
    correlation: str
    kind: str
    recovery: str
    state: str
    reason: str
    opened: str
    last_sent: float

    def to_json(self) -> dict[str, Any]:
        return {"correlation": self.correlation, "kind": self.kind, "recovery": self.recovery,
                "state": self.state, "reason": self.reason, "opened": self.opened}


class AlertEngine:
    _depth = 0
    """The outbox's depth when a job last counted it (for /status, without waiting)."""
    _loop: asyncio.AbstractEventLoop | None = None
    """The loop :meth:`serve` runs on, woken from the outbox's thread."""

    def __init__(self, ctx: Context, *, link: Link | None = None) -> None:
        """``link``: the agent's connection to ``[alerts] target`` (None: log only)."""
        from prometheus_client import Counter, Gauge

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
        self._mqtt_targets = {t.name: t for t in cfg.mqtt.targets}
        reg = ctx.registry
        self.m_raised = CounterFamily("edgeheal_alerts_raised", "Alerts raised, by kind.",
                                      ["kind"], registry=reg)
        for kind in kinds.KINDS:
            self.m_raised.labels(kind=kind)
        self.m_published = Counter("edgeheal_alerts_published",
                                   "Alerts acknowledged by the broker (PUBACK).", registry=reg)
        self.m_depth = Gauge("edgeheal_alerts_outbox_depth",
                             "Alerts in the durable outbox, not yet acknowledged.",
                             registry=reg)
        self._oldest: float | None = None
        """Wall-clock time the oldest queued alert was raised (None: the outbox is empty),
        refreshed with the other gauges; its age is computed at scrape time."""
        self.m_oldest = Gauge("edgeheal_alerts_outbox_oldest_age_seconds",
                              "Age of the oldest alert not yet acknowledged by the broker "
                              "(wall clock, like the outbox's age bound); 0 when the "
                              "outbox is empty.", registry=reg)
        self.m_oldest.set_function(self._oldest_age)
        self.m_dropped = CounterFamily(
            "edgeheal_alerts_dropped", "Undelivered alerts lost, by reason: outbox_max_count "
            "and outbox_max_age (the outbox's bounds), memory_queue (the outbox could not be "
            "written and the memory queue was full), outbox_corrupt (the file was moved "
            "aside), shutdown (held in memory when the agent stopped).", ["reason"],
            registry=reg)
        for reason in DROP_REASONS:
            self.m_dropped.labels(reason=reason)
        self.m_fault = Gauge("edgeheal_alerts_outbox_fault",
                             "1 for the fault that keeps the outbox database from being "
                             "written (alerts are held in memory meanwhile), else 0.",
                             ["fault"], registry=reg)
        self.m_memory = Gauge("edgeheal_alerts_memory_queue",
                              "Alerts held in memory because the outbox database cannot "
                              "be written.", registry=reg)
        self._wake = asyncio.Event()
        self._awaited: dict[str, asyncio.Future[None]] = {}
        """Alert ids ``alert.test`` waits on, resolved on their PUBACK."""
        self._status_doc: dict[str, Any] | None = None
        self._status_sent: dict[str, Any] | None = None
        self._closed = False
        self._problems: dict[str, _Problem] = self._load_problems()
        self._restored = set(self._problems)
        self._tunnel_checks = (WIREGUARD, *targets(cfg, "tunnel"))
        """The checks whose problem remediation acts on (see :meth:`tunnel_problem`)."""
        self._last_tunnel_problem = ""
        """Correlation of the tunnel problem closed last in this run."""
        self._last_prune = -1e18
        self.previous_run = self._previous_run()
        self._mark_running()
        self.outbox.post(self._gauges)
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

    # --- lifecycle marks ------------------------------------------------------------------

    def _previous_run(self) -> str:
        if (self.state_dir / RUNNING_MARKER).exists():
            return "unclean"
        return "clean" if self.outbox.existed else "none"

    def _mark_running(self) -> None:
        marker = self.state_dir / RUNNING_MARKER
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, f"{os.getpid()}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as err:  # a full or read-only state_dir: the outbox reports it
            log.error("cannot write %s (%s): the next start cannot tell whether this run "
                      "ended cleanly", marker, err.strerror or err)

    def _load_problems(self) -> dict[str, _Problem]:
        raw = self.outbox.get_meta("problems")
        out: dict[str, _Problem] = {}
        if not raw:
            return out
        try:
            for name, doc in json.loads(raw).items():
                out[name] = _Problem(last_sent=self.ctx.clock(), **doc)
        except (ValueError, TypeError) as err:
            log.warning("ignoring unreadable open-problem record in the outbox: %s", err)
            return {}
        return out

    def _save_problems(self) -> None:
        self.outbox.post(self.outbox.set_meta, "problems", json.dumps(
            {name: p.to_json() for name, p in self._problems.items()}, sort_keys=True))

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
        self.m_raised.labels(kind=kind).inc()
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
        self.m_depth.set(self._depth)
        oldest = self.outbox.oldest()
        self._oldest = None if oldest is None else oldest.raised
        self.m_memory.set(self.outbox.memory_depth)
        for fault in FAULTS:
            self.m_fault.labels(fault=fault).set(1 if self.outbox.fault == fault else 0)

    def _oldest_age(self) -> float:
        if self._oldest is None:
            return 0.0
        return max(0.0, self.wall().timestamp() - self._oldest)

    def _note_dropped(self, count: int, bound: str) -> None:
        self.m_dropped.labels(reason=bound).inc(count)
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

    def _pause(self) -> float:
        """How long the delivery loops sleep when idle: shorter while the outbox is faulty
        (its memory queue is retried)."""
        return RETRY_EVERY if self.outbox.fault is not None else PRUNE_EVERY

    # --- the agent's inputs -----------------------------------------------------------------

    def observe(self, snapshot: Snapshot) -> None:
        """Turn debounced transitions into alerts; reminders; the retained status doc."""
        if self._closed:
            return
        now = self.ctx.clock()
        changed = False
        for name, status in snapshot.checks.items():
            if not status.completed:
                continue
            changed |= self._observe_check(name, status, now)
        if changed:
            self._save_problems()
        if snapshot.round_complete:
            doc = {"state": _overall(snapshot), "checks": {
                n: s.state.value for n, s in snapshot.checks.items()}}
            if doc != self._status_doc:
                self._status_doc = doc
                self._wake.set()

    def _observe_check(self, name: str, status: CheckStatus, now: float) -> bool:
        problem = self._problems.get(name)
        restored = name in self._restored
        self._restored.discard(name)
        if status.state is State.OK:
            if problem is None:
                return False
            del self._problems[name]
            if name in self._tunnel_checks:
                self._last_tunnel_problem = problem.correlation
            why = status.message or status.reason
            self.raise_alert(problem.recovery, f"{name}: ok again ({why})",
                             self._detail(name, status, opened=problem.opened),
                             correlation=problem.correlation, required=status.required)
            return True
        if problem is None and status.reason in NOT_YET:
            return False
        kind, recovery = self._problem_kind(name, status)
        required = status.required and (status.state is State.FAILED or kind != "check.failed")
        message = f"{name}: {status.state.value} ({status.reason}): {status.message}"
        if problem is None:
            alert = self.raise_alert(kind, message, self._detail(name, status),
                                     required=required)
            self._problems[name] = _Problem(alert.correlation, kind, recovery,
                                            status.state.value, status.reason,
                                            rfc3339(status.since), now)
            return True
        if problem.kind != kind or problem.state != status.state.value:
            if restored and problem.kind == kind:
                problem.state, problem.reason = status.state.value, status.reason
                return True
            self.raise_alert(kind, message, self._detail(name, status, opened=problem.opened),
                             correlation=problem.correlation, required=required)
            problem.kind, problem.state, problem.reason = kind, status.state.value, \
                status.reason
            problem.last_sent = now
            return True
        if restored:
            return False
        if now - problem.last_sent >= self.settings.reminder_interval:
            self.raise_alert(kind, f"still {message}",
                             self._detail(name, status, opened=problem.opened),
                             correlation=problem.correlation, reminder=True,
                             required=required)
            problem.last_sent = now
        return False

    def _problem_kind(self, name: str, status: CheckStatus) -> tuple[str, str]:
        return checks.alert_kinds(self.ctx.config, name, status)

    def _detail(self, name: str, status: CheckStatus, *, opened: str = "") -> dict[str, Any]:
        detail: dict[str, Any] = {"check": name, "state": status.state.value,
                                  "reason": status.reason, "since": rfc3339(status.since),
                                  "required": status.required}
        if opened:
            detail["opened"] = opened
        target = self._mqtt_targets.get(name)
        if target is not None:
            detail["path"] = target.path
        if status.detail:
            detail["observed"] = _jsonable(status.detail)
        return detail

    def event(self, ev: Event) -> None:
        """An event from a check or actor (``ctx.emit``) becomes one alert."""
        if self._closed:
            return
        if ev.kind not in kinds.KINDS:
            log.error("event kind %r is not in the alert kinds table "
                      "(edgeheal.agent.alerts.kinds.KINDS); not raised: %s", ev.kind, ev.message)
            return
        detail = _jsonable(ev.detail)
        if ev.kind.startswith("remediation.") and self.tunnel_problem():
            detail["problem"] = self.tunnel_problem()
        self.raise_alert(ev.kind, ev.message, detail, correlation=ev.correlation)

    def tunnel_problem(self) -> str:
        """The correlation of the problem remediation acts on, for its alerts'
        ``detail.problem``: the open problem of the WireGuard check, else of the first
        tunnel-path MQTT target with one open, else the tunnel problem closed last in this
        run (the circuit closes *after* the check recovered); empty if there is none."""
        for name in self._tunnel_checks:
            if name in self._problems:
                return self._problems[name].correlation
        return self._last_tunnel_problem

    async def _alert_test(self, args: Mapping[str, Any]) -> dict[str, Any]:
        count = args.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) \
                or not 1 <= count <= MAX_TEST_ALERTS:
            raise ValueError(f"count must be an integer from 1 to {MAX_TEST_ALERTS}, "
                             f"got {count!r}")
        wait = args.get("wait", 0)
        if isinstance(wait, bool) or not isinstance(wait, int | float) \
                or not 0 <= wait <= MAX_TEST_WAIT:
            raise ValueError(f"wait must be a number of seconds from 0 to {MAX_TEST_WAIT:g}, "
                             f"got {wait!r}")
        loop = asyncio.get_running_loop()
        ids = []
        for i in range(1, count + 1):
            alert_id = self.raise_alert("agent.test", f"test alert {i} of {count} from "
                                        f"{self.node}", {"index": i, "count": count}).id
            ids.append(alert_id)
            if wait and self.link is not None:
                self._awaited[alert_id] = loop.create_future()
        await self.outbox.settled()  # "raised" means stored: the reply waits for the disk
        futures = [self._awaited[i] for i in ids if i in self._awaited]
        try:
            if futures:
                await asyncio.wait(futures, timeout=float(wait))
        finally:
            for alert_id in ids:
                self._awaited.pop(alert_id, None)
        published = sum(1 for f in futures if f.done())
        return {"raised": count, "ids": ids, "published": published,
                "queued": count - published, "waited_seconds": wait,
                "outbox_depth": await self.outbox.run(self.outbox.depth),
                "target": self.settings.target, "topic": self.alerts_topic}

    # --- delivery ---------------------------------------------------------------------------

    def will(self) -> tuple[str, bytes]:
        """The will registered with each CONNECT: retained ``offline`` if we vanish."""
        return self.status_topic, self._status_payload("offline", reason="connection_lost")

    def _status_payload(self, state: str, checks: Mapping[str, str] | None = None,
                        reason: str = "") -> bytes:
        doc: dict[str, Any] = {"state": state, "time": rfc3339(self.wall()),
                               "checks": dict(checks or {})}
        if reason:
            doc["reason"] = reason
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    async def serve(self) -> None:
        """Own the MQTT link (if any) and drain the outbox in order; runs until cancelled."""
        self._loop = asyncio.get_running_loop()
        if self.link is None:
            while True:
                await self.outbox.run(self._prune)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._pause())
                self._wake.clear()
        link = self.link
        runner = asyncio.create_task(self._keep_link(link), name="edgeheal.alerts.link")
        try:
            await self._drain(link)
        except asyncio.CancelledError:
            raise  # shutdown: close() still says "offline" over this connection
        except BaseException:
            link.drop()  # a crash: the supervisor restarts serve() with a new connection
            raise
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)

    async def _keep_link(self, link: Link) -> None:
        """Run the link; if its task ever dies, log it and restart it with capped backoff
        (the drain waits for the link, so a dead link task would silence every alert)."""
        delay = 1.0
        while not link.closing:
            began = self.ctx.clock()
            try:
                await link.run(will=self.will, on_state=lambda _state: self._wake.set())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("alert link task crashed; restarting it in %.0fs", delay)
            if self.ctx.clock() - began > 5 * LINK_RESTART_MAX:
                delay = 1.0
            await asyncio.sleep(delay)
            delay = min(delay * 2, LINK_RESTART_MAX)

    async def _drain(self, link: Link) -> None:
        while True:
            await link.wait_up()
            generation = link.generation
            try:
                self._status_sent = None  # the will may have replaced it: say it again
                while link.connected and link.generation == generation:
                    await self.outbox.run(self._prune)
                    if self._status_doc is not None and self._status_doc != self._status_sent:
                        doc = self._status_doc
                        await link.publish(self.status_topic, self._status_payload(
                            doc["state"], doc["checks"]), retain=True)
                        self._status_sent = doc
                        continue
                    entry = await self.outbox.run(self.outbox.oldest)
                    if entry is None:
                        self._wake.clear()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), self._pause())
                        continue
                    await link.publish(self.alerts_topic, entry.payload)
                    await self.outbox.run(self.outbox.delete, entry.seq)
                    self.m_published.inc()
                    awaited = self._awaited.get(entry.id)
                    if awaited is not None and not awaited.done():
                        awaited.set_result(None)
                    await self.outbox.run(self._gauges)
                    log.debug("alert %s delivered (PUBACK)", entry.id,
                              extra={"alert_id": entry.id, "kind": entry.kind})
            except MqttError as err:
                log.info("alert delivery paused (%s): %s; %d alert(s) wait in the outbox",
                         err.reason, err, self._depth)
                if link.connected and link.generation == generation:
                    await asyncio.sleep(RETRY_AFTER_REJECT)  # rejected, not disconnected

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
                self.m_dropped.labels(reason="shutdown").inc(lost)
            try:
                (self.state_dir / RUNNING_MARKER).unlink(missing_ok=True)
            except OSError as err:
                log.error("cannot remove %s: %s", RUNNING_MARKER, err.strerror or err)

    def view(self) -> dict[str, Any]:
        """For /status: delivery state at a glance."""
        box = self.outbox
        return {"target": self.settings.target,
                "connected": bool(self.link and self.link.connected),
                "outbox_depth": self._depth if not self._closed else None,
                "outbox": {"state": box.fault or "ok", "message": box.fault_message,
                           "memory_queue": box.memory_depth},
                "open_problems": {n: p.correlation for n, p in self._problems.items()}}


def _dropped_message(total: int) -> str:
    return (f"{total} undelivered alert(s) were dropped from the outbox (oldest first) "
            "because a bound was hit, it could not be written, or it was corrupt "
            "(detail.bound says which, last)")


def _overall(snapshot: Snapshot) -> str:
    state = snapshot.overall
    if state is State.UNKNOWN:
        return "degraded"  # nothing proved a fault; the per-check map says "unknown"
    return str(state.value)


def _jsonable(value: Mapping[str, Any]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(dict(value), default=str)))


def _version() -> str:
    from edgeheal import __version__

    return str(__version__)

