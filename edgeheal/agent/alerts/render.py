"""What subscribers read besides an alert's headline: the retained status document and
the check ``detail`` of a problem's alerts.

Why apart from the engine: both are documented formats (``docs/alerts.md``) built only
from a snapshot, the config and the wall clock's reading, with no delivery or outbox
concern; kept pure here, their shape is in one place and the engine stays about moving
alerts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from edgeheal.model import CheckStatus, Snapshot, State, rfc3339


def status_doc(snapshot: Snapshot) -> dict[str, Any]:
    """The retained status's content for a complete round (what changes trigger a send)."""
    return {"state": _overall(snapshot),
            "checks": {n: s.state.value for n, s in snapshot.checks.items()}}


def status_payload(state: str, *, wall: datetime, checks: Mapping[str, str] | None = None,
                   reason: str = "") -> bytes:
    """The retained status message on ``<prefix>/<node>/status``, stamped ``wall``."""
    doc: dict[str, Any] = {"state": state, "time": rfc3339(wall), "checks": dict(checks or {})}
    if reason:
        doc["reason"] = reason
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def check_detail(name: str, status: CheckStatus, *, opened: str = "",
                 path: str | None = None) -> dict[str, Any]:
    """``detail`` of a problem's alert: the check's status; ``opened`` once the problem is
    open; ``path`` for an MQTT target (None: not one)."""
    detail: dict[str, Any] = {"check": name, "state": status.state.value,
                              "reason": status.reason, "since": rfc3339(status.since),
                              "required": status.required}
    if opened:
        detail["opened"] = opened
    if path is not None:
        detail["path"] = path
    if status.detail:
        detail["observed"] = jsonable(status.detail)
    return detail


def jsonable(value: Mapping[str, Any]) -> dict[str, Any]:
    """``value`` as plain JSON types (anything else as its ``str``)."""
    return dict(json.loads(json.dumps(dict(value), default=str)))


def _overall(snapshot: Snapshot) -> str:
    state = snapshot.overall
    if state is State.UNKNOWN:
        return "degraded"  # nothing proved a fault; the per-check map says "unknown"
    return str(state.value)
