"""The plan of a pass, pure: which features to switch off, and what each result means.

Why apart: the decisions are the part worth testing against recorded feature sets of real
drivers (tests/offload), with no kernel, no thread and no clock; the reconcile pass
(:mod:`.reconcile`) reads and writes the features, this module only judges them.

Per interface and feature, :func:`classify` gives one :class:`Outcome`:

===============  ====================================================================
``changed``      was on, now off
``already-off``  off and changeable: nothing to do
``fixed-off``    off and not changeable: fine
``fixed-on``     on and not changeable: this NIC cannot be switched to software checksums
``not-present``  the kernel reports no such feature for this interface: counts as off
``on``           on and changeable, left alone (``--dry-run``, ``enforce = false``, status)
``refused``      we asked for off, the driver accepted, but it still reads back on
===============  ====================================================================
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from edgeheal.base.ifglob import matching as names_matching
from edgeheal.boundaries.kernel.ethtool import Feature


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
