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
``edgeheal_offload_corrections_total{interface,cause}``, logged as a warning and emitted as
an ``offload.drift_corrected`` event.

Re-enumeration renames (the rename race): a NIC that is hot-plugged appears under the
kernel's name (``eth0``) and udev renames it (``ens4``) tens of milliseconds later -- often
between our "turn off" and the read-back. So the enforcer follows interfaces by **ifindex**,
not by name: an ioctl that fails with "no such interface" is retried under the name the
same ifindex has now (the correction is reported under that name, never dropped); an
``RTM_NEWLINK`` whose ifindex we know under another name moves that interface's state,
gauges, counters and pending drift to the new name (nothing stays under the temporary
name); and a correction made on a link event is *recorded* (counted, logged, emitted)
``settle`` seconds later, under the name the interface has by then, so the alert names the
final interface. The ioctl itself is never delayed.

Per interface and feature, the pure :func:`classify` gives one :class:`Outcome`:

===============  ====================================================================
``changed``      was on, now off
``already-off``  off and changeable: nothing to do
``fixed-off``    off and not changeable: fine
``fixed-on``     on and not changeable: this NIC cannot be switched to software checksums
``not-present``  the kernel reports no such feature for this interface: counts as off
``on``           on and changeable, left alone (``--dry-run``, ``enforce = false``, status)
``refused``      we asked for off, the driver accepted, but it still reads back on
===============  ====================================================================

The ioctls run on one worker thread, so the event loop never blocks on a driver that
resets its hardware to change a feature; passes are serialized by a lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import functools
import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from edgeheal.base.ifglob import matches as names_match
from edgeheal.base.ifglob import matching as names_matching
from edgeheal.boundaries.kernel.ethtool import (
    EthtoolError,
    Feature,
    FeatureSource,
    NoSuchInterface,
    PermissionDenied,
    Unsupported,
)
from edgeheal.model import Event

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("edgeheal.enforce")  # the name operators grep for

T = TypeVar("T")
Cause = Literal["boot", "link_event", "recheck"]
DRIFT_EVENT = "offload.drift_corrected"
SETTLE = 0.5
"""Seconds a link-event correction waits to be recorded (see the module doc)."""


class Outcome(enum.Enum):
    CHANGED = "changed"
    ALREADY_OFF = "already-off"
    FIXED_OFF = "fixed-off"
    FIXED_ON = "fixed-on"
    NOT_PRESENT = "not-present"
    ON = "on"
    REFUSED = "refused"

    @property
    def off(self) -> bool:
        """The feature is off (or absent) after the pass: the desired state holds."""
        return self in _OFF


_OFF = frozenset({Outcome.CHANGED, Outcome.ALREADY_OFF, Outcome.FIXED_OFF, Outcome.NOT_PRESENT})


def classify(before: Feature | None, after: Feature | None = None) -> Outcome:
    """The result for one interface and feature. ``before`` is the feature as read
    (None: the kernel reports no such feature); ``after`` is the read-back after we asked
    for "off" (None: we did not ask)."""
    if before is None:
        return Outcome.NOT_PRESENT
    if before.fixed:
        return Outcome.FIXED_ON if before.on else Outcome.FIXED_OFF
    if not before.on:
        return Outcome.ALREADY_OFF
    if after is None:
        return Outcome.ON
    return Outcome.REFUSED if after.on else Outcome.CHANGED


def to_disable(features: Mapping[str, Feature], wanted: Iterable[str]) -> list[str]:
    """The configured features that are on and changeable (what a pass switches off)."""
    return [n for n in wanted if (f := features.get(n)) is not None and f.on and not f.fixed]


def select(present: Iterable[str], patterns: Iterable[str]) -> tuple[list[str], list[str]]:
    """(present interfaces matching any pattern, sorted; patterns matching none)."""
    names, pats = sorted(set(present)), tuple(patterns)
    matched = names_matching(names, pats)
    unmatched = [p for p in pats if not names_matching(names, (p,))]
    return matched, unmatched


@dataclass(frozen=True, slots=True)
class FeatureResult:
    feature: str
    outcome: Outcome
    before: Feature | None
    after: Feature | None = None


@dataclass(frozen=True, slots=True)
class InterfaceReport:
    interface: str
    results: tuple[FeatureResult, ...] = ()
    error: Literal["", "permission_denied", "error"] = ""
    message: str = ""
    ifindex: int = 0
    """The kernel's index of the interface (0: the source cannot tell)."""

    @property
    def all_off(self) -> bool:
        return not self.error and all(r.outcome.off for r in self.results)

    @property
    def changed(self) -> list[str]:
        return [r.feature for r in self.results if r.outcome is Outcome.CHANGED]


