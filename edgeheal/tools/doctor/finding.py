"""The doctor's vocabulary: one :class:`Finding` per row of the table.

A finding says what was checked (``check``), the verdict (:class:`Result`), what was found
in plain words and, when the verdict is not ``ok``, how to fix it. ``skip`` means "does
not apply here" (no ``[kubernetes]`` section, no system bus) and always says why: it is
never a failure (the node_exporter lesson: not applicable is not failed).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class Result(enum.Enum):
    OK = "ok"
    WARN = "warn"
    """Works now, but a condition that the field has seen fail (no keepalive, no NTP)."""
    FAIL = "fail"
    """The node is not set up to stay connected: ``edgeheal doctor`` exits 1."""
    SKIP = "skip"
    """Does not apply on this node; ``found`` says why."""


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    """Dotted name of the check (``mtu``, ``wireguard.keepalive``)."""
    result: Result
    found: str
    """What was found, in plain words; never a secret."""
    fix: str = ""
    """How to fix it (empty when ``ok`` or ``skip``)."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """Machine-readable facts for ``--json`` (numbers, names)."""

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "result": self.result.value, "found": self.found,
                "fix": self.fix, "detail": dict(self.detail)}


def ok(check: str, found: str, **detail: Any) -> Finding:
    return Finding(check, Result.OK, found, "", detail)


def warn(check: str, found: str, fix: str, **detail: Any) -> Finding:
    return Finding(check, Result.WARN, found, fix, detail)


def fail(check: str, found: str, fix: str, **detail: Any) -> Finding:
    return Finding(check, Result.FAIL, found, fix, detail)


def skip(check: str, why: str, **detail: Any) -> Finding:
    return Finding(check, Result.SKIP, why, "", detail)
