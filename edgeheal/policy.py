"""The remediation policy: a pure decision, plus the action history it reads.

``decide(view, history, now, settings) -> [Action]`` answers "should Flannel be restarted
now?" without doing I/O or reading a clock, so every rung and every safeguard is a row in
a table-driven test (tests/remediation/test_policy.py). The actor
(:mod:`edgeheal.remediation`) builds the :class:`TunnelView` from the snapshot, runs the
chosen remedy, and records what happened back into the :class:`History`.

The ladder (first matching rule wins):

1. the tunnel is healthy (WireGuard ``ok`` and no tunnel-path MQTT target failing):
   nothing to do; if the circuit is open or earlier restarts did not cure, ``close_circuit``.
2. ``degraded`` tunnel (``rekey_failing``): ``watch``, never a restart. The session still
   carries traffic and the incident's cause (TX checksum offload) is cured by the offload
   enforcer alone; the action records the offload check's state.
3. a *failed* tunnel: WireGuard ``failed`` with reason ``stalled``/``dead``/
   ``never_connected`` (or ``no_peers``/``interface_missing``: Flannel lost the peers or
   the device it manages, which a restart rebuilds), or a tunnel-path MQTT target
   ``failed`` while every direct-path target is ``ok``. Anything else (``unknown``, not
   yet measured) is no evidence: no action.
4. a failed tunnel passes the safeguards in this order, each a ``skip`` with its reason:
   ``paused`` (operator), ``circuit_open``, ``direct_path_down`` (a direct-path target
   fails too: the uplink or the cloud is down, a restart cannot help), ``uplink_settling``
   (the direct path came back less than ``uplink_settle`` ago: an outage stalls the tunnel
   too, so give it that long to recover by itself; found in the lab's uplink-outage
   scenario, where restarting on the uplink's return "healed" an outage), ``mode_none``,
   ``startup_grace`` (agent or node started less than ``startup_grace`` ago),
   ``cooldown`` (last restart too recent), ``budget_exhausted`` (``max_per_hour`` restarts
   in the last sliding hour). Before the time gates, ``give_up_after`` restarts in a row
   that did not cure open the circuit (``open_circuit``).
5. otherwise ``restart`` (``dry_run`` marks it: the actor says everything, does nothing).

**Time, and why history survives restarts and clock steps.** ``now`` is the agent's
monotonic clock. The history is persisted (JSON, written atomically) with each entry's
*CLOCK_BOOTTIME* reading plus the boot id (``/proc/sys/kernel/random/boot_id``); the wall
time is stored for humans only. On load, entries of the *same boot* are mapped onto the
new process's monotonic timeline through the boottime offset, so an agent killed and
restarted in a loop still sees its earlier restarts and cannot exceed ``max_per_hour``,
and a wall-clock step (NTP, an RTC without battery, a 4G modem's time) changes nothing.
CLOCK_BOOTTIME rather than CLOCK_MONOTONIC because it keeps counting through suspend, so
"an hour ago" stays true. Entries of an *earlier boot* cannot be placed on this boot's
timeline (wall time is not trusted); they are kept for display but no longer count for
cooldown or budget. That is safe because a new boot is itself inside ``startup_grace``
(the node just started). The circuit and the restarts-in-a-row count persist across boots:
a human is needed until the tunnel is healthy again. A timed pause ends with the boot.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edgeheal.model import CheckStatus, Snapshot, State

if TYPE_CHECKING:
    from edgeheal.config import Config, RemediationSettings

log = logging.getLogger(__name__)

WINDOW = 3600.0
"""The sliding window of ``max_per_hour``, seconds."""
KEEP = 50
"""History entries kept (the newest); older ones cannot matter to any window."""
HISTORY_FILE = "remediation-history.json"
FAILED_REASONS = frozenset({"stalled", "dead", "never_connected", "no_peers",
                            "interface_missing"})
"""WireGuard reasons that mean the tunnel carries nothing: the restart rung. ``no_peers``
and ``interface_missing`` are Flannel's own state gone wrong (it lost the peers or the
device it manages): exactly what a restart rebuilds from the cluster's data."""
DEGRADED_REASONS = frozenset({"rekey_failing"})

ActionKind = Literal["restart", "skip", "watch", "open_circuit", "close_circuit"]
Result = Literal["recovered", "not_recovered", "failed", "config_problem", "dry_run",
                 "in_progress", "interrupted"]
