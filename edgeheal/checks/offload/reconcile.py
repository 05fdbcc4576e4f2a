"""One reconcile pass: read, turn off, read back and classify the matching interfaces.

Why apart from the enforcer: the oneshot CLI (``edgeheal offload``) and the doctor run one
pass and exit (:func:`apply`); the long-running enforcer (:mod:`.enforcer`) runs the same
pass on its worker thread. This module does the ioctls, through a ``FeatureSource``, and
leaves the judging to :mod:`.plan`.

Re-enumeration renames (the rename race): a hot-plugged NIC appears under the kernel's name
(``eth0``) and udev renames it (``ens4``) tens of milliseconds later -- often between our
"turn off" and the read-back. So a pass follows an interface by **ifindex**, not by name: an
ioctl that fails with "no such interface" is retried under the name the same ifindex has now,
and the correction is reported under that name, never dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

from edgeheal.boundaries.kernel.ethtool import (
    EthtoolError,
    Feature,
    FeatureSource,
    NoSuchInterface,
    NotPermitted,
    Unsupported,
)
from edgeheal.checks.offload.plan import (
    FeatureResult,
    InterfaceReport,
    Report,
    classify,
    select,
    to_disable,
)

log = logging.getLogger("edgeheal.enforce")  # the name operators grep for

T = TypeVar("T")


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
                    error="permission_denied" if isinstance(err, NotPermitted) else "error",
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

