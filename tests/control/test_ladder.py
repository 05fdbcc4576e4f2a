"""The control ladder's pure decision: every gate and safeguard, table-driven with the time
injected. The rows that matter most: no restart for ``server_unreachable``, while the
direct path or the uplink is down, or while another ladder acts."""

from __future__ import annotations

import inspect
import math
import random
import re
from dataclasses import replace
from typing import Any

import pytest

from edgeheal.checks.control.verdict import HEALABLE
from edgeheal.config import loads_generic
from edgeheal.core import control_ladder
from edgeheal.core.control_ladder import ControlLimits, ControlView, decide, view_of
from edgeheal.core.safeguards import History, Record
from edgeheal.model import CheckResult, CheckStatus, Snapshot, State
from tests.uplink.test_ladder import status

OK, UNK, FAIL = State.OK, State.UNKNOWN, State.FAILED
LIMITS = ControlLimits(act_after=60.0, not_ready_window=300.0, cooldown=600.0,
                       max_per_hour=2, startup_grace=300.0, give_up_after=3)
NOW = 100_000.0
HOLD = "K3s server upgrade by ops, until 2026-12-04T20:00:00.000Z"


def view(**overrides: Any) -> ControlView:
    base = ControlView(control=FAIL, reason="heartbeat_stale", since=NOW - 1000,
                       healable=HEALABLE, direct_mqtt={"broker-direct": OK}, uplink=OK,
                       started_mono=0.0, booted_mono=-200_000.0)
    return replace(base, **overrides)


def attempt(mono: float | None, result: str = "not_recovered") -> Record:
    return Record(mono=mono, wall="2026-01-01T00:00:00.000Z", mode="k3s-service",
                  reason="control_heartbeat_stale", result=result, duration=20.0)


def hist(*records: Record, **kw: Any) -> History:
    h = History()
    for r in records:
        h = h.with_record(r)
    return replace(h, **kw)


def kinds(actions: list[Any]) -> list[tuple[str, str]]:
    return [(a.kind, a.reason) for a in actions]


ROWS: list[tuple[str, dict[str, Any], History, list[tuple[str, str]]]] = [
    ("1. ok: nothing", {"control": OK, "reason": "ok"}, History(), []),
    ("1b. ok after failures: close the circuit", {"control": OK, "reason": "ok"},
     hist(attempt(NOW - 5000)), [("close_circuit", "control_healthy")]),
    ("1c. ok within the grace of the agent's start: keep the streak",
     {"control": OK, "reason": "ok", "started_mono": NOW - 10}, hist(attempt(NOW - 5000)),
     []),
    ("2. server unreachable: never a restart", {"reason": "server_unreachable"}, History(),
     [("skip", "server_unreachable")]),
    ("2b. ... not even with every safeguard clear and hours of it",
     {"reason": "server_unreachable", "since": -math.inf}, History(),
     [("skip", "server_unreachable")]),
    ("3. unknown: nothing", {"control": UNK, "reason": "confirming"}, History(), []),
    ("3b. forbidden: nothing", {"control": UNK, "reason": "forbidden"}, History(), []),
    ("4. paused", {}, History(paused_until=math.inf), [("skip", "paused")]),
    ("4b. circuit open", {}, History(circuit_open=True), [("skip", "circuit_open")]),
    ("4c. a fleet hold holds: no agent restart", {"fleet_hold": HOLD}, History(),
     [("skip", "fleet_hold")]),
    ("4d. ... the operator's pause comes first", {"fleet_hold": HOLD},
     History(paused_until=math.inf), [("skip", "paused")]),
    ("4e. ... an unreachable server is said as such", {"fleet_hold": HOLD,
                                                        "reason": "server_unreachable"},
     History(), [("skip", "server_unreachable")]),
    ("4f. ... and an ok check is nothing to hold", {"fleet_hold": HOLD, "control": OK,
                                                    "reason": "ok"}, History(), []),
    ("5. a direct-path target fails: the path's, not the agent's",
     {"direct_mqtt": {"broker-direct": FAIL}}, History(), [("skip", "path_down")]),
    ("5b. the uplink check fails", {"uplink": FAIL}, History(), [("skip", "path_down")]),
    ("6. the Flannel ladder is acting", {"busy": ("flannel",)}, History(),
     [("skip", "other_ladder")]),
    ("7. a stale heartbeat for 30 s: wait", {"since": NOW - 30}, History(),
     [("skip", "verdict_window")]),
    ("7b. not ready for 200 s: its own, longer window",
     {"reason": "not_ready", "since": NOW - 200}, History(), [("skip", "verdict_window")]),
    ("8. within startup grace", {"started_mono": NOW - 100}, History(),
     [("skip", "startup_grace")]),
    ("8b. cooldown", {}, hist(attempt(NOW - 100)), [("skip", "cooldown")]),
    ("8c. the budget", {}, hist(attempt(NOW - 3000, "recovered"),
                                attempt(NOW - 1500, "recovered")),
     [("skip", "budget_exhausted")]),
    ("8d. three restarts did not cure: open the circuit", {},
     hist(attempt(NOW - 90000), attempt(NOW - 80000), attempt(NOW - 70000)),
     [("open_circuit", "control_heartbeat_stale")]),
    ("9. restart", {}, History(), [("restart", "control_heartbeat_stale")]),
    ("9b. balancer stuck", {"reason": "balancer_stuck"}, History(),
     [("restart", "control_balancer_stuck")]),
    ("9c. node ip changed", {"reason": "node_ip_changed"}, History(),
     [("restart", "control_node_ip_changed")]),
    ("9d. not ready past its window", {"reason": "not_ready", "since": NOW - 400},
     History(), [("restart", "control_not_ready")]),
]