"""``in_progress`` is persisted *before* the remedy runs, so an agent killed mid-restart
still counts the attempt (cooldown, budget, circuit); it reads back as ``interrupted``."""
CURED: frozenset[str] = frozenset({"recovered"})


class HistoryError(Exception):
    """The persisted history could not be read or written (named file, never fatal)."""


@dataclass(frozen=True, slots=True)
class Action:
    """What the policy wants done now. ``reason`` is a short code; ``message`` is for people."""

    kind: ActionKind
    reason: str
    message: str = ""
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    """One restart attempt. ``mono`` is on the current process's monotonic timeline, or
    None for entries of an earlier boot (display only; see the module docstring)."""

    mono: float | None
    wall: str
    mode: str
    reason: str
    result: str
    duration: float
    target: str = ""
    action: str = "restart"

    def to_json(self) -> dict[str, Any]:
        return {"time": self.wall, "action": self.action, "mode": self.mode,
                "reason": self.reason, "result": self.result,
                "duration_seconds": round(self.duration, 3), "target": self.target}


@dataclass(frozen=True, slots=True)
class History:
    records: tuple[Record, ...] = ()
    failures_in_row: int = 0
    """Restarts in a row that did not cure the tunnel (reset when it is healthy)."""
    circuit_open: bool = False
    paused_until: float | None = None
    """Monotonic end of an operator pause; ``math.inf`` for an indefinite one."""

    def restarts_within(self, now: float, window: float = WINDOW) -> list[Record]:
        """Restart attempts (dry runs included) in ``(now - window, now]`` on this boot."""
        return [r for r in self.records if r.mono is not None and now - r.mono < window]

    def last_restart(self) -> Record | None:
        dated = [r for r in self.records if r.mono is not None]
        return max(dated, key=lambda r: r.mono or 0.0) if dated else None

    def paused(self, now: float) -> bool:
        return self.paused_until is not None and now < self.paused_until

    # --- pure updates -------------------------------------------------------------------

    def with_record(self, record: Record) -> History:
        """Add a restart attempt; a real attempt that did not cure counts toward the circuit.
        An ``in_progress`` attempt counts as not cured until :meth:`finished` says so (if it
        cured, the healthy tunnel clears the streak anyway)."""
        in_row = self.failures_in_row
        if record.result in CURED:
            in_row = 0
        elif record.result != "dry_run":
            in_row += 1
        return replace(self, records=(*self.records, record)[-KEEP:], failures_in_row=in_row)

    def finished(self, record: Record) -> History:
        """Replace the ``in_progress`` attempt started at ``record.mono`` by its outcome."""
        for i in range(len(self.records) - 1, -1, -1):
            old = self.records[i]
            if old.result == "in_progress" and old.mono == record.mono:
                records = (*self.records[:i], record, *self.records[i + 1:])
                in_row = 0 if record.result in CURED else self.failures_in_row
                return replace(self, records=records, failures_in_row=in_row)
        return self.with_record(record)

    def opened(self) -> History:
        return replace(self, circuit_open=True)

    def closed(self) -> History:
        """The tunnel is healthy again, or an operator reset: circuit closed, streak cleared."""
        return replace(self, circuit_open=False, failures_in_row=0)

    def paused_for(self, now: float, seconds: float | None) -> History:
        return replace(self, paused_until=math.inf if seconds is None else now + seconds)

    def resumed(self) -> History:
        return replace(self, paused_until=None)


