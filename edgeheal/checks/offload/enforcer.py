"""The checksum-offload reconciler: desired state "off", re-applied whenever it drifts.

Why: in the field incident a 4G NIC computed TX checksums in hardware, and after Flannel's
WireGuard encapsulation they were wrong, so the cloud gateway dropped the node's rekey
packets and the tunnel died for minutes at a time. Turning TX checksum offload off (the
kernel then checksums in software) cures it -- but only while it stays off, and a USB
modem that re-enumerates comes back as a *new* interface with offload on. So this is a
reconciler, not a remediation: it acts on its own, at once, outside the remediation budget
and ``remediation.mode``, on three occasions (the ``cause`` label):

- ``boot``: the first pass of this process (the oneshot unit, or the agent starting);
- ``link_event``: an rtnetlink ``RTM_NEWLINK`` for a matching interface (it appeared, was
  re-created, or its features changed), acted on immediately
  (:mod:`edgeheal.boundaries.kernel.link_events`);
- ``recheck``: the ``offload`` check's interval, a safety net for a missed event.

Every correction after the first pass is *drift*: counted in
``edgeheal_offload_corrections_total{interface,cause}`` (:mod:`.metrics`), logged as a
warning and emitted as an ``offload.drift_corrected`` event.

Re-enumeration renames (the rename race): a NIC that is hot-plugged appears under the
kernel's name (``eth0``) and udev renames it (``ens4``) tens of milliseconds later. One pass
follows the ifindex through a rename (:mod:`.reconcile`); across passes, an
``RTM_NEWLINK`` whose ifindex we know under another name moves that interface's state,
gauges, counters and pending drift to the new name (nothing stays under the temporary
name); and a correction made on a link event is *recorded* (counted, logged, emitted)
``settle`` seconds later, under the name the kernel gives its ifindex by then (an unread
rename event does not matter), so the alert names the final interface; where udev runs
and has not yet finished with the link (its database entry is written after the rename),
the record waits on, ``SETTLE_MAX`` at most: a busy box renames late. The ioctl is never
delayed.

The pass is split by job: the pure plan (:mod:`.plan`: which features to switch off, the
outcomes), one reconcile pass (:mod:`.reconcile`), the words for its results
(:mod:`.render`); this module is the long-running part, and still exports their names.
The ioctls run on one worker thread, so the event loop never blocks on a driver that
resets its hardware to change a feature; passes are serialized by a lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from edgeheal.base.ifglob import matches as names_match
from edgeheal.boundaries.kernel.ethtool import FeatureSource
from edgeheal.boundaries.kernel.link_events import udev_busy_with
from edgeheal.checks.offload.metrics import CAUSES, Cause, Metrics
from edgeheal.checks.offload.plan import (
    FeatureResult,
    InterfaceReport,
    Outcome,
    Report,
    classify,
    select,
    to_disable,
)
from edgeheal.checks.offload.reconcile import (
    FOLLOW,
    apply,
    index_of,
    name_of,
    reconcile_interface,
)
from edgeheal.checks.offload.render import problem_text, report_detail
from edgeheal.model import Event

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "CAUSES",
    "DRIFT_EVENT",
    "FOLLOW",
    "SETTLE",
    "Cause",
    "Correction",
    "Enforcer",
    "FeatureResult",
    "InterfaceReport",
    "Metrics",
    "Outcome",
    "Report",
    "apply",
    "classify",
    "index_of",
    "name_of",
    "problem_text",
    "reconcile_interface",
    "report_detail",
    "select",
    "to_disable",
]

log = logging.getLogger("edgeheal.enforce")  # the name operators grep for

DRIFT_EVENT = "offload.drift_corrected"
SETTLE = 0.5
"""Seconds a link-event correction waits to be recorded (see the module doc)."""
SETTLE_MAX = 10.0
"""Seconds it waits at most for udev to finish with the link (a busy box renames late)."""


@dataclass(frozen=True, slots=True)
class Correction:
    interface: str
    features: tuple[str, ...]
    cause: Cause
    drift: bool
    ifindex: int = 0


@dataclass
class _State:
    first_done: bool = False
    drift_total: int = 0
    pending_drift: list[Correction] = field(default_factory=list)
    bad: set[tuple[str, str, str]] = field(default_factory=set)
    interfaces: dict[str, InterfaceReport] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    """ifindex -> the name we last saw it under, for the interfaces in ``interfaces``."""
    settling: list[Correction] = field(default_factory=list)
    """Link-event corrections made but not yet recorded (see ``settle``)."""


class Enforcer:
    """Keeps the configured features off; run :meth:`serve` for link events and call
    :meth:`recheck` on the check's interval.

    ``netns`` (lab, tests, bench) runs every ioctl and the link listener inside that named
    network namespace; the agent leaves it None.

    ``settle``: seconds between correcting an interface on a link event and recording the
    correction, so a udev rename that follows a hot-plug is recorded under the final name.
    """

    def __init__(self, patterns: tuple[str, ...], features: tuple[str, ...], *,
                 enforce: bool = True, registry: CollectorRegistry | None = None,
                 emit: Callable[[Event], None] = lambda event: None,
                 source: Callable[[], FeatureSource] | None = None,
                 netns: str | None = None, settle: float = SETTLE) -> None:
        self.patterns, self.features, self.enforce = patterns, features, enforce
        self.settle = settle
        self._timers: set[asyncio.TimerHandle] = set()
        self._settling_tasks: set[asyncio.Task[None]] = set()
        self.metrics = Metrics(registry) if registry is not None else None
        self._emit = emit
        self._make_source = source or _real_source
        self._source: FeatureSource | None = None
        self._netns = netns
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="edgeheal-ethtool",
            initializer=functools.partial(_enter_netns, netns) if netns else None)
        self._lock = asyncio.Lock()
        self._state = _State()

    # --- passes -------------------------------------------------------------------------

    async def reconcile(self, cause: Cause, only: str | None = None, *,
                        defer: bool = False) -> Report:
        """One pass (all matching interfaces, or ``only``) on the worker thread.
        ``defer``: record drift corrections ``settle`` seconds later (link events)."""
        async with self._lock:
            if not self._state.first_done:
                cause, only, defer = "boot", None, False
            loop = asyncio.get_running_loop()
            report = await loop.run_in_executor(self._executor, self._pass, only)
            self._account(report, cause, partial=only is not None, defer=defer)
            return report

    def _pass(self, only: str | None) -> Report:
        if self._source is None:
            self._source = self._make_source()
        return apply(self._source, self.patterns, self.features, act=self.enforce, only=only)

    def _account(self, report: Report, cause: Cause, *, partial: bool,
                 defer: bool = False) -> None:
        st = self._state
        drift = st.first_done
        if not partial:
            for gone in set(st.interfaces) - {i.interface for i in report.interfaces}:
                self.forget(gone)
        for iface in report.interfaces:
            old = st.names.get(iface.ifindex) if iface.ifindex else None
            if old is not None and old != iface.interface:
                self.renamed(iface.ifindex, iface.interface)
            st.interfaces[iface.interface] = iface
            if iface.ifindex:
                st.names[iface.ifindex] = iface.interface
            if self.metrics is not None:
                self.metrics.publish(iface)
            self._log_problems(iface)
            if not iface.changed:
                continue
            fix = Correction(iface.interface, tuple(iface.changed), cause, drift,
                             iface.ifindex)
            if defer and drift and self.settle > 0:
                self._defer(fix)
            else:
                self._record(fix)
        for pattern in report.unmatched:
            log.debug("no interface matches %r", pattern, extra={"pattern": pattern})
        st.first_done = True

    def _record(self, fix: Correction) -> None:
        st = self._state
        if self.metrics is not None:
            self.metrics.corrected(fix.interface, fix.cause)
        if fix.drift:
            st.drift_total += 1
            st.pending_drift.append(fix)
            log.warning("offload drift on %s: %s was on again; turned off (%s)",
                        fix.interface, ", ".join(fix.features), fix.cause,
                        extra={"interface": fix.interface, "cause": fix.cause})
            self._emit_drift(fix)
        else:
            log.info("turned off %s on %s (%s)", ", ".join(fix.features), fix.interface,
                     fix.cause, extra={"interface": fix.interface, "cause": fix.cause})

    def _defer(self, fix: Correction) -> None:
        """Record ``fix`` after ``settle`` s, under the name its ifindex has by then."""
        self._state.settling.append(fix)
        loop = asyncio.get_running_loop()
        until = loop.time() + SETTLE_MAX
        handle: asyncio.TimerHandle

        def due() -> None:
            nonlocal handle
            self._timers.discard(handle)
            head = self._state.settling[0] if self._state.settling else None
            if (head is not None and head.ifindex and self._netns is None
                    and loop.time() < until and udev_busy_with(head.ifindex)):
                handle = loop.call_later(self.settle, due)  # udev has not renamed it yet
                self._timers.add(handle)
                return
            if head is not None and head.ifindex and self._source is not None:
                task = loop.create_task(self._settle_head(head.ifindex),
                                        name="edgeheal.offload.settle")
                self._settling_tasks.add(task)
                task.add_done_callback(self._settling_tasks.discard)
                return
            self._settled(1)

        handle = loop.call_later(self.settle, due)
        self._timers.add(handle)

    async def _settle_head(self, ifindex: int) -> None:
        """Record the oldest settling correction under the name the kernel gives its
        ifindex now: a rename whose link event we have not read yet (a busy box) is
        followed all the same."""
        source, loop = self._source, asyncio.get_running_loop()
        try:
            now = await loop.run_in_executor(self._executor, name_of, source, ifindex) \
                if source is not None else None
        except (OSError, RuntimeError):  # RuntimeError: the executor is shut down
            now = None
        if now:
            self.renamed(ifindex, now)
        self._settled(1)

    def _settled(self, count: int) -> None:
        """Record the ``count`` oldest settling corrections (they are due in order)."""
        st = self._state
        due, st.settling = st.settling[:count], st.settling[count:]
        for fix in due:
            self._record(fix)

    def renamed(self, ifindex: int, new: str) -> None:
        """Interface ``ifindex`` is now called ``new``: move what we hold under its old
        name (report, problems, gauges, counters, drift not yet reported or recorded).
        If ``new`` matches none of the patterns, forget the interface instead."""
        st = self._state
        old = st.names.get(ifindex)
        if old is None or old == new:
            return
        log.info("%s was renamed %s (ifindex %d)", old, new, ifindex,
                 extra={"interface": new, "renamed_from": old})
        del st.names[ifindex]
        report = st.interfaces.pop(old, None)
        st.bad = {(new, *k[1:]) if k[0] == old else k for k in st.bad}
        st.pending_drift = [replace(f, interface=new) if f.interface == old else f
                            for f in st.pending_drift]
        st.settling = [replace(f, interface=new) if f.ifindex == ifindex else f
                       for f in st.settling]
        if self.metrics is not None:
            self.metrics.rename(old, new)
        if report is not None:
            st.interfaces[new] = replace(report, interface=new)
            st.names[ifindex] = new
        if not names_match(new, self.patterns):
            self.forget(new)

    def _emit_drift(self, fix: Correction) -> None:
        self._emit(Event(DRIFT_EVENT,
                         f"TX checksum offload was on again on {fix.interface} "
                         f"({', '.join(fix.features)}); turned it off",
                         {"interface": fix.interface, "features": list(fix.features),
                          "cause": fix.cause}))

    def _log_problems(self, iface: InterfaceReport) -> None:
        """Warn once per (interface, feature, problem), not on every pass."""
        st = self._state
        now: set[tuple[str, str, str]] = set()
        if iface.error:
            now.add((iface.interface, "", iface.error))
        for r in iface.results:
            if r.outcome in (Outcome.FIXED_ON, Outcome.REFUSED):
                now.add((iface.interface, r.feature, r.outcome.value))
        mine = {k for k in st.bad if k[0] == iface.interface}
        for key in sorted(now - mine):
            log.warning("%s", problem_text(iface, key[1], key[2]),
                        extra={"interface": iface.interface})
        st.bad = (st.bad - mine) | now

    def forget(self, interface: str) -> None:
        self._state.interfaces.pop(interface, None)
        self._state.names = {i: n for i, n in self._state.names.items() if n != interface}
        self._state.bad = {k for k in self._state.bad if k[0] != interface}
        if self.metrics is not None:
            self.metrics.forget(interface)

    def take_drift(self) -> list[Correction]:
        """The drift corrections since the last call (the check reports them once)."""
        out, self._state.pending_drift = self._state.pending_drift, []
        return out

    @property
    def drift_total(self) -> int:
        return self._state.drift_total

    # --- link events --------------------------------------------------------------------

    async def serve(self) -> None:
        """Listen to link events and reconcile a matching interface at once. Runs until
        cancelled; a listener failure raises (the supervisor restarts us, and the restart
        re-reconciles everything, covering any lost event)."""
        from edgeheal.boundaries.kernel.link_events import DELLINK, LinkListener

        async with LinkListener(netns=self._netns) as links, \
                contextlib.aclosing(aiter(links)) as events:
            await self.reconcile("recheck")  # after bind: nothing slips between
            async for event, ifname, ifindex in events:
                if event == DELLINK:
                    if ifname in self._state.interfaces:
                        log.info("%s went away", ifname, extra={"interface": ifname})
                        self.forget(ifname)
                    continue
                if ifname and ifindex:
                    self.renamed(ifindex, ifname)
                if not ifname or not names_match(ifname, self.patterns):
                    continue
                await self.reconcile("link_event", only=ifname, defer=True)

    async def close(self) -> None:
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        for task in self._settling_tasks:
            task.cancel()
        self._settled(len(self._state.settling))  # nothing made is left unrecorded
        self._executor.shutdown(wait=False, cancel_futures=True)
        source, self._source = self._source, None
        closer = getattr(source, "close", None)
        if closer is not None:
            closer()


def _real_source() -> FeatureSource:
    from edgeheal.boundaries.kernel.ethtool import Ethtool

    class IndexedEthtool(Ethtool):
        """Ethtool plus name <-> ifindex (in the calling thread's network namespace)."""

        def index(self, ifname: str) -> int:
            try:
                return socket.if_nametoindex(ifname)
            except (OSError, ValueError):
                return 0

        def name(self, ifindex: int) -> str | None:
            try:
                return socket.if_indextoname(ifindex)
            except (OSError, ValueError):
                return None

    return IndexedEthtool()


def _enter_netns(name: str) -> None:
    """Executor initializer: move this worker thread (only) into network namespace ``name``."""
    from pyroute2 import netns

    netns.setns(name, flags=0, fork=False)
