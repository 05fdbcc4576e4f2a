"""The control check's judgement: pure functions over one run's evidence.

Two questions, asked in this order by :class:`~edgeheal.checks.control.ControlCheck`:

1. :func:`suspicious` — does the free local evidence (the kernel's TCP table, the
   kubelet's ``/healthz``) give a reason to spend bytes on the direct handshake and an API
   read? Only then, or at ``api_interval``, does the check ask.
2. :func:`judge` — the verdict, from the local evidence, the handshake's answer and the
   latest API reading (see the reasons table in the package docstring).

No I/O, no clock: every time is a monotonic reading the caller passes in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeheal.model import CheckResult, State

if TYPE_CHECKING:
    from edgeheal.boundaries.kernel.tcp_sockets import Socket
    from edgeheal.boundaries.kube.node import Lease, NodeView

REASONS: dict[str, State] = {
    "ok": State.OK,
    "heartbeat_stale": State.FAILED,
    "balancer_stuck": State.FAILED,
    "not_ready": State.FAILED,
    "node_ip_changed": State.FAILED,
    "server_unreachable": State.FAILED,
    "confirming": State.UNKNOWN,
    "api_unreadable": State.UNKNOWN,
    "forbidden": State.UNKNOWN,
    "not_found": State.UNKNOWN,
    "no_evidence": State.UNKNOWN,
}
"""The closed reason table (each maps to one state)."""
HEALABLE = frozenset({"heartbeat_stale", "balancer_stuck", "not_ready", "node_ip_changed"})
"""The verdicts a restart of the K3s agent may cure (the control ladder's vocabulary);
``server_unreachable`` is never among them: the path, not the agent, is broken."""


@dataclass(frozen=True, slots=True)
class Local:
    """The free evidence of one run."""

    server: tuple[Socket, ...]
    """The namespace's sockets whose remote end is a server (any state)."""
    balancer_listening: bool
    balancer_clients: int
    """Established connections *to* the local load balancer (kubelet, k3s itself)."""
    kubelet: str
    """``/healthz``'s answer: ``ok``, what went wrong, or "" (not asked)."""
    stall_retransmits: int
    table_error: str = ""

    @property
    def established(self) -> tuple[Socket, ...]:
        return tuple(s for s in self.server if s.state == "established")

    @property
    def stalled(self) -> tuple[Socket, ...]:
        return tuple(s for s in self.established
                     if s.unacked and max(s.retransmits, s.probes) >= self.stall_retransmits)

    @property
    def healthy(self) -> tuple[Socket, ...]:
        stalled = set(self.stalled)
        return tuple(s for s in self.established if s not in stalled)

    def detail(self) -> dict[str, Any]:
        est = self.established
        out: dict[str, Any] = {
            "server_connections": {
                "established": len(est), "stalled": len(self.stalled),
                "syn_sent": sum(1 for s in self.server if s.state == "syn_sent"),
                "max_retransmits": max((s.retransmits for s in est), default=0),
                "unacked_bytes": sum(s.unacked for s in est)},
            "balancer": {"listening": self.balancer_listening,
                         "clients": self.balancer_clients}}
        if self.kubelet:
            out["kubelet_healthz"] = self.kubelet
        if self.table_error:
            out["tcp_table"] = self.table_error
        return out


@dataclass(frozen=True, slots=True)
class Reading:
    """The latest API reading, with what the check remembers across readings."""

    at: float
    """Monotonic time of the reading."""
    lease: Lease | None = None
    node: NodeView | None = None
    unchanged_for: float = 0.0
    """Seconds (monotonic) the lease's ``renewTime`` has been the same across readings:
    how the node lifecycle controller judges a lease (its own time of the last change)."""
    fresh: bool = False
    """The ``renewTime`` changed since a reading at most the lease's duration ago: the
    kubelet renewed it within its duration, for certain."""
    error: str = ""
    """Why the API could not be read ("" when it was)."""
    error_reason: str = ""
    """``api_unreadable``, ``forbidden`` or ``not_found`` with ``error``."""
    local_addresses: frozenset[str] = field(default_factory=frozenset)


def suspicious(local: Local) -> str:
    """Why the local evidence is worth an API read ("" when it is not)."""
    if local.table_error:
        return f"the TCP table cannot be read ({local.table_error})"
    if local.kubelet and local.kubelet != "ok":
        return f"the kubelet's /healthz answers {local.kubelet}"
    if not local.established:
        return "the agent holds no established connection to a server"
    if not local.healthy:
        return (f"every connection to a server is stalled ({len(local.stalled)}: "
                f"unacknowledged data retransmitted {local.stall_retransmits}+ times)")
    return ""


def _ip_mismatch(node: NodeView, local: frozenset[str]) -> str:
    if node.internal_ips and not any(ip in local for ip in node.internal_ips):
        return (f"the Node's InternalIP {', '.join(node.internal_ips)} is no address of "
                "this node")
    if node.public_ip and node.public_ip not in local:
        return f"Flannel's public-ip {node.public_ip} is no address of this node"
    return ""


def judge(local: Local, direct: str, reading: Reading | None, *,
          suspicion: str) -> CheckResult:
    """The verdict (first match wins; the reasons table of the package docstring).

    ``direct``: the handshake's answer this run ("" when none was made); ``reading``: the
    latest API reading (None: never read); ``suspicion``: :func:`suspicious`'s answer."""
    detail: dict[str, Any] = local.detail()
    if suspicion:
        detail["suspicion"] = suspicion
    if direct:
        detail["direct"] = direct
    if reading is not None:
        detail["api"] = _reading_detail(reading)
    if direct and direct != "ok":
        return CheckResult(State.FAILED, "server_unreachable", (
            f"no server answers a TCP handshake directly ({direct}): the path to the "
            "server is down (the uplink's business; restarting the agent cannot help)"),
            detail)
    unread = reading is None or reading.error_reason == "no_evidence"
    if unread and not suspicion:
        return CheckResult(State.OK, "ok", "the agent holds healthy connections to its "
                           "server", detail)
    if reading is None:
        return CheckResult(State.UNKNOWN, "no_evidence",
                           f"{suspicion}; the API has not been read yet", detail)
    if reading.error:
        return CheckResult(State.UNKNOWN, reading.error_reason or "api_unreadable",
                           reading.error, detail)
    node, lease = reading.node, reading.lease
    if node is not None and (mismatch := _ip_mismatch(node, reading.local_addresses)):
        return CheckResult(State.FAILED, "node_ip_changed", (
            f"{mismatch}: the node's address changed under the running agent (a restart "
            "re-registers it)"), detail)
    if lease is not None and reading.unchanged_for >= lease.duration:
        stale = (f"the node's Lease has not been renewed for {reading.unchanged_for:.0f}s "
                 f"(its duration is {lease.duration}s)")
        if local.balancer_listening and local.balancer_clients and not local.healthy:
            return CheckResult(State.FAILED, "balancer_stuck", (
                f"{stale}; the agent's load balancer holds {local.balancer_clients} "
                "client connections but no healthy connection to a server, which answers "
                "directly"), detail)
        return CheckResult(State.FAILED, "heartbeat_stale",
                           f"{stale} while the server answers directly", detail)
    if suspicion and not reading.fresh:
        return CheckResult(State.UNKNOWN, "confirming", (
            f"{suspicion}; the Lease's renewTime has not moved for "
            f"{reading.unchanged_for:.0f}s of the {lease.duration if lease else 40}s it may: "
            "reading it again"), detail)
    if node is not None and node.ready != "True":
        return CheckResult(State.FAILED, "not_ready", (
            f"the Node's Ready condition is {node.ready or 'missing'} "
            f"({node.ready_reason or 'no reason'}) while its Lease is renewed"), detail)
    if suspicion:
        return CheckResult(State.OK, "ok", (
            f"the Lease is renewed and the Node is Ready, although {suspicion}"), detail)
    return CheckResult(State.OK, "ok", "the Lease is renewed and the Node is Ready", detail)


def _reading_detail(reading: Reading) -> Mapping[str, Any]:
    out: dict[str, Any] = {}
    if reading.error:
        out["error"] = reading.error
    if reading.lease is not None:
        out["lease"] = {"holder": reading.lease.holder, "duration": reading.lease.duration,
                        "renew_time": reading.lease.renew_time,
                        "unchanged_seconds": round(reading.unchanged_for, 1)}
    if reading.node is not None:
        out["node"] = {"ready": reading.node.ready, "reason": reading.node.ready_reason,
                       "internal_ips": list(reading.node.internal_ips)}
    return out


def renewed(seen: tuple[float, str] | None, now: float, renew_time: str,
            ) -> tuple[tuple[float, str], float, bool]:
    """What to remember of a lease reading — (first seen, renewTime) —, how long that
    renewTime has been the same, and whether it moved since the previous reading."""
    if seen is not None and seen[1] == renew_time:
        return seen, now - seen[0], False
    return (now, renew_time), 0.0, seen is not None