@dataclass(frozen=True, slots=True)
class TunnelView:
    """What the policy reads from the snapshot: only states and reasons (pure input)."""

    mode: str
    """The resolved remedy: ``pod``, ``k3s-service`` or ``none``."""
    wireguard: State | None = None
    """The ``wireguard`` check's effective state; None when absent or not run yet."""
    wireguard_reason: str = ""
    tunnel_mqtt: Mapping[str, State] = field(default_factory=dict)
    direct_mqtt: Mapping[str, State] = field(default_factory=dict)
    offload: State | None = None
    offload_reason: str = ""
    started_mono: float = 0.0
    """When the agent started (monotonic)."""
    booted_mono: float = -math.inf
    """When the node booted, on the monotonic timeline (``now - CLOCK_BOOTTIME``)."""
    direct_ok_since: float = -math.inf
    """Since when every direct-path target has been ok (monotonic; -inf: no target)."""

    @property
    def healthy(self) -> bool:
        """WireGuard ok (when watched) and no tunnel-path target failing, with evidence."""
        if self.wireguard is None and not self.tunnel_mqtt:
            return False
        if self.wireguard is not None and self.wireguard is not State.OK:
            return False
        return all(s.serving for s in self.tunnel_mqtt.values())

    @property
    def degraded(self) -> bool:
        return self.wireguard is State.DEGRADED and self.wireguard_reason in DEGRADED_REASONS

    def failure(self) -> str | None:
        """The reason the tunnel counts as failed (a restart rung), or None."""
        if self.wireguard is State.FAILED and self.wireguard_reason in FAILED_REASONS:
            return f"wireguard_{self.wireguard_reason}"
        failing = [n for n, s in self.tunnel_mqtt.items() if s is State.FAILED]
        if failing and self.direct_mqtt and all(s is State.OK
                                                for s in self.direct_mqtt.values()):
            return "tunnel_mqtt_failed"
        return None

    @property
    def direct_down(self) -> bool:
        """A direct-path target is failing or unknown: the uplink or the cloud is down."""
        return any(not s.serving for s in self.direct_mqtt.values())


def view_of(snapshot: Snapshot, config: Config, *, mode: str,
            booted_mono: float = -math.inf, direct_was_down: bool = True) -> TunnelView:
    """Project a snapshot onto what the policy reads (pure). ``direct_was_down``: the
    direct path has failed at some point since the agent started; until then its first
    ``ok`` is the agent starting, not the uplink coming back, and ``uplink_settle`` does not
    apply (startup is ``startup_grace``'s business)."""
    def state(name: str) -> CheckStatus | None:
        status = snapshot.checks.get(name)
        return status if status is not None and status.completed else None

    wg, off = state("wireguard"), state("offload")
    tunnel: dict[str, State] = {}
    direct: dict[str, State] = {}
    for target in config.mqtt.targets:
        status = state(target.name)
        if status is not None:
            (tunnel if target.path == "tunnel" else direct)[target.name] = status.state
    direct_since = [snapshot.checks[n].since_mono for n in direct if direct[n] is State.OK]
    return TunnelView(
        direct_ok_since=max(direct_since) if direct_was_down and direct_since and len(
            direct_since) == len(direct) else -math.inf,
        mode=mode,
        wireguard=wg.state if wg else None, wireguard_reason=wg.reason if wg else "",
        tunnel_mqtt=tunnel, direct_mqtt=direct,
        offload=off.state if off else None, offload_reason=off.reason if off else "",
        started_mono=snapshot.started_mono, booted_mono=booted_mono)


def decide(view: TunnelView, history: History, now: float,
           settings: RemediationSettings) -> list[Action]:
    """The decision. Pure: same inputs, same answer; no I/O, no clock."""
    if view.healthy:
        if history.circuit_open or history.failures_in_row:
            return [Action("close_circuit", "tunnel_healthy",
                           "the tunnel is healthy again: circuit closed, streak cleared")]
        return []
    failure = view.failure()
    if failure is None:
        if view.degraded:
            offload = (f"offload {view.offload.value} ({view.offload_reason})"
                       if view.offload is not None else "offload not watched")
            return [Action("watch", view.wireguard_reason,
                           f"tunnel degraded ({view.wireguard_reason}): no restart; {offload}")]
        return []
    if history.paused(now):
        until = ("until resumed" if history.paused_until == math.inf
                 else f"for {history.paused_until - now:.0f}s more"  # type: ignore[operator]
                 )
        return [Action("skip", "paused", f"{failure}: remediation paused {until}")]
    if history.circuit_open:
        return [Action("skip", "circuit_open",
                       f"{failure}: circuit open after {history.failures_in_row} restarts "
                       "that did not cure; a human is needed")]
    if view.direct_down:
        down = ", ".join(f"{n}={s.value}" for n, s in view.direct_mqtt.items()
                         if not s.serving)
        return [Action("skip", "direct_path_down",
                       f"{failure}, but the direct path fails too ({down}): uplink or cloud "
                       "outage, a restart cannot help")]
    settle_end = view.direct_ok_since + settings.uplink_settle
    if now < settle_end:
        return [Action("skip", "uplink_settling",
                       f"{failure}: the direct path came back {now - view.direct_ok_since:.0f}s "
                       f"ago; the tunnel gets {settings.uplink_settle:g}s to recover by itself")]
    if view.mode not in ("pod", "k3s-service"):
        return [Action("skip", "mode_none", f"{failure}: no remedy on this node (alert only)")]
    if history.failures_in_row >= settings.give_up_after:
        return [Action("open_circuit", failure,
                       f"{failure}: {history.failures_in_row} restarts in a row did not cure "
                       "it; no more restarts until the tunnel is healthy or a reset")]
    grace_end = max(view.started_mono, view.booted_mono) + settings.startup_grace
    if now < grace_end:
        return [Action("skip", "startup_grace",
                       f"{failure}: within startup grace ({grace_end - now:.0f}s left)")]
    last = history.last_restart()
    if last is not None and last.mono is not None and now - last.mono < settings.cooldown:
        return [Action("skip", "cooldown",
                       f"{failure}: cooldown ({settings.cooldown - (now - last.mono):.0f}s "
                       "left)")]
    recent = history.restarts_within(now)
    if len(recent) >= settings.max_per_hour:
        oldest = min(r.mono for r in recent if r.mono is not None)
        return [Action("skip", "budget_exhausted",
                       f"{failure}: {len(recent)} restarts in the last hour (max "
                       f"{settings.max_per_hour}); next in {WINDOW - (now - oldest):.0f}s")]
    verb = "would restart" if settings.dry_run else "restart"
    return [Action("restart", failure, f"{failure}: {verb} Flannel ({view.mode})",
                   dry_run=settings.dry_run)]


