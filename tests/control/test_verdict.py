"""The control check's judgement as a table: evidence in, (state, reason) out."""

from __future__ import annotations

import pytest

from edgeheal import checks
from edgeheal.boundaries.kernel.tcp_sockets import Socket
from edgeheal.boundaries.kube.node import Lease, NodeView
from edgeheal.checks.control.verdict import (
    HEALABLE,
    REASONS,
    Local,
    Reading,
    judge,
    renewed,
    suspicious,
)
from edgeheal.model import State

SERVER = ("203.0.113.5", 6443)
HERE = frozenset({"10.0.0.2"})


def sock(state: str = "established", unacked: int = 0, retransmits: int = 0) -> Socket:
    return Socket(("10.0.0.2", 40000), SERVER, state, unacked, retransmits, 0, 0)


HEALTHY = Local((sock(),), True, 2, "ok", 3)
NO_CONN = Local((), True, 2, "ok", 3)
NO_CONN_NO_LB = Local((), False, 0, "ok", 3)
STALLED = Local((sock(unacked=900, retransmits=4),), True, 2, "ok", 3)
KUBELET_DOWN = Local((sock(),), True, 2, "refused", 3)
READY = NodeView("True", "KubeletReady", "", ("10.0.0.2",), (), "10.0.0.2")
LEASE = Lease("edge-1", 40, "2026-01-01T00:00:00.000000Z")


def reading(*, unchanged: float = 0.0, fresh: bool = True, node: NodeView = READY,
            error: str = "", why: str = "") -> Reading:
    return Reading(0.0, LEASE, node, unchanged, fresh, error, why, HERE)


ROWS = [
    # 1-2. healthy connections: ok, with or without a reading
    (HEALTHY, "", None, "ok"),
    (HEALTHY, "", reading(fresh=False), "ok"),
    # 3. suspicious before any reading
    (NO_CONN, "", None, "no_evidence"),
    # 4. no server answers directly: never the agent's fault, whatever the API said
    (NO_CONN, "ETIMEDOUT", reading(unchanged=300.0), "server_unreachable"),
    # 5-6. the lease stale while the server answers: the balancer if it has clients
    (NO_CONN, "ok", reading(unchanged=40.0, fresh=False), "balancer_stuck"),
    (NO_CONN_NO_LB, "ok", reading(unchanged=40.0, fresh=False), "heartbeat_stale"),
    (STALLED, "ok", reading(unchanged=45.0, fresh=False), "balancer_stuck"),
    # 8. suspicious, the lease not yet proven renewed: read again
    (NO_CONN, "ok", reading(unchanged=20.0, fresh=False), "confirming"),
    # 9-10. the lease renewed within its duration: Ready decides
    (KUBELET_DOWN, "ok", reading(fresh=True), "ok"),
    (HEALTHY, "", reading(node=NodeView("False", "KubeletNotReady", "", ("10.0.0.2",), (),
                                        "")), "not_ready"),
    # 11-12. the node's addresses: InternalIP, then Flannel's public-ip
    (HEALTHY, "", reading(node=NodeView("True", "", "", ("10.9.9.9",), (), "")),
     "node_ip_changed"),
    (HEALTHY, "", reading(node=NodeView("True", "", "", ("10.0.0.2",), (), "10.9.9.9")),
     "node_ip_changed"),
    # 13. ExternalIP behind NAT is no address here, and that is fine
    (HEALTHY, "", reading(node=NodeView("True", "", "", ("10.0.0.2",), ("198.51.100.7",),
                                        "")), "ok"),
    # 14-15. the API could not be read
    (NO_CONN, "ok", reading(error="timed out", why="api_unreadable"), "api_unreadable"),
    (NO_CONN, "ok", reading(error="403", why="forbidden"), "forbidden"),
    # 16-17. no [kubernetes]: the local evidence decides, or cannot
    (HEALTHY, "", Reading(0.0, error="no [kubernetes]", error_reason="no_evidence"), "ok"),
    (NO_CONN, "ok", Reading(0.0, error="no [kubernetes]", error_reason="no_evidence"),
     "no_evidence"),
]


@pytest.mark.parametrize(("local", "direct", "last", "expected"), ROWS)
def test_the_verdict_table(local: Local, direct: str, last: Reading | None,
                           expected: str) -> None:
    result = judge(local, direct, last, suspicion=suspicious(local))
    assert result.reason == expected, result.message
    assert result.state is REASONS[expected]


def test_what_is_suspicious() -> None:
    assert suspicious(HEALTHY) == ""
    assert "no established" in suspicious(NO_CONN)
    assert "stalled" in suspicious(STALLED)
    assert "refused" in suspicious(KUBELET_DOWN)
    assert "cannot be read" in suspicious(Local((), False, 0, "", 3, table_error="EACCES"))
    # one lost packet is not a stall; unacknowledged data without retransmits neither
    assert suspicious(Local((sock(unacked=900, retransmits=2),), False, 0, "", 3)) == ""
    assert suspicious(Local((sock(unacked=900),), False, 0, "", 3)) == ""
    # a SYN in flight is no established connection
    assert "no established" in suspicious(Local((sock("syn_sent"),), False, 0, "", 3))


def test_a_lease_is_stale_by_this_agents_clock_only() -> None:
    seen, unchanged, moved = renewed(None, 100.0, "r1")
    assert (seen, unchanged, moved) == ((100.0, "r1"), 0.0, False)
    seen, unchanged, moved = renewed(seen, 130.0, "r1")
    assert (seen, unchanged, moved) == ((100.0, "r1"), 30.0, False)
    seen, unchanged, moved = renewed(seen, 150.0, "r2")
    assert (seen, unchanged, moved) == ((150.0, "r2"), 0.0, True)


def test_the_registration_holds_the_table_and_never_heals_an_unreachable_server() -> None:
    reg = checks.role("control")
    assert reg.reason_states == REASONS
    assert set(reg.reasons) == set(REASONS)
    assert reg.vocabulary["healable"] == HEALABLE
    assert "server_unreachable" not in HEALABLE
    assert reg.reasons_in(State.FAILED) >= HEALABLE