@dataclass(frozen=True, slots=True)
class Report:
    """One pass over the matching interfaces."""

    interfaces: tuple[InterfaceReport, ...] = ()
    unmatched: tuple[str, ...] = ()
    """Configured names/globs that matched no present interface."""
    act: bool = True

    @property
    def all_off(self) -> bool:
        return all(i.all_off for i in self.interfaces)

    @property
    def permission_denied(self) -> bool:
        return any(i.error == "permission_denied" for i in self.interfaces)

    def outcomes(self, *which: Outcome) -> list[tuple[str, FeatureResult]]:
        return [(i.interface, r) for i in self.interfaces for r in i.results
                if r.outcome in which]


FOLLOW = 3
"""How many renames one reconcile follows before it gives up on an interface."""


def index_of(source: FeatureSource, ifname: str) -> int:
    """The ifindex of ``ifname`` if ``source`` can tell (optional ``index`` method), else 0."""
    lookup = getattr(source, "index", None)
    return (lookup(ifname) or 0) if lookup is not None else 0


def name_of(source: FeatureSource, ifindex: int) -> str | None:
    """The name interface ``ifindex`` has now, if ``source`` can tell; None if it is gone."""
    lookup = getattr(source, "name", None)
    return lookup(ifindex) if (lookup is not None and ifindex) else None


class _Gone(Exception):
    """The interface vanished (not renamed) in the middle of a reconcile."""


class _Follower:
    """Runs ioctls on one interface by name, following renames of its ifindex."""

    def __init__(self, source: FeatureSource, ifname: str) -> None:
        self.source, self.ifname = source, ifname
        self.ifindex = index_of(source, ifname)
        self.follows = 0

    def run(self, step: Callable[[str], T]) -> T:
        """``step(name)``; on "no such interface", again under the ifindex's new name."""
        while True:
            try:
                return step(self.ifname)
            except NoSuchInterface as err:
                new = name_of(self.source, self.ifindex)
                if new is None or new == self.ifname or self.follows >= FOLLOW:
                    raise _Gone from err
                log.info("%s was renamed %s while being reconciled; following it "
                         "(ifindex %d)", self.ifname, new, self.ifindex,
                         extra={"interface": new, "renamed_from": self.ifname})
                self.follows += 1
                self.ifname = new

    def read_back(self, ifname: str) -> Mapping[str, Feature]:
        features = self.source.features(ifname)
        if self.ifindex and index_of(self.source, ifname) not in (self.ifindex, 0):
            raise NoSuchInterface(f"{ifname}: another interface now", interface=ifname)
        return features


def reconcile_interface(source: FeatureSource, ifname: str, wanted: tuple[str, ...], *,
                        act: bool) -> InterfaceReport | None:
    """Read, (turn off,) read back and classify one interface; None if it is gone.

    A rename in the middle (udev renaming a re-enumerated NIC) is followed by ifindex: the
    step that failed is repeated under the new name and the report carries that name."""
    it = _Follower(source, ifname)
    try:
        try:
            before = it.run(source.features)
        except Unsupported as err:
            log.debug("%s", err, extra={"interface": it.ifname})
            before = {}
        except EthtoolError as err:
            return InterfaceReport(it.ifname, error="error", message=str(err),
                                   ifindex=it.ifindex)
        off = to_disable(before, wanted)
        after: Mapping[str, Feature] | None = None
        if act and off:
            try:
                it.run(lambda name: source.disable(name, off))
                after = it.run(it.read_back)
            except EthtoolError as err:
                return InterfaceReport(
                    it.ifname, tuple(FeatureResult(n, classify(before.get(n)), before.get(n))
                                     for n in wanted),
                    error="permission_denied" if isinstance(err, PermissionDenied) else "error",
                    message=str(err), ifindex=it.ifindex)
    except _Gone:
        log.debug("%s vanished while being reconciled", it.ifname,
                  extra={"interface": it.ifname})
        return None
    results = []
    for name in wanted:
        b = before.get(name)
        a = after.get(name) if (after is not None and name in off) else None
        if a is None and after is not None and name in off:
            a = Feature(name, False, False)  # gone after the change: it is not on
        results.append(FeatureResult(name, classify(b, a), b, a))
    return InterfaceReport(it.ifname, tuple(results), ifindex=it.ifindex)


def apply(source: FeatureSource, patterns: tuple[str, ...], wanted: tuple[str, ...], *,
          act: bool, only: str | None = None) -> Report:
    """One pass over the present interfaces matching ``patterns`` (or just ``only``)."""
    present = source.interfaces()
    if only is not None:
        present = [n for n in present if n == only]
    matched, unmatched = select(present, patterns)
    reports = [r for n in matched
               if (r := reconcile_interface(source, n, wanted, act=act)) is not None]
    return Report(tuple(reports), tuple(unmatched) if only is None else (), act)