def budget_left(history: History, now: float, settings: RemediationSettings) -> int:
    return max(0, settings.max_per_hour - len(history.restarts_within(now)))


# --- persistence ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Timeline:
    """The boot this process runs in, and the offset from monotonic to boottime."""

    boot_id: str
    offset: float
    """``CLOCK_BOOTTIME - clock()`` measured once at start."""

    def to_boot(self, mono: float) -> float:
        return mono + self.offset

    def to_mono(self, boottime: float) -> float:
        return boottime - self.offset


def save(path: Path, history: History, timeline: Timeline) -> None:
    """Write the history atomically (temp file, fsync, rename); raise HistoryError."""
    def boot(mono: float | None) -> float | None:
        return None if mono is None else timeline.to_boot(mono)

    paused: float | str | None = None
    if history.paused_until == math.inf:
        paused = "indefinite"
    elif history.paused_until is not None:
        paused = timeline.to_boot(history.paused_until)
    data = {
        "version": 1, "boot_id": timeline.boot_id,
        "failures_in_row": history.failures_in_row, "circuit_open": history.circuit_open,
        "paused_until_boottime": paused,
        "records": [{"boottime": boot(r.mono), "wall": r.wall, "mode": r.mode,
                     "reason": r.reason, "result": r.result, "duration": r.duration,
                     "target": r.target, "action": r.action} for r in history.records],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as err:
        raise HistoryError(f"cannot write remediation history {path}: {err.strerror}") \
            from err


def load(path: Path, timeline: Timeline) -> History:
    """Read the history; a missing file is an empty history; raise HistoryError if corrupt."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return History()
    except (OSError, ValueError) as err:
        raise HistoryError(f"cannot read remediation history {path}: {err}") from err
    try:
        same_boot = data["boot_id"] == timeline.boot_id
        records = []
        for r in data["records"]:
            boottime = r["boottime"]
            mono = (timeline.to_mono(float(boottime))
                    if same_boot and boottime is not None else None)
            result = str(r["result"])
            records.append(Record(mono=mono, wall=str(r["wall"]), mode=str(r["mode"]),
                                  reason=str(r["reason"]),
                                  result="interrupted" if result == "in_progress" else result,
                                  duration=float(r["duration"]), target=str(r["target"]),
                                  action=str(r.get("action", "restart"))))
        raw_pause = data["paused_until_boottime"]
        paused: float | None = None
        if raw_pause == "indefinite":
            paused = math.inf
        elif raw_pause is not None and same_boot:
            paused = timeline.to_mono(float(raw_pause))
        return History(records=tuple(records[-KEEP:]),
                       failures_in_row=int(data["failures_in_row"]),
                       circuit_open=bool(data["circuit_open"]), paused_until=paused)
    except (KeyError, TypeError, ValueError) as err:
        raise HistoryError(f"remediation history {path} is malformed ({err!r}); "
                           "delete it to start afresh") from err
