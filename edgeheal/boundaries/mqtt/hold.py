"""The fleet hold's wire format: one retained message on ``<topic_prefix>/fleet/hold``.

Why: a fault on the hub's side (its WireGuard, its Flannel) fails every edge's tunnel at
once with the direct path fine, exactly the case in which each edge's Flannel ladder
restarts: N nodes, N pod deletions or k3s-agent restarts against a server already in
trouble, none of which can help. A hold is the fleet's word, said once by an operator
(``edgeheal fleet hold``) and heard by every agent on the connection it keeps open anyway
(one subscription, retained: an agent that connects later hears it too).

The payload is a JSON object of at most :data:`MAX_PAYLOAD` bytes::

    {"reason": "hub wg0 down, INC-1234", "until": "2026-12-04T20:30:00Z", "by": "ops"}

``until`` is an RFC 3339 UTC time (the hold expires on its own then, however the agent
was disconnected); ``reason`` is 1 to :data:`MAX_REASON` printable characters; ``by`` is
optional. An empty payload is a release (what a retained message's deletion delivers).
Anything else is refused, never obeyed: not JSON, not an object, an unknown key, a missing
or malformed field, an ``until`` more than ``[fleet] max_hold`` ahead (a hold that outlives
the incident is a fleet that no longer heals itself). Who may publish is the broker's
business (its ACL on the topic: docs/remediation.md shows one); the agent trusts no
claim in the payload beyond these bounds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from edgeheal.base.compat import UTC

SUFFIX = "fleet/hold"
MAX_PAYLOAD = 1024
"""Bytes of a hold message at most (a real one is ~100)."""
MAX_REASON = 200
KEYS = frozenset({"reason", "until", "by"})


def topic(prefix: str) -> str:
    return f"{prefix}/{SUFFIX}"


@dataclass(frozen=True, slots=True)
class Hold:
    """A hold that passed every bound (``until`` None: a release)."""

    reason: str
    until: datetime | None
    by: str = ""


class HoldRefused(ValueError):
    """The message is not a hold the agent may obey (the text says why, never quoting it)."""


def parse(payload: bytes, now: datetime, max_hold: float) -> Hold:
    """The hold in ``payload``, received at wall time ``now``; :class:`HoldRefused` else."""
    if not payload:
        return Hold("released", None)
    if len(payload) > MAX_PAYLOAD:
        raise HoldRefused(f"{len(payload)} bytes, more than {MAX_PAYLOAD}")
    try:
        doc = json.loads(payload)
    except RecursionError:
        raise HoldRefused("JSON nested too deeply") from None
    except ValueError:
        raise HoldRefused("not JSON") from None
    if not isinstance(doc, dict):
        raise HoldRefused(f"not a JSON object ({type(doc).__name__})")
    unknown = sorted(set(doc) - KEYS)
    if unknown:
        raise HoldRefused(f"unknown key(s) {', '.join(repr(k[:20]) for k in unknown[:3])}")
    reason, until, by = doc.get("reason"), doc.get("until"), doc.get("by", "")
    for key, value, limit in (("reason", reason, MAX_REASON), ("by", by, 64)):
        if not isinstance(value, str) or not value.isprintable() or len(value) > limit:
            raise HoldRefused(f'"{key}" must be printable text of at most {limit} characters')
    if not reason:
        raise HoldRefused('"reason" is empty')
    if not isinstance(until, str):
        raise HoldRefused('"until" is missing or not a string')
    try:
        when = datetime.fromisoformat(until.replace("Z", "+00:00"))
    except ValueError:
        raise HoldRefused('"until" is not an RFC 3339 time') from None
    if when.tzinfo is None:
        raise HoldRefused('"until" has no time zone (write it in UTC, ending in Z)')
    if when - now > timedelta(seconds=max_hold):
        raise HoldRefused(f"it would hold for {(when - now).total_seconds():.0f}s, more "
                          f"than [fleet] max_hold ({max_hold:g}s)")
    return Hold(reason, when.astimezone(UTC), by)


def encode(reason: str, until: datetime, by: str = "") -> bytes:
    doc = {"reason": reason, "until": until.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if by:
        doc["by"] = by
    return json.dumps(doc, separators=(",", ":")).encode()
