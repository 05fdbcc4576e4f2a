"""The remediation actor: runs the pure policy and carries out what it decides.

Why an actor apart from the policy: deciding must be pure and testable
(:mod:`edgeheal.policy`), while doing — picking a remedy, restarting Flannel, waiting for the
replacement, verifying the tunnel, persisting the history, telling people — is I/O. The
actor reads only the published snapshot (never a check directly) and re-evaluates on every
snapshot change and at least every second.

Mode: ``pod`` / ``k3s-service`` as configured, or ``auto``, resolved by probing: ``pod``
when a Flannel pod is scheduled on this node (needs ``[kubernetes]``), else
``k3s-service`` when a k3s/k3s-agent unit exists (:mod:`edgeheal.remedies.k3s_service`,
imported lazily; its absence is tolerated), else ``none`` (alert only), re-probed every
minute. What was picked and why is logged and shown in ``/status``.

A restart: run the remedy (which returns once the replacement pod is Ready or the unit
active again, or raises :class:`~edgeheal.remedies.RemedyError`), then verify recovery
within ``verify_timeout`` from the snapshot: a WireGuard result ``ok`` (fresh handshake, rx
growing: the check's own definition) and an ``ok`` result of every tunnel-path MQTT target,
each *observed after* the restart completed. The attempt is recorded (result
``recovered``, ``not_recovered``, ``failed``, ``config_problem`` or ``dry_run``), persisted,
counted in ``edgeheal_remediations_total{action,result}`` and timed in
``edgeheal_remediation_duration_seconds``.

Events (alerts): ``remediation.restarted``, ``.recovered``, ``.failed``, ``.skipped``
(once per failure episode and skip reason, not every second), ``.circuit_open``. With
``[kubernetes]``, the same moments become Events on the Node (``FlannelRestarted``,
``RemediationSkipped``, ``RemediationCircuitOpen``, ``FlannelRecovered``) and the
``EdgeTunnelHealthy`` Node condition follows the tunnel; both are best effort, in the
background, and a 403 turns them off with one warning.

Operators: ``remediation.pause`` (``{"for": "30m"}`` or indefinite), ``remediation.resume``
and ``remediation.reset`` (closes the circuit) on the control socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeheal import policy
from edgeheal.model import Context, Event, Snapshot, State, rfc3339
from edgeheal.policy import Action, History, Record, Timeline
from edgeheal.remedies import Remedy, RemedyError

if TYPE_CHECKING:
    from edgeheal.kube import KubeClient

log = logging.getLogger(__name__)

TICK = 0.2
"""How often the snapshot is looked at for a change, seconds."""
EVALUATE_EVERY = 1.0
"""Evaluate at least this often even without a snapshot change (time-based gates)."""
REPROBE_EVERY = 60.0
"""``auto`` with nothing found: probe again this often."""
VIEW_ACTIONS = 20
CONDITION_TYPE = "EdgeTunnelHealthy"
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def boot_id() -> str:
    try:
        return BOOT_ID_FILE.read_text(encoding="ascii").strip()
    except OSError:
        return "unknown"


RemedyFactory = Callable[[str], Remedy | None]
"""mode -> remedy instance (None when that mode is unavailable in this build)."""


class Remediator:
    def __init__(self, ctx: Context, *, remedy_factory: RemedyFactory | None = None,
                 kube: KubeClient | None = None,
                 boot_clock: Callable[[], float] = boottime, boot: str | None = None,
                 tick: float = TICK) -> None:
        from prometheus_client import Counter, Histogram  # noqa: PLC0415

        self.ctx = ctx
        self.config = ctx.config
        self.settings = ctx.config.remediation
        self.clock, self.wall, self.boot_clock, self.tick = ctx.clock, ctx.wall, boot_clock, tick
        self._kube = kube
        self._remedy_factory = remedy_factory or self._default_factory
        self.timeline = Timeline(boot_id=boot or boot_id(), offset=boot_clock() - self.clock())
        self.path = Path(self.config.agent.state_dir) / policy.HISTORY_FILE
        self.history = self._load()
        self.mode = "auto" if self.settings.mode == "auto" else self.settings.mode
        self.mode_why = "resolving" if self.settings.mode == "auto" else "configured"
        self.remedy: Remedy | None = None
        self.last: Action | None = None
        self.busy: str | None = None
        self._announced: set[tuple[str, str]] = set()
        self._direct_was_down = False
        self._condition: bool | None = None
        self._kube_side = self.config.kubernetes is not None
        self._background: set[asyncio.Task[None]] = set()
        self.restarts = Counter(
            "edgeheal_remediations", "Remediation decisions carried out, by action "
            "(restart, skip, open_circuit, close_circuit) and result.",
            ["action", "result"], registry=ctx.registry)
        self.duration = Histogram(
            "edgeheal_remediation_duration_seconds",
            "Duration of a restart: remedy plus recovery verification.",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300), registry=ctx.registry)
        ctx.control("remediation.pause", self._pause)
        ctx.control("remediation.resume", self._resume)
        ctx.control("remediation.reset", self._reset)

    # --- history ---------------------------------------------------------------------------

    def _load(self) -> History:
        try:
            return policy.load(self.path, self.timeline)
        except policy.HistoryError as err:
            aside = self.path.with_suffix(".corrupt")
            with contextlib.suppress(OSError):
                self.path.replace(aside)
            log.error("%s; moved aside to %s, starting with an empty history", err, aside)
            return History()

    def _store(self, history: History) -> None:
        self.history = history
        try:
            policy.save(self.path, history, self.timeline)
        except policy.HistoryError as err:
            log.error("%s", err)

    # --- mode ------------------------------------------------------------------------------

    def _default_factory(self, mode: str) -> Remedy | None:
        if mode == "pod":
            if self.config.kubernetes is None:
                return None
            from edgeheal.remedies.pod import PodRemedy  # noqa: PLC0415

            return PodRemedy(self.kube(), self.settings.pod, node=self.config.node)
        if mode == "k3s-service":
            try:
                from edgeheal.remedies.k3s_service import K3sServiceRemedy  # noqa: PLC0415
            except ModuleNotFoundError as err:
                if err.name != "edgeheal.remedies.k3s_service":
                    raise
                return None
            return K3sServiceRemedy(self.settings.service)
        return None

    def kube(self) -> KubeClient:
        if self._kube is None:
            from edgeheal.kube import KubeClient  # noqa: PLC0415

            assert self.config.kubernetes is not None  # noqa: S101 - checked by callers
            self._kube = KubeClient(self.config.kubernetes)
        return self._kube

    async def resolve(self) -> None:
        """Pick the remedy (``auto``: probe in order) and say why."""
        configured = self.settings.mode
        if configured != "auto":
            self.remedy = self._remedy_factory(configured)
            if self.remedy is None:
                self.mode, self.mode_why = "none", f"mode {configured} is not available here"
            else:
                available = await self._probe(self.remedy)
                self.mode = configured
                self.mode_why = f"configured; {available}"
            log.info("remediation mode %s: %s", self.mode, self.mode_why)
            return
        reasons = []
        for mode in ("pod", "k3s-service"):
            remedy = self._remedy_factory(mode)
            if remedy is None:
                reasons.append(f"{mode}: not configured"
                               if mode == "pod" else f"{mode}: not in this build")
                continue
            availability = await self._probe_availability(remedy)
            if availability.usable:
                self.remedy, self.mode = remedy, mode
                self.mode_why = f"auto: {availability.why}"
                log.info("remediation mode %s: %s", self.mode, self.mode_why)
                return
            reasons.append(f"{mode}: {availability.why}")
        why = "auto: nothing to restart (" + "; ".join(reasons) + ")"
        if (self.mode, self.mode_why) != ("none", why):
            log.info("remediation mode none: %s", why)
        self.remedy, self.mode, self.mode_why = None, "none", why

    async def _probe_availability(self, remedy: Remedy) -> Any:
        from edgeheal.remedies import Availability  # noqa: PLC0415

        try:
            return await asyncio.wait_for(remedy.probe(), 30.0)
        except TimeoutError:
            return Availability(False, "probe timed out after 30s")
        except RemedyError as err:
            return Availability(False, str(err))

    async def _probe(self, remedy: Remedy) -> str:
        availability = await self._probe_availability(remedy)
        return availability.why if availability.usable else f"not usable now: {availability.why}"

    # --- the loop --------------------------------------------------------------------------

    async def serve(self) -> None:
        await self.resolve()
        last_snap: Snapshot | None = None
        last_eval = -math.inf
        last_probe = self.clock()
        try:
            while True:
                now = self.clock()
                snap = self.ctx.snapshot()
                if snap is not last_snap or now - last_eval >= EVALUATE_EVERY:
                    last_snap, last_eval = snap, now
                    await self.evaluate(snap)
                if (self.settings.mode == "auto" and self.mode == "none"
                        and now - last_probe >= REPROBE_EVERY):
                    last_probe = now
                    await self.resolve()
                await asyncio.sleep(self.tick)
        finally:
            for task in list(self._background):
                task.cancel()
            if self._kube is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._kube.close(), 1.0)

    def tunnel_view(self, snap: Snapshot) -> policy.TunnelView:
        now = self.clock()
        view = policy.view_of(snap, self.config, mode=self.mode,
                              booted_mono=now - self.boot_clock(),
                              direct_was_down=self._direct_was_down)
        if any(s is State.FAILED for s in view.direct_mqtt.values()):
            self._direct_was_down = True  # an outage, not the first connection's "unknown"
        return view

    async def evaluate(self, snap: Snapshot) -> list[Action]:
        """One decision round (public for tests): decide, then carry it out."""
        view = self.tunnel_view(snap)
        self._follow_condition(view)
        actions = policy.decide(view, self.history, self.clock(), self.settings)
        if not actions or actions[0].kind in ("close_circuit", "restart"):
            self._announced.clear()  # a new failure episode announces its skips again
        for action in actions:
            self.last = action
            await self._apply(action, snap)
        return actions

    async def _apply(self, action: Action, snap: Snapshot) -> None:
        if action.kind == "restart":
            await self._restart(action)
        elif action.kind == "skip":
            if ("skip", action.reason) in self._announced:
                return
            self._announced.add(("skip", action.reason))
            log.warning("remediation skipped (%s): %s", action.reason, action.message)
            self.restarts.labels(action="skip", result=action.reason).inc()
            self._emit("remediation.skipped", action.message,
                       {"reason": action.reason, "mode": self.mode})
            self._node_event("RemediationSkipped", action.message, warning=False)
        elif action.kind == "watch":
            if ("watch", action.reason) not in self._announced:
                self._announced.add(("watch", action.reason))
                log.warning("remediation: %s", action.message)
        elif action.kind == "open_circuit":
            self._store(self.history.opened())
            self.restarts.labels(action="open_circuit", result="opened").inc()
            log.critical("remediation circuit open: %s", action.message)
            self._emit("remediation.circuit_open", action.message,
                       {"reason": action.reason, "mode": self.mode,
                        "failures_in_row": self.history.failures_in_row})
            self._node_event("RemediationCircuitOpen", action.message, warning=True)
        elif action.kind == "close_circuit":
            was_open = self.history.circuit_open
            self._store(self.history.closed())
            self.restarts.labels(action="close_circuit", result="closed").inc()
            log.info("remediation: %s", action.message)
            if was_open:
                self._emit("remediation.recovered",
                           "the tunnel is healthy again; remediation circuit closed",
                           {"mode": self.mode, "circuit": "closed"})

    async def _restart(self, action: Action) -> None:
        began, wall = self.clock(), self.wall()
        correlation = uuid.uuid4().hex[:12]
        detail: dict[str, Any] = {"mode": self.mode, "reason": action.reason}
        if action.dry_run or self.remedy is None:
            log.warning("remediation DRY RUN: would restart Flannel (%s): %s", self.mode,
                        action.message)
            self._record(Record(mono=began, wall=rfc3339(wall), mode=self.mode,
                                reason=action.reason, result="dry_run", duration=0.0))
            self._emit("remediation.skipped", f"dry run: {action.message}",
                       {**detail, "dry_run": True}, correlation)
            return
        self.busy = action.reason
        log.warning("remediation: restarting Flannel (%s): %s", self.mode, action.message)
        # persisted before acting: an agent killed mid-restart still counts this attempt
        self._store(self.history.with_record(Record(
            mono=began, wall=rfc3339(wall), mode=self.mode, reason=action.reason,
            result="in_progress", duration=0.0)))
        target, result = "", "failed"
        try:
            try:
                async with asyncio.timeout(self._restart_bound()):
                    outcome = await self.remedy.restart()
            except RemedyError as err:
                result = "config_problem" if err.config_problem else "failed"
                self._emit("remediation.failed", f"restart failed: {err}",
                           {**detail, "result": result}, correlation)
                log.error("remediation: restart failed (%s): %s", result, err)
                return
            except asyncio.CancelledError:
                result = "interrupted"  # the agent is stopping: neither cured nor failed
                raise
            except TimeoutError:
                self._emit("remediation.failed",
                           f"restart did not finish within {self._restart_bound():g}s",
                           {**detail, "result": "failed"}, correlation)
                return
            target = outcome.target
            self._emit("remediation.restarted", f"restarted {target}: {action.message}",
                       {**detail, "target": target}, correlation)
            self._node_event("FlannelRestarted",
                             f"edgeheal restarted {target} ({action.reason})", warning=True)
            ready = self.clock()
            recovered = await self._verify(ready)
            result = "recovered" if recovered else "not_recovered"
            if recovered:
                self._emit("remediation.recovered",
                           f"tunnel recovered {self.clock() - ready:.1f}s after {target} "
                           "was back", {**detail, "target": target}, correlation)
                self._node_event("FlannelRecovered", "the tunnel recovered after the restart",
                                 warning=False)
            else:
                self._emit("remediation.failed",
                           f"restarted {target}, but the tunnel did not recover within "
                           f"{self.settings.verify_timeout:g}s",
                           {**detail, "target": target, "result": result}, correlation)
        finally:
            duration = self.clock() - began
            self.busy = None
            self.duration.observe(duration)
            self.restarts.labels(action="restart", result=result).inc()
            self._store(self.history.finished(Record(
                mono=began, wall=rfc3339(wall), mode=self.mode, reason=action.reason,
                result=result, duration=duration, target=target)))
            log.info("remediation: restart %s after %.1fs (%s)", result, duration,
                     target or "no target")

    def _restart_bound(self) -> float:
        """An outer bound on a remedy's own timeouts (a stuck remedy must not hang us)."""
        return max(self.settings.pod.ready_timeout, self.settings.service.timeout) + 120.0

    def _record(self, record: Record) -> None:
        self.restarts.labels(action="restart", result=record.result).inc()
        self._store(self.history.with_record(record))

    async def _verify(self, since: float) -> bool:
        """Fresh ok results for WireGuard and every tunnel-path target, after ``since``."""
        deadline = since + self.settings.verify_timeout
        tunnel = [t.name for t in self.config.mqtt.targets if t.path == "tunnel"]
        while self.clock() < deadline:
            snap = self.ctx.snapshot()
            names = [n for n in ("wireguard", *tunnel) if n in snap.checks]
            if names and all(self._fresh_ok(snap, n, since) for n in names):
                return True
            await asyncio.sleep(self.tick)
        return False

    @staticmethod
    def _fresh_ok(snap: Snapshot, name: str, since: float) -> bool:
        status = snap.checks[name]
        return (status.observed is not None and status.observed.state is State.OK
                and status.last_run_mono is not None and status.last_run_mono > since)

    # --- ways out -------------------------------------------------------------------------

    def _emit(self, kind: str, message: str, detail: Mapping[str, Any],
              correlation: str = "") -> None:
        self.ctx.emit(Event(kind, message, dict(detail), correlation))

    def _background_task(self, coro: Awaitable[None], name: str) -> None:
        async def run() -> None:
            await coro

        task = asyncio.get_running_loop().create_task(run(), name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _node_event(self, reason: str, message: str, *, warning: bool) -> None:
        kube = self.config.kubernetes
        if kube is None or not kube.events or not self._kube_side:
            return
        self._background_task(self._post_event(reason, message, warning),
                              "edgeheal.remediation.event")

    async def _post_event(self, reason: str, message: str, warning: bool) -> None:
        from edgeheal.kube import KubeError, KubePermissionError  # noqa: PLC0415

        try:
            await self.kube().node_event(self.config.node, reason, message,
                                         warning=warning)
        except KubePermissionError as err:
            log.warning("not recording Node Events any more: %s", err)
            self._kube_side = False
        except KubeError as err:
            log.warning("could not record Event %s on node %s: %s", reason,
                        self.config.node, err)

    def _follow_condition(self, view: policy.TunnelView) -> None:
        kube = self.config.kubernetes
        if kube is None or not kube.node_condition:
            return
        if view.wireguard is None and not view.tunnel_mqtt:
            return
        healthy: bool | None = view.healthy
        if not healthy and view.failure() is None and view.wireguard in (None, State.UNKNOWN):
            healthy = None  # no evidence either way (starting, connecting, check error)
        if healthy == self._condition:
            return
        self._condition = healthy
        reason = "TunnelHealthy" if healthy else (
            "Tunnel" + "".join(p.title() for p in (view.failure() or view.wireguard_reason
                                                   or "unknown").split("_")))
        message = (f"wireguard {view.wireguard.value if view.wireguard else 'not watched'}"
                   f" ({view.wireguard_reason or '-'}); tunnel-path MQTT: "
                   + (", ".join(f"{n}={s.value}" for n, s in view.tunnel_mqtt.items())
                      or "none"))
        self._background_task(self._patch_condition(healthy, reason, message),
                              "edgeheal.remediation.condition")

    async def _patch_condition(self, healthy: bool | None, reason: str, message: str,
                               ) -> None:
        from edgeheal.kube import KubeError, KubePermissionError  # noqa: PLC0415

        try:
            await self.kube().set_node_condition(self.config.node, CONDITION_TYPE,
                                                 healthy, reason, message)
        except KubePermissionError as err:
            log.warning("not keeping the %s Node condition: %s", CONDITION_TYPE, err)
            self._condition_disabled()
        except KubeError as err:
            self._condition = None  # try again on the next evaluation that differs
            log.warning("could not update the %s condition: %s", CONDITION_TYPE, err)

    def _condition_disabled(self) -> None:
        """A 403 on nodes/status: stop keeping the condition (the rest carries on)."""
        import dataclasses  # noqa: PLC0415

        if self.config.kubernetes is not None:
            self.config = dataclasses.replace(
                self.config, kubernetes=dataclasses.replace(self.config.kubernetes,
                                                            node_condition=False))

    # --- control ---------------------------------------------------------------------------

    async def _pause(self, args: Mapping[str, Any]) -> Any:
        from edgeheal.config import format_duration, parse_duration  # noqa: PLC0415

        raw = args.get("for")
        seconds = None if raw in (None, "") else parse_duration(raw)
        self._store(self.history.paused_for(self.clock(), seconds))
        how = "until resumed" if seconds is None else f"for {format_duration(seconds)}"
        log.warning("remediation paused %s by the operator", how)
        return self.view()

    async def _resume(self, args: Mapping[str, Any]) -> Any:
        self._store(self.history.resumed())
        log.warning("remediation resumed by the operator")
        return self.view()

    async def _reset(self, args: Mapping[str, Any]) -> Any:
        self._store(self.history.closed())
        self._announced.clear()
        log.warning("remediation circuit reset by the operator")
        return self.view()

    # --- /status ---------------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        now = self.clock()
        paused: str | None = None
        if self.history.paused(now):
            until = self.history.paused_until
            assert until is not None  # noqa: S101
            paused = ("indefinite" if until == math.inf
                      else rfc3339(self.wall() + timedelta(seconds=until - now)))
        return {
            "mode": self.mode,
            "why": self.mode_why,
            "configured_mode": self.settings.mode,
            "dry_run": self.settings.dry_run,
            "circuit": "open" if self.history.circuit_open else "closed",
            "failures_in_row": self.history.failures_in_row,
            "budget_left": policy.budget_left(self.history, now, self.settings),
            "paused_until": paused,
            "busy": self.busy,
            "last_decision": None if self.last is None else {
                "action": self.last.kind, "reason": self.last.reason,
                "message": self.last.message},
            "actions": [r.to_json() for r in reversed(self.history.records)][:VIEW_ACTIONS],
        }


def build(ctx: Context) -> Remediator | None:
    """The agent's hook: a remediator unless ``mode = "none"``."""
    if ctx.config.remediation.mode == "none":
        log.info("remediation mode none (configured): alerts only")
        return None
    return Remediator(ctx)