@dataclass(frozen=True, slots=True)
class Correction:
    interface: str
    features: tuple[str, ...]
    cause: Cause
    drift: bool
    ifindex: int = 0


CAUSES: tuple[Cause, ...] = ("boot", "link_event", "recheck")


class Metrics:
    """``edgeheal_offload_feature_enabled`` and ``edgeheal_offload_corrections_total``.

    The corrections of an interface exist at 0 for every cause from the pass that first
    finds it (the interface is not known before: the configuration holds globs), so
    ``increase()`` sees its first correction; a rename moves them with the counts."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge  # noqa: PLC0415

        self.enabled = Gauge(
            "edgeheal_offload_feature_enabled",
            "1 while a configured offload feature is on for a matching interface, else 0.",
            ["interface", "feature"], registry=registry)
        self.corrections = Counter(
            "edgeheal_offload_corrections_total",
            "Offload features switched back off, by interface and cause "
            "(boot, link_event, recheck).", ["interface", "cause"], registry=registry)
        self._series: dict[tuple[str, str], int] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._known: set[str] = set()
        """Interfaces whose corrections exist (at 0 at least)."""

    def _know(self, interface: str) -> None:
        if interface not in self._known:
            self._known.add(interface)
            for cause in CAUSES:
                self.corrections.labels(interface, cause)

    def publish(self, report: InterfaceReport) -> None:
        self._know(report.interface)
        for r in report.results:
            state = r.after if r.after is not None else r.before
            if state is None:
                self._drop((report.interface, r.feature))
                continue
            self._set((report.interface, r.feature), 1 if state.on else 0)

    def corrected(self, interface: str, cause: Cause) -> None:
        self._know(interface)
        self.corrections.labels(interface, cause).inc()
        self._counts[(interface, cause)] = self._counts.get((interface, cause), 0) + 1

    def rename(self, old: str, new: str) -> None:
        """Move every series of interface ``old`` to ``new`` (a udev rename)."""
        for key in [k for k in self._series if k[0] == old]:
            value = self._series[key]
            self._drop(key)
            self._set((new, key[1]), value)
        for key in [k for k in self._counts if k[0] == old]:
            count = self._counts.pop(key)
            self.corrections.remove(*key)
            self.corrections.labels(new, key[1]).inc(count)
            self._counts[(new, key[1])] = self._counts.get((new, key[1]), 0) + count
        if old in self._known:
            self._known.discard(old)
            for cause in CAUSES:
                self.corrections.remove(old, cause)
            self._know(new)

    def forget(self, interface: str) -> None:
        for key in [k for k in self._series if k[0] == interface]:
            self._drop(key)

    def _set(self, key: tuple[str, str], value: int) -> None:
        self.enabled.labels(*key).set(value)
        self._series[key] = value

    def _drop(self, key: tuple[str, str]) -> None:
        if self._series.pop(key, None) is not None:
            self.enabled.remove(*key)


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
        handle: asyncio.TimerHandle

        def due() -> None:
            self._timers.discard(handle)
            self._settled(1)

        handle = loop.call_later(self.settle, due)
        self._timers.add(handle)

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
        from edgeheal.boundaries.kernel.link_events import DELLINK, LinkListener  # noqa: PLC0415

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
        self._settled(len(self._state.settling))  # nothing made is left unrecorded
        self._executor.shutdown(wait=False, cancel_futures=True)
        source, self._source = self._source, None
        closer = getattr(source, "close", None)
        if closer is not None:
            closer()


def problem_text(iface: InterfaceReport, feature: str, problem: str) -> str:
    if problem == "fixed-on":
        return (f"{iface.interface}: {feature} is on and fixed: this NIC's driver does not "
                "allow turning TX checksum offload off, so it cannot be switched to "
                "software checksums (use another NIC or driver for the tunnel's uplink)")
    if problem == "refused":
        return (f"{iface.interface}: asked the driver to turn {feature} off, but it still "
                "reads back on")
    return iface.message or f"{iface.interface}: {problem}"


def _real_source() -> FeatureSource:
    from edgeheal.boundaries.kernel.ethtool import Ethtool  # noqa: PLC0415

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
    from pyroute2 import netns  # noqa: PLC0415

    netns.setns(name, flags=0, fork=False)


def report_detail(report: Report) -> dict[str, Any]:
    """JSON-ready view of a pass for /status: {interface: {feature: outcome}}."""
    out: dict[str, Any] = {
        "interfaces": {i.interface: ({r.feature: r.outcome.value for r in i.results}
                                     | ({"error": i.message} if i.error else {}))
                       for i in report.interfaces}}
    if report.unmatched:
        out["unmatched"] = list(report.unmatched)
    return out