@pytest.mark.parametrize(("overrides", "history", "expected"),
                         [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_the_control_ladder_decides(overrides: dict[str, Any], history: History,
                                    expected: list[tuple[str, str]]) -> None:
    assert kinds(decide(view(**overrides), history, NOW, LIMITS)) == expected


def test_a_restart_names_its_remedy_and_says_when_the_balancer_is_cleared() -> None:
    (stuck,) = decide(view(reason="balancer_stuck"), History(), NOW, LIMITS)
    assert stuck.rung == ""  # the actor's one remedy: the registry names it, not the core
    assert "load-balancer state" in stuck.message
    (stale,) = decide(view(), History(), NOW, LIMITS)
    assert "load-balancer" not in stale.message
    (dry,) = decide(view(), History(), NOW, replace(LIMITS, dry_run=True))
    assert dry.dry_run
    assert "would restart" in dry.message


def test_no_time_or_history_turns_an_unreachable_server_into_a_restart() -> None:
    for since in (NOW, NOW - 1e6, -math.inf):
        for h in (History(), hist(attempt(NOW - 90000, "recovered")),
                  History(failures_in_row=0)):
            actions = decide(view(reason="server_unreachable", since=since), h, NOW, LIMITS)
            assert all(a.kind != "restart" for a in actions)


def test_the_skip_reasons_list_is_every_skip_the_source_gives() -> None:
    source = inspect.getsource(control_ladder)
    given = set(re.findall(r'Action\("skip", "(\w+)"', source))
    shared = {"paused", "circuit_open", "startup_grace", "cooldown", "budget_exhausted"}
    assert given | shared == set(control_ladder.SKIP_REASONS)


def test_the_view_reads_the_control_check_the_uplink_and_the_direct_path() -> None:
    config = loads_generic("""
[uplink]
interfaces = ["wwan0"]
[control]
servers = ["203.0.113.5:6443"]
[kubernetes]
kubeconfig = "/nonexistent"
[[mqtt.targets]]
name = "d1"
host = "127.0.0.1"
path = "direct"
""")
    checks = {"control": status("control", FAIL, "heartbeat_stale", 50.0),
              "uplink": status("uplink", OK, "ok", 0.0),
              "d1": status("d1", OK, "ok", 0.0)}
    snap = Snapshot(node="n", checks=checks, started_mono=0.0, taken_mono=100.0,
                    round_complete=True)
    v = view_of(snap, config, busy=("uplink",), reason_since=70.0)
    assert (v.control, v.reason, v.since) == (FAIL, "heartbeat_stale", 70.0)
    assert v.healable == HEALABLE
    assert (v.uplink, dict(v.direct_mqtt), v.busy) == (OK, {"d1": OK}, ("uplink",))
    assert kinds(decide(v, History(), 1e6, LIMITS)) == [("skip", "other_ladder")]
    pending = CheckStatus(name="control", state=UNK, reason="pending", message="",
                          since=checks["d1"].since, since_mono=0.0, detail={},
                          required=False, runs=0, observed=CheckResult(UNK, "pending"))
    v = view_of(replace(snap, checks={**checks, "control": pending}), config)
    assert v.control is None
    assert decide(v, History(), 1e6, LIMITS) == []


# --- the restart jitter: drawn once per episode by the pure ladder, after every gate ---

JITTER = replace(LIMITS, restart_jitter=30.0)


def never() -> float:
    raise AssertionError("drawn although a gate came first, or drawn twice")


def test_the_first_restart_draws_its_wait_once_and_goes_ahead_when_it_is_over() -> None:
    (first,) = decide(view(), History(), NOW, JITTER, rand=lambda: 0.5)
    assert (first.kind, first.reason, first.until) == ("watch", "restart_jitter", NOW + 15.0)
    assert "first agent restart of this episode waits 15s more" in first.message
    waiting = History(jitter_until=first.until)
    assert kinds(decide(view(), waiting, NOW + 14.9, JITTER, rand=never)) == [
        ("watch", "restart_jitter")]
    assert kinds(decide(view(), waiting, NOW + 15.0, JITTER, rand=never)) == [
        ("restart", "control_heartbeat_stale")]


@pytest.mark.parametrize(("case", "history", "limits", "rand"), [
    ("a restart in a row already happened: cooldown only",
     hist(attempt(NOW - 5000)), JITTER, 0.9),
    ("restart_jitter = 0 turns it off", History(), replace(JITTER, restart_jitter=0.0), 0.9),
    ("a draw of 0 waits nothing", History(), JITTER, 0.0),
    ("no random source: no wait", History(), JITTER, None),
])
def test_no_wait_when(case: str, history: History, limits: ControlLimits,
                      rand: float | None) -> None:
    source = None if rand is None else (lambda: rand)
    assert kinds(decide(view(), history, NOW, limits, rand=source)) == [
        ("restart", "control_heartbeat_stale")], case


@pytest.mark.parametrize(("case", "overrides", "history", "expected"), [
    ("an unreachable server", {"reason": "server_unreachable"}, History(),
     ("skip", "server_unreachable")),
    ("a pause", {}, History(paused_until=NOW + 60), ("skip", "paused")),
    ("the fleet hold", {"fleet_hold": HOLD}, History(), ("skip", "fleet_hold")),
    ("the direct path down", {"direct_mqtt": {"broker-direct": FAIL}}, History(),
     ("skip", "path_down")),
    ("another ladder acting", {"busy": ("flannel",)}, History(), ("skip", "other_ladder")),
    ("the verdict's window", {"since": NOW - 30}, History(), ("skip", "verdict_window")),
    ("startup grace", {"started_mono": NOW - 100}, History(), ("skip", "startup_grace")),
    ("cooldown", {}, hist(attempt(NOW - 100, "recovered")), ("skip", "cooldown")),
])
def test_every_other_gate_comes_before_the_jitter_and_draws_nothing(
        case: str, overrides: dict[str, Any], history: History,
        expected: tuple[str, str]) -> None:
    assert kinds(decide(view(**overrides), history, NOW, JITTER, rand=never)) == [
        expected], case


def test_an_ok_check_ends_the_wait_and_the_next_episode_draws_again() -> None:
    waiting = History(jitter_until=NOW + 15)
    assert control_ladder.episode_over(view(), waiting) is waiting
    assert control_ladder.episode_over(view(reason="server_unreachable"), waiting) is waiting
    assert control_ladder.episode_over(view(control=OK, reason="ok"),
                                       waiting).jitter_until is None
    assert control_ladder.episode_over(view(control=OK, reason="ok"), History()) == History()
    (again,) = decide(view(), History(), NOW + 100, JITTER, rand=lambda: 0.2)
    assert again.until == NOW + 100 + 6.0


def test_a_fleet_whose_server_fails_in_the_same_second_restarts_spread_out() -> None:
    """100 nodes, each its own random source, their Leases stale from the same instant:
    the first agent restarts spread over the 30 s window, a few per second at most."""
    times = []
    for node in range(100):
        rng = random.Random(node)  # noqa: S311 - a seeded jitter source
        (action,) = decide(view(), History(), NOW, JITTER, rand=rng.random)
        assert action.until is not None
        times.append(action.until - NOW)
    assert all(0.0 <= t < 30.0 for t in times)
    assert max(times) - min(times) > 25.0
    per_second = [sum(1 for t in times if s <= t < s + 1) for s in range(30)]
    assert max(per_second) <= 10, per_second  # 100 in the same second without it
