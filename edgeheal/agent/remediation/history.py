"""The persisted remediation history: every piece of state a decision reads, on disk.

Why persisted: the policy's safeguards (cooldown, ``max_per_hour``, the circuit, a pause,
the uplink-settle flag) are only safeguards if an agent that is killed and restarted — by
systemd, the OOM killer, an operator, a crash loop — still sees them. So the whole
:class:`~edgeheal.core.flannel_ladder.History` is written after every change (JSON, temp file,
fsync, rename, fsync of the directory: a crash or a power cut leaves the old file or the
new one, never half of one, and the new one once a save returned), and the actor reads it
back on start; the temporary file of a save a power cut interrupted is removed then.

**Time, and why history survives restarts and clock steps.** The actor works on the
monotonic clock. Each entry is stored with its *CLOCK_BOOTTIME* reading plus the boot id
(``/proc/sys/kernel/random/boot_id``); the wall time is stored for humans only. On load,
entries of the *same boot* are mapped onto the new process's monotonic timeline through
the boottime offset (:class:`Timeline`), so an agent killed and restarted in a loop still
sees its earlier restarts and cannot exceed ``max_per_hour``, and a wall-clock step (NTP,
an RTC without battery, a 4G modem's time) changes nothing. CLOCK_BOOTTIME rather than
CLOCK_MONOTONIC because it keeps counting through suspend, so "an hour ago" stays true.
Entries of an *earlier boot* cannot be placed on this boot's timeline (wall time is not
trusted); they are kept for display but no longer count for cooldown or budget. That is
safe because a new boot is itself inside ``startup_grace`` (the node just started). The
circuit and the restarts-in-a-row count persist across boots: a human is needed until the
tunnel is healthy again. A timed pause and the uplink-settle flag (the direct path has had
an outage) end with the boot; an indefinite pause does not.

Each ladder has its own file (``remediation-history.json`` for Flannel's,
``uplink-history.json`` for the uplink's) in the same format.

**Off the event loop.** A save waits for fsync, which a slow SD card can stretch to
seconds, and the loop that calls it also answers ``/readyz``. So :class:`Store` writes on
its own thread (:class:`edgeheal.base.writer.Writer`): :meth:`Store.save` queues the write
(in order: the newest history is what is left on disk) and :meth:`Store.written` is awaited
where the caller must know it is on disk — the attempt is persisted *before* a remedy runs,
so ``kill -9`` mid-rung still counts it. Without a running loop a save is done on return.

A file that cannot be read or is not what :func:`save` writes (too large, nested too deep,
a count that is not a small integer: :mod:`edgeheal.base.statefile` bounds it) is moved aside
(``.corrupt-<time>``) and the actor starts with an empty history: losing the history must
never stop the monitoring. :class:`HistoryError` names the file; it is logged once, never
fatal, and :attr:`Store.reset` says so for the ``agent.state_reset`` alert.

**Format.** The file carries ``"format":`` :data:`FORMAT`; release 0.2.0 wrote none (its
``"version": 1`` was never read) and its files are format 1, read as they are and given the
field on the next save. A file of a newer format (a downgrade) is not read and never written:
:attr:`Store.newer` says so, the actor starts with an empty history kept in memory for this
run, and the file waits untouched for the release that wrote it
(:mod:`edgeheal.base.statefile`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from edgeheal.base import statefile
from edgeheal.base.statefile import Newer, NewerFormat, Reset, StateFileError
from edgeheal.base.writer import Writer
from edgeheal.core.safeguards import KEEP, History, Record

log = logging.getLogger("edgeheal.remediation.history")  # the name operators grep for

HISTORY_FILE = "remediation-history.json"
MAX_FAILURES_IN_ROW = 1_000_000
"""A restarts-in-a-row count beyond this is not one the agent wrote."""
FORMAT = 1
"""The history file's format (0.2.0's files carry none: the same format, 1)."""
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


class HistoryError(Exception):
    """The persisted history could not be read or written (named file, never fatal)."""


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def boot_id() -> str:
    try:
        return BOOT_ID_FILE.read_text(encoding="ascii").strip()
    except OSError:
        return "unknown"


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
    """Write the history atomically (temp file, fsync, rename, fsync of the directory:
    a power cut after the return leaves this history, not the one before); raise
    HistoryError."""
    def boot(mono: float | None) -> float | None:
        return None if mono is None else timeline.to_boot(mono)

    paused: float | str | None = None
    if history.paused_until == math.inf:
        paused = "indefinite"
    elif history.paused_until is not None:
        paused = timeline.to_boot(history.paused_until)
    data = {
        "format": FORMAT, "boot_id": timeline.boot_id,
        "failures_in_row": history.failures_in_row, "circuit_open": history.circuit_open,
        "paused_until_boottime": paused,
        "direct_was_down": history.direct_was_down,
        "jitter_until_boottime": boot(history.jitter_until),
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
            statefile.fsync_dir(path.parent)  # the rename itself, before "it is on disk"
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as err:
        raise HistoryError(f"cannot write remediation history {path}: {err.strerror}") \
            from err


def load(path: Path, timeline: Timeline) -> History:
    """Read the history; a missing file is an empty history; raise HistoryError if corrupt,
    :class:`NewerFormat` if it is of a newer format than :data:`FORMAT`."""
    try:
        data = statefile.read(path)
        if data is not None:
            statefile.format_of(data, what=path.name, known=FORMAT)
    except NewerFormat:
        raise
    except StateFileError as err:
        raise HistoryError(f"remediation history {err}") from err
    except OSError as err:
        raise HistoryError(f"cannot read remediation history {path}: {err}") from err
    if data is None:
        return History()
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
        raw_jitter = data.get("jitter_until_boottime")
        jitter = (timeline.to_mono(float(raw_jitter))
                  if raw_jitter is not None and same_boot else None)
        if jitter is not None and not math.isfinite(jitter):
            raise ValueError("jitter_until_boottime is not a finite time")
        failures = data["failures_in_row"]
        if type(failures) is not int or not 0 <= failures <= MAX_FAILURES_IN_ROW:
            raise ValueError(f"failures_in_row {str(failures)[:20]} is not a count")
        return History(records=tuple(records[-KEEP:]), failures_in_row=failures,
                       circuit_open=bool(data["circuit_open"]), paused_until=paused,
                       direct_was_down=same_boot and bool(data.get("direct_was_down")),
                       jitter_until=jitter)
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as err:
        raise HistoryError(f"remediation history {path} is malformed "
                           f"({str(err)[:120] or type(err).__name__})") from err


class Store:
    """The history file of one agent: load once (a corrupt file is moved aside), save on
    every change, off the loop (an error is logged; the in-memory history stays
    authoritative)."""

    def __init__(self, state_dir: str | os.PathLike[str], timeline: Timeline, *,
                 name: str = HISTORY_FILE) -> None:
        self.path = Path(state_dir) / name
        self.timeline = timeline
        self._writer = Writer("edgeheal-history")
        self.reset: Reset | None = None
        """Set when :meth:`load` found a file it could not use (for ``agent.state_reset``)."""
        self.newer: Newer | None = None
        """Set when :meth:`load` found a file of a newer format: it is never written, the
        history is kept in memory (for ``agent.state_newer``)."""

    def load(self) -> History:
        swept = statefile.sweep_temporary(self.path)
        if swept:
            log.warning("remediation history: removed %d temporary file(s) a save "
                        "interrupted by a crash or power cut left in %s: %s", len(swept),
                        self.path.parent, ", ".join(swept))
        try:
            return load(self.path, self.timeline)
        except NewerFormat as err:
            self.newer = err.newer
            log.error("remediation history %s", err.newer.describe())
            return History()
        except HistoryError as err:
            aside = statefile.move_aside(self.path, time.time())
            cause = err.__cause__
            reason = cause.reason if isinstance(cause, StateFileError) else str(err)
            self.reset = Reset(self.path.name, reason, None if aside is None else aside.name)
            log.error("%s; %s, starting with an empty history", err,
                      f"moved aside to {aside}" if aside else "it could not be moved aside")
            return History()

    def save(self, history: History) -> None:
        """Queue the write (on a running loop; else write now); see :meth:`written`. Never
        for a file of a newer format (:attr:`newer`): that history stays in memory."""
        if self.newer is None:
            self._writer.post(self._write, history)

    async def written(self) -> None:
        """Wait until every save queued so far is on disk (or failed and was logged)."""
        await self._writer.run(lambda: None)

    def _write(self, history: History) -> None:
        try:
            save(self.path, history, self.timeline)
        except HistoryError as err:
            log.error("%s", err)
