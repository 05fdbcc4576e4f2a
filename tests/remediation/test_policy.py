"""The pure remediation policy: every rung and every safeguard, table-driven, injected time.

Each scenario runs in both remedy modes (``pod`` and ``k3s-service``): the policy must not
care how Flannel is restarted.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest

from edgeheal.base.compat import UTC
from edgeheal.config import RemediationSettings, loads_generic
from edgeheal.core import flannel_ladder as policy
from edgeheal.core.flannel_ladder import History, Record, TunnelView, decide, view_of
from edgeheal.model import CheckStatus, Snapshot, State

OK, DEG, UNK, FAIL = State.OK, State.DEGRADED, State.UNKNOWN, State.FAILED
SETTINGS = RemediationSettings(cooldown=120.0, max_per_hour=3, startup_grace=60.0,
                               give_up_after=3, verify_timeout=60.0)
MODES = ("pod", "k3s-service")


def view(mode: str, *, wg: State | None = FAIL, reason: str = "stalled",
         tunnel: dict[str, State] | None = None, direct: dict[str, State] | None = None,
         offload: State | None = OK, started: float = 0.0, booted: float = -10_000.0,
         direct_ok_since: float = -10_000.0, cause: str = "") -> TunnelView:
    return TunnelView(mode=mode, wireguard=wg, wireguard_reason=reason, wireguard_cause=cause,
                      tunnel_mqtt={"broker-tunnel": OK} if tunnel is None else tunnel,
                      direct_mqtt={"broker-direct": OK} if direct is None else direct,
                      offload=offload, offload_reason="all_off" if offload else "",
                      started_mono=started, booted_mono=booted,
                      direct_ok_since=direct_ok_since)


def restart_at(mono: float | None, result: str = "not_recovered") -> Record:
    return Record(mono=mono, wall="2026-01-01T00:00:00.000Z", mode="pod", reason="x",
                  result=result, duration=5.0)


def history(*records: Record, **kw: Any) -> History:
    return History(records=records, **kw)


# (id, view overrides, history, now, settings overrides, expected [(kind, reason)])
CASES: list[tuple[str, dict[str, Any], History, float, dict[str, Any],
                  list[tuple[str, str]]]] = [
    ("a healthy tunnel needs nothing", {"wg": OK, "reason": "ok"}, History(), 1000, {}, []),
    ("a healthy tunnel closes an open circuit", {"wg": OK, "reason": "ok"},
     History(circuit_open=True, failures_in_row=3), 1000, {},
     [("close_circuit", "tunnel_healthy")]),
    ("a healthy tunnel clears a streak of uncured restarts", {"wg": OK, "reason": "ok"},
     History(failures_in_row=1), 1000, {}, [("close_circuit", "tunnel_healthy")]),
    ("a healthy first reading within the agent's startup grace (kill -9 mid-restart) keeps "
     "the streak and the circuit", {"wg": OK, "reason": "ok", "started": 950.0},
     History(circuit_open=True, failures_in_row=2), 1000, {}, []),
    ("the same reading once the grace is over closes them", {"wg": OK, "reason": "ok",
                                                             "started": 940.0},
     History(circuit_open=True, failures_in_row=2), 1000, {},
     [("close_circuit", "tunnel_healthy")]),
    ("a degraded tunnel is watched, never restarted", {"wg": DEG, "reason": "rekey_failing"},
     History(), 1000, {}, [("watch", "rekey_failing")]),
    ("a stalled tunnel is restarted", {}, History(), 1000, {},
     [("restart", "wireguard_stalled")]),
    ("a dead tunnel is restarted", {"reason": "dead"}, History(), 1000, {},
     [("restart", "wireguard_dead")]),
    ("a never-connected tunnel is restarted", {"reason": "never_connected"}, History(), 1000,
     {}, [("restart", "wireguard_never_connected")]),
    ("a device that lost its peers (stuck Flannel) is restarted", {"reason": "no_peers"},
     History(), 1000, {}, [("restart", "wireguard_no_peers")]),
    ("a missing device (Flannel did not rebuild it) is restarted",
     {"reason": "interface_missing"}, History(), 1000, {},
     [("restart", "wireguard_interface_missing")]),
    ("cooldown 0 allows back-to-back restarts", {}, history(restart_at(999.0)), 1000,
     {"cooldown": 0.0}, [("restart", "wireguard_stalled")]),
    ("an unknown tunnel is no evidence", {"wg": UNK, "reason": "check_timeout"}, History(),
     1000, {}, []),
    ("a failed state with another reason is not a restart rung",
     {"reason": "permission_denied"}, History(), 1000, {}, []),
    ("the tunnel-path broker failing while the direct path works restarts",
     {"wg": OK, "reason": "ok", "tunnel": {"broker-tunnel": FAIL}}, History(), 1000, {},
     [("restart", "tunnel_mqtt_failed")]),
    ("the tunnel-path broker failing without a direct target to compare is no evidence",
     {"wg": OK, "reason": "ok", "tunnel": {"broker-tunnel": FAIL}, "direct": {}},
     History(), 1000, {}, []),
    ("the direct path failing too means an uplink outage: skip",
     {"direct": {"broker-direct": FAIL}}, History(), 1000, {},
     [("skip", "direct_path_down")]),
    ("the direct path unknown counts as failing: skip",
     {"direct": {"broker-direct": UNK}}, History(), 1000, {},
     [("skip", "direct_path_down")]),
    ("both brokers failing with wireguard ok is an outage, not a tunnel fault",
     {"wg": OK, "reason": "ok", "tunnel": {"broker-tunnel": FAIL},
      "direct": {"broker-direct": FAIL}}, History(), 1000, {}, []),
    ("the direct path just came back from an outage: the tunnel gets time to recover",
     {"direct_ok_since": 990.0}, History(), 1000, {}, [("skip", "uplink_settling")]),
    ("the tunnel still failed long after the direct path came back: restart",
     {"direct_ok_since": 960.0}, History(), 1000, {}, [("restart", "wireguard_stalled")]),
    ("within startup grace of the agent: skip", {"started": 950.0}, History(), 1000, {},
     [("skip", "startup_grace")]),
    ("within startup grace of the node's boot: skip", {"booted": 990.0}, History(), 1000,
     {}, [("skip", "startup_grace")]),
    ("just after startup grace: restart", {"started": 940.0}, History(), 1000, {},
     [("restart", "wireguard_stalled")]),
    ("within cooldown of the last restart: skip", {}, history(restart_at(900.0)), 1000, {},
     [("skip", "cooldown")]),
    ("after cooldown: restart", {}, history(restart_at(880.0)), 1000, {},
     [("restart", "wireguard_stalled")]),
    ("max_per_hour restarts in the sliding hour: skip", {},
     history(restart_at(1000.0), restart_at(2000.0), restart_at(3000.0)), 4000, {},
     [("skip", "budget_exhausted")]),
    ("the oldest restart leaving the hour frees the budget", {},
     history(restart_at(1000.0), restart_at(2000.0), restart_at(3000.0)), 4600, {},
     [("restart", "wireguard_stalled")]),
    ("earlier-boot restarts do not count for cooldown or budget", {},
     history(restart_at(None), restart_at(None), restart_at(None)), 1000, {},
     [("restart", "wireguard_stalled")]),
    ("give_up_after uncured restarts open the circuit", {}, History(failures_in_row=3),
     1000, {}, [("open_circuit", "wireguard_stalled")]),
    ("an open circuit skips", {}, History(circuit_open=True, failures_in_row=3), 1000, {},
     [("skip", "circuit_open")]),
    ("a pause skips", {}, History(paused_until=2000.0), 1000, {}, [("skip", "paused")]),
    ("an indefinite pause skips", {}, History(paused_until=math.inf), 1000, {},
     [("skip", "paused")]),
    ("an expired pause does not", {}, History(paused_until=999.0), 1000, {},
     [("restart", "wireguard_stalled")]),
    ("a pause wins over an open circuit", {}, History(paused_until=2000.0,
                                                      circuit_open=True), 1000, {},
     [("skip", "paused")]),
    ("the direct path is checked before the time gates", {"direct": {"d": FAIL},
                                                          "started": 999.0},
     History(), 1000, {}, [("skip", "direct_path_down")]),
    # rung 3b: a device that cannot send is never restarted; the cause names the skip
    ("send_failing with the address gone is an uplink problem",
     {"reason": "send_failing", "cause": "no_address"}, History(), 1000, {},
     [("skip", "uplink_down")]),
    ("send_failing with the route gone is an uplink problem",
     {"reason": "send_failing", "cause": "no_route"}, History(), 1000, {},
     [("skip", "uplink_down")]),
    ("send_failing with the link down is an uplink problem",
     {"reason": "send_failing", "cause": "link_down"}, History(), 1000, {},
     [("skip", "uplink_down")]),
    ("send_failing without an endpoint is not cured by a restart either",
     {"reason": "send_failing", "cause": "no_endpoint"}, History(), 1000, {},
     [("skip", "uplink_down")]),
    ("send_failing with the uplink fine is a local drop: no restart",
     {"reason": "send_failing", "cause": "local"}, History(), 1000, {},
     [("skip", "local_send_failure")]),
    ("send_failing with an unknown cause: no restart",
     {"reason": "send_failing", "cause": "unknown"}, History(), 1000, {},
     [("skip", "send_failing")]),
    ("send_failing is decided before every safeguard and the time gates",
     {"reason": "send_failing", "cause": "local", "started": 999.0},
     History(paused_until=2000.0, circuit_open=True), 1000, {},
     [("skip", "local_send_failure")]),
    ("send_failing while the direct path is down is still the uplink",
     {"reason": "send_failing", "cause": "no_route", "direct": {"d": FAIL}}, History(),
     1000, {}, [("skip", "uplink_down")]),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_policy_decides(mode: str, case: tuple[Any, ...]) -> None:
    _, overrides, hist, now, settings, expected = case
    actions = decide(view(mode, **overrides), hist, now, replace(SETTINGS, **settings))
    assert [(a.kind, a.reason) for a in actions] == expected
    assert all(a.message for a in actions)


@pytest.mark.parametrize("mode", MODES)
def test_a_degraded_tunnel_records_that_offload_was_checked(mode: str) -> None:
    (action,) = decide(view(mode, wg=DEG, reason="rekey_failing", offload=FAIL), History(),
                       1000, SETTINGS)
    assert "offload failed" in action.message


def test_mode_none_never_restarts_and_says_why() -> None:
    (action,) = decide(view("none"), History(), 1000, SETTINGS)
    assert (action.kind, action.reason) == ("skip", "mode_none")


@pytest.mark.parametrize("mode", MODES)
def test_dry_run_marks_the_restart_and_does_not_feed_the_circuit(mode: str) -> None:
    (action,) = decide(view(mode), History(), 1000, replace(SETTINGS, dry_run=True))
    assert action.kind == "restart"
    assert action.dry_run
    assert "would restart" in action.message
    after = History().with_record(restart_at(1000.0, "dry_run"))
    assert after.failures_in_row == 0
    # ...but it holds the cooldown, so it says what it would do at the real pace
    (next_action,) = decide(view(mode), after, 1010, replace(SETTINGS, dry_run=True))
    assert (next_action.kind, next_action.reason) == ("skip", "cooldown")


def test_a_cured_restart_clears_the_streak_and_failures_build_it() -> None:
    h = History()
    for result, expected in (("not_recovered", 1), ("failed", 2), ("config_problem", 3),
                             ("recovered", 0)):
        h = h.with_record(restart_at(1.0, result))
        assert h.failures_in_row == expected


def test_the_history_keeps_only_the_newest_records() -> None:
    h = History()
    for i in range(policy.KEEP + 10):
        h = h.with_record(restart_at(float(i)))
    assert len(h.records) == policy.KEEP
    assert h.records[-1].mono == float(policy.KEEP + 9)


# --- scenarios over time (numbered like NPD's transition tables) ---------------------------

def run_scenario(mode: str, *, until: float, cured_by_restart: bool,
                 settings: RemediationSettings = SETTINGS, start: float = 0.0,
                 hist: History | None = None, step: float = 1.0,
                 ) -> tuple[list[float], History, list[str]]:
    """Drive the policy each second; a restart takes 10 s and cures or not."""
    h = hist or History()
    now, cured, restarts, log = start, False, [], []
    while now < until:
        v = view(mode, started=start) if not cured else view(mode, wg=OK, reason="ok",
                                                             started=start)
        for action in decide(v, h, now, settings):
            log.append(f"{now:.0f} {action.kind} {action.reason}")
            if action.kind == "restart":
                restarts.append(now)
                cured = cured_by_restart
                h = h.with_record(restart_at(now, "recovered" if cured else "not_recovered"))
                now += 10.0
            elif action.kind == "open_circuit":
                h = h.opened()
            elif action.kind == "close_circuit":
                h = h.closed()
        now += step
    return restarts, h, log


@pytest.mark.parametrize("mode", MODES)
def test_1_a_fault_a_restart_cures_gets_exactly_one_restart(mode: str) -> None:
    restarts, h, _ = run_scenario(mode, until=3000, cured_by_restart=True)
    assert restarts == [60.0]  # right after startup grace
    assert h.failures_in_row == 0
    assert not h.circuit_open


@pytest.mark.parametrize("mode", MODES)
def test_2_an_incurable_fault_restarts_up_to_give_up_after_then_opens_the_circuit(
        mode: str) -> None:
    restarts, h, log = run_scenario(mode, until=7200, cured_by_restart=False)
    assert len(restarts) == SETTINGS.give_up_after
    assert all(b - a >= SETTINGS.cooldown for a, b in itertools.pairwise(restarts))
    assert h.circuit_open
    assert sum("open_circuit" in line for line in log) == 1


@pytest.mark.parametrize("mode", MODES)
def test_3_the_budget_caps_restarts_per_sliding_hour(mode: str) -> None:
    settings = replace(SETTINGS, give_up_after=100, cooldown=30.0)
    restarts, _, _ = run_scenario(mode, until=3 * 3600, cured_by_restart=False,
                                  settings=settings)
    for t in restarts:
        window = [r for r in restarts if t - 3600 < r <= t]
        assert len(window) <= settings.max_per_hour
    assert len(restarts) >= 3 * settings.max_per_hour - 1  # the budget refills


@pytest.mark.parametrize("mode", MODES)
def test_4_the_circuit_closes_when_the_tunnel_is_healthy_again(mode: str) -> None:
    h = History(circuit_open=True, failures_in_row=3)
    actions = decide(view(mode, wg=OK, reason="ok"), h, 5000, SETTINGS)
    assert [a.kind for a in actions] == ["close_circuit"]
    h = h.closed()
    assert not h.circuit_open
    assert h.failures_in_row == 0
    # and a later fault is acted on again
    assert decide(view(mode), h, 5000, SETTINGS)[0].kind == "restart"


def _snap(direct: State, direct_since: float) -> Snapshot:
    def status(name: str, state: State, since: float) -> CheckStatus:
        return CheckStatus(name=name, state=state, reason="x", message="",
                           since=datetime.now(UTC), since_mono=since, detail={},
                           required=False, runs=3)

    return Snapshot(node="n", checks={"wireguard": status("wireguard", FAIL, 5.0),
                                      "broker-direct": status("broker-direct", direct,
                                                              direct_since)},
                    started_mono=0.0, taken_mono=100.0, round_complete=True)


@pytest.mark.parametrize(("cause", "skip", "says"), [
    ("no_address", "uplink_down", "uplink is gone"),
    ("local", "local_send_failure", "firewall"),
])
def test_a_send_failure_says_its_cause_and_is_read_from_the_check_detail(
        cause: str, skip: str, says: str) -> None:
    cfg = loads_generic('[[mqtt.targets]]\nname = "broker-direct"\nhost = "h"\npath = "direct"\n')
    wg = CheckStatus(name="wireguard", state=FAIL, reason="send_failing", message="",
                     since=datetime.now(UTC), since_mono=5.0, detail={"cause": cause},
                     required=True, runs=3)
    snap = Snapshot(node="n", checks={"wireguard": wg}, started_mono=0.0, taken_mono=100.0,
                    round_complete=True)
    seen = view_of(snap, cfg, mode="pod")
    assert seen.wireguard_cause == cause
    assert seen.failure() == "wireguard_send_failing"
    (action,) = decide(seen, History(), 1000, SETTINGS)
    assert (action.kind, action.reason) == ("skip", skip)
    assert says in action.message
    assert cause in action.message
    # the cause is read for send_failing only
    other = view_of(Snapshot(node="n", checks={"wireguard": replace(wg, reason="stalled")},
                             started_mono=0.0, taken_mono=100.0, round_complete=True),
                    cfg, mode="pod")
    assert other.wireguard_cause == ""


def test_the_direct_path_coming_up_at_start_is_not_an_uplink_recovery() -> None:
    cfg = loads_generic('[[mqtt.targets]]\nname = "broker-direct"\nhost = "h"\npath = "direct"\n')
    snap = _snap(OK, 2.0)
    # no outage seen yet: its first ok is the agent starting, startup_grace covers that
    assert view_of(snap, cfg, mode="pod", direct_was_down=False).direct_ok_since == -math.inf
    # after an outage, the same ok marks the uplink's return: uplink_settle applies
    assert view_of(snap, cfg, mode="pod", direct_was_down=True).direct_ok_since == 2.0
    # a failing direct target has no "ok since"
    assert view_of(_snap(FAIL, 2.0), cfg, mode="pod").direct_ok_since == -math.inf


def _target(name: str, state: State, *, since: float, ran: float | None,
            raw: State | None = None, took: float = 0.1) -> CheckStatus:
    from edgeheal.model import CheckResult

    observed = CheckResult(state=raw or state, reason="x")
    return CheckStatus(name=name, state=state, reason="x", message="",
                       since=datetime.now(UTC), since_mono=since, detail={}, required=False,
                       runs=5, observed=observed, last_run_mono=ran, last_duration=took)


TWO_PATHS = ('[[mqtt.targets]]\nname = "cloud"\nhost = "h"\npath = "tunnel"\n'
             '[[mqtt.targets]]\nname = "direct"\nhost = "h"\npath = "direct"\n')


def _two_paths(direct: CheckStatus, *, wg_since: float = 1.0,
               tunnel_ran: float = 50.0) -> TunnelView:
    wg = _target("wireguard", OK, since=wg_since, ran=60.0)
    cloud = _target("cloud", FAIL, since=50.0, ran=tunnel_ran)
    snap = Snapshot(node="n", checks={"wireguard": wg, "cloud": cloud, "direct": direct},
                    started_mono=0.0, taken_mono=100.0, round_complete=True)
    return view_of(snap, loads_generic(TWO_PATHS), mode="pod")


@pytest.mark.parametrize(("direct", "awaits"), [
    # the direct target ran (and was ok) after the tunnel-path failure was declared
    (_target("direct", OK, since=1.0, ran=55.0), ()),
    # its last run began before: an uplink that drops fails the tunnel probe first
    (_target("direct", OK, since=1.0, ran=50.05, took=0.1), ("direct",)),
    (_target("direct", OK, since=1.0, ran=None), ("direct",)),
    # it ran after, but its raw result failed (its debounce still shows ok)
    (_target("direct", OK, since=1.0, ran=55.0, raw=FAIL), ("direct",)),
])
def test_a_tunnel_path_failure_waits_for_a_direct_result_taken_after_it(
        direct: CheckStatus, awaits: tuple[str, ...]) -> None:
    seen = _two_paths(direct)
    assert seen.awaiting == awaits
    if awaits:
        assert seen.failure() is None
        assert decide(seen, History(), 1000, SETTINGS) == []
    else:
        assert seen.failure() == "tunnel_mqtt_failed"
        assert decide(seen, History(), 1000, SETTINGS)[0].kind == "restart"


def test_a_tunnel_path_timeout_from_before_wireguard_recovered_is_asked_again() -> None:
    direct = _target("direct", OK, since=1.0, ran=55.0)
    # WireGuard was ok again at 52, after the failing target's last run (began 49.9)
    seen = _two_paths(direct, wg_since=52.0, tunnel_ran=50.0)
    assert seen.awaiting == ("cloud",)
    assert seen.failure() is None
    # its next run, after WireGuard's recovery, fails again: evidence
    assert _two_paths(direct, wg_since=52.0, tunnel_ran=58.0).failure() == "tunnel_mqtt_failed"


def test_a_recovering_tunnel_path_target_is_no_evidence() -> None:
    """Its debounce still says failed, its latest run passed: after a hub fault the hold
    is released on WireGuard's recovery while the targets wait out recover_after."""
    direct = _target("direct", OK, since=1.0, ran=55.0)
    wg = _target("wireguard", OK, since=1.0, ran=60.0)
    for raw, evidence in ((OK, None), (FAIL, "tunnel_mqtt_failed")):
        cloud = _target("cloud", FAIL, since=50.0, ran=58.0, raw=raw)
        snap = Snapshot(node="n", checks={"wireguard": wg, "cloud": cloud, "direct": direct},
                        started_mono=0.0, taken_mono=100.0, round_complete=True)
        seen = view_of(snap, loads_generic(TWO_PATHS), mode="pod")
        assert seen.failure() == evidence
        assert seen.awaiting == (() if evidence else ("cloud",))
