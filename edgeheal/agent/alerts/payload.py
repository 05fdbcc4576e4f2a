"""The alert payload: one JSON object per alert, as ``schemas/alert.schema.json`` defines.

Ids are ULIDs (48-bit milliseconds since the epoch + 80 random bits, Crockford base32,
26 characters): unique without coordination, and sortable by the moment they were raised.
Within one millisecond the random part is incremented, so ids from one agent sort in the
order they were raised even in a burst. ``time`` is when the alert was *raised* (RFC 3339,
UTC, milliseconds), never when it was sent: an alert that waited out an outage in the
outbox still says when the problem happened.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from edgeheal.agent.alerts.kinds import KINDS, severity
from edgeheal.model import Severity, rfc3339

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80


def _encode(value: int) -> str:
    out = []
    for _ in range(26):
        out.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(out))


class UlidFactory:
    """Monotonic ULIDs: strictly increasing for one factory, even within a millisecond."""

    def __init__(self) -> None:
        self._last_ms = -1
        self._last_rand = 0

    def __call__(self, moment: datetime) -> str:
        ms = int(moment.timestamp() * 1000)
        if ms <= self._last_ms:
            ms = self._last_ms
            rand = self._last_rand + 1
            if rand >> _RANDOM_BITS:  # 2**80 ids in one millisecond: move to the next one
                ms, rand = ms + 1, secrets.randbits(_RANDOM_BITS - 1)
        else:
            rand = secrets.randbits(_RANDOM_BITS - 1)  # headroom for increments
        self._last_ms, self._last_rand = ms, rand
        return _encode((ms << _RANDOM_BITS) | rand)


new_id = UlidFactory()


def ulid_time_ms(ulid: str) -> int:
    value = 0
    for char in ulid:
        value = value * 32 + _CROCKFORD.index(char)
    return value >> _RANDOM_BITS


@dataclass(frozen=True, slots=True)
class Alert:
    id: str
    node: str
    time: str
    severity: Severity
    kind: str
    correlation: str
    message: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    reminder: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", MappingProxyType(dict(self.detail)))

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "node": self.node, "time": self.time,
                "severity": self.severity, "kind": self.kind,
                "correlation": self.correlation, "message": self.message,
                "detail": dict(self.detail), "reminder": self.reminder}

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":"), default=str).encode()

    @classmethod
    def decode(cls, data: bytes | str) -> Alert:
        doc = json.loads(data)
        return cls(**doc)


def build(kind: str, *, node: str, message: str, wall: datetime,
          detail: Mapping[str, Any] | None = None, correlation: str = "",
          reminder: bool = False, required: bool = True,
          ids: UlidFactory = new_id) -> Alert:
    """A new alert of ``kind`` (which must be in the table), raised at ``wall``."""
    if kind not in KINDS:
        raise KeyError(f"unknown alert kind {kind!r}; add it to edgeheal.agent.alerts.kinds.KINDS")
    alert_id = ids(wall)
    return Alert(id=alert_id, node=node, time=rfc3339(wall),
                 severity=severity(kind, required=required), kind=kind,
                 correlation=correlation or alert_id, message=message,
                 detail=dict(detail or {}), reminder=reminder)
