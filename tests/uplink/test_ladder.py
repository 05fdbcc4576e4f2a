"""The uplink ladder's pure decision: every gate, every safeguard, the escalation order and
the reboot gates, table-driven with the time injected (no clock is read)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pytest

from edgeheal.config import UplinkLadderSettings, loads_generic
from edgeheal.core import uplink_ladder as uplink
from edgeheal.core.safeguards import History, Record
from edgeheal.core.uplink_ladder import UplinkView, decide, view_of
from edgeheal.model import CheckResult, CheckStatus, Snapshot, State
from tests.support import Clock

OK, UNK, FAIL = State.OK, State.UNKNOWN, State.FAILED
ALL = ("modem-reconnect", "link-bounce", "usb-reauthorize", "reboot")
SETTINGS = UplinkLadderSettings(enabled=True, act_after=300.0, cooldown=120.0,
                                max_per_hour=4, startup_grace=300.0, give_up_after=4,
                                reboot=True, rungs=ALL)
NOW = 100_000.0


def view(*, state: State | None = FAIL, reason: str = "stuck", since: float = NOW - 1000,
         direct: dict[str, State] | None = None, failed_since: float | None = NOW - 1000,
         rungs: tuple[str, ...] = ALL, started: float = 0.0,
         booted: float = -200_000.0) -> UplinkView:
    return UplinkView(rungs=rungs, uplink=state, reason=reason, since=since,
                      direct_mqtt={"broker-direct": FAIL} if direct is None else direct,
                      direct_failed_since=failed_since, started_mono=started,
                      booted_mono=booted)


def attempt(mono: float | None, rung: str = "modem-reconnect",
            result: str = "not_recovered") -> Record:
    return Record(mono=mono, wall="2026-01-01T00:00:00.000Z", mode=rung, reason="uplink_stuck",
                  result=result, duration=5.0)


def kinds(actions: list[Any]) -> list[tuple[str, str, str]]:
    return [(a.kind, a.reason, a.rung) for a in actions]


# (id, view overrides, history, settings overrides, expected [(kind, reason, rung)])
CASES: list[tuple[str, dict[str, Any], History, dict[str, Any],
                  list[tuple[str, str, str]]]] = [
    ("an ok uplink needs nothing", {"state": OK, "reason": "ok"}, History(), {}, []),
    ("an ok uplink closes an open circuit", {"state": OK, "reason": "ok"},
     History(circuit_open=True, failures_in_row=4), {},
     [("close_circuit", "uplink_healthy", "")]),
    ("an ok uplink clears a streak of rungs that did not cure", {"state": OK, "reason": "ok"},
     History(failures_in_row=2), {}, [("close_circuit", "uplink_healthy", "")]),
    ("an ok first reading within the agent's startup grace keeps the streak (the check "
     "counts its start as traffic)", {"state": OK, "reason": "ok", "started": NOW - 100},
     History(failures_in_row=2), {}, []),
    ("no coverage is never a rung, only said", {"reason": "no_coverage"}, History(), {},
     [("skip", "no_coverage", "")]),
    ("no coverage is never a rung even past every window and budget",
     {"reason": "no_coverage", "since": 0.0, "failed_since": 0.0}, History(), {},
     [("skip", "no_coverage", "")]),
    ("a link down is never a rung", {"reason": "link_down"}, History(), {},
     [("skip", "link_down", "")]),
    ("no address is never a rung", {"reason": "no_address"}, History(), {},
     [("skip", "no_address", "")]),
    ("no route is never a rung", {"reason": "no_route"}, History(), {},
     [("skip", "no_route", "")]),
    ("unknown (cannot tell) with the direct path down is said, never a rung",
     {"state": UNK, "reason": "silent"}, History(), {}, [("skip", "uplink_unknown", "")]),
    ("unknown with the direct path fine is nothing at all",
     {"state": UNK, "reason": "silent", "direct": {"broker-direct": OK},
      "failed_since": None}, History(), {}, []),
    ("a check that has not run is nothing", {"state": None, "reason": "", "failed_since": None},
     History(), {}, []),
    ("stuck while a direct-path target answers: no rung (one broker is not the uplink)",
     {"direct": {"a": FAIL, "b": OK}, "failed_since": None}, History(), {},
     [("skip", "direct_path_ok", "")]),
    ("stuck, every direct target failed, but not for act_after yet",
     {"since": NOW - 100}, History(), {}, [("skip", "stuck_window", "")]),
    ("the window counts from the later of stuck and direct-path failure",
     {"since": NOW - 1000, "failed_since": NOW - 299}, History(), {},
     [("skip", "stuck_window", "")]),
    ("stuck long enough: rung 1, the modem reconnect", {}, History(), {},
     [("restart", "uplink_stuck", "modem-reconnect")]),
    ("after one rung that did not cure: rung 2", {},
     History((attempt(NOW - 500),), failures_in_row=1), {},
     [("restart", "uplink_stuck", "link-bounce")]),
    ("after two: rung 3", {},
     History((attempt(NOW - 900), attempt(NOW - 500, "link-bounce")), failures_in_row=2), {},
     [("restart", "uplink_stuck", "usb-reauthorize")]),
    ("after three: the reboot", {},
     History((attempt(NOW - 1300), attempt(NOW - 900, "link-bounce"),
              attempt(NOW - 500, "usb-reauthorize")), failures_in_row=3), {},
     [("restart", "uplink_stuck", "reboot")]),
    ("after every usable rung: the circuit opens", {},
     History((attempt(NOW - 500),), failures_in_row=4), {},
     [("open_circuit", "uplink_stuck", "")]),
    ("with two usable rungs the circuit opens after two", {"rungs": ALL[:2]},
     History((attempt(NOW - 500),), failures_in_row=2), {},
     [("open_circuit", "uplink_stuck", "")]),
    ("give_up_after below the rung count opens the circuit sooner", {},
     History((attempt(NOW - 500),), failures_in_row=2), {"give_up_after": 2},
     [("open_circuit", "uplink_stuck", "")]),
    ("an unusable rung is skipped over: rung 1 is then link-bounce",
     {"rungs": ("link-bounce", "usb-reauthorize")}, History(), {},
     [("restart", "uplink_stuck", "link-bounce")]),
    ("no usable rung at all", {"rungs": ()}, History(), {}, [("skip", "no_rung", "")]),
    ("paused by the operator", {}, History(paused_until=NOW + 60), {},
     [("skip", "paused", "")]),
    ("paused indefinitely", {}, History(paused_until=math.inf), {},
     [("skip", "paused", "")]),
    ("circuit open", {}, History(circuit_open=True, failures_in_row=4), {},
     [("skip", "circuit_open", "")]),
    ("within startup grace of the agent", {"started": NOW - 100}, History(), {},
     [("skip", "startup_grace", "")]),
    ("within startup grace of the boot", {"booted": NOW - 100}, History(), {},
     [("skip", "startup_grace", "")]),
    ("cooldown after the last rung", {},
     History((attempt(NOW - 60),), failures_in_row=1), {}, [("skip", "cooldown", "")]),
    ("budget: max_per_hour rungs in the sliding hour", {},
     History(tuple(attempt(NOW - 3000 + 600 * i, result="recovered") for i in range(4))), {},
     [("skip", "budget_exhausted", "")]),
    ("the budget counts dry runs too", {},
     History(tuple(attempt(NOW - 3000 + 600 * i, result="dry_run") for i in range(4))), {},
     [("skip", "budget_exhausted", "")]),
    ("dry run marks the action", {}, History(), {"dry_run": True},
     [("restart", "uplink_stuck", "modem-reconnect")]),
    ("reboot: once a day on this boot", {},
     History((attempt(NOW - 20_000, "reboot"), attempt(NOW - 1300),
              attempt(NOW - 900, "link-bounce"), attempt(NOW - 500, "usb-reauthorize")),
             failures_in_row=3), {}, [("skip", "reboot_once_a_day", "")]),
    ("reboot: a day after the last one it may run again", {},
     History((attempt(NOW - 90_000, "reboot"), attempt(NOW - 1300),
              attempt(NOW - 900, "link-bounce"), attempt(NOW - 500, "usb-reauthorize")),
             failures_in_row=3), {}, [("restart", "uplink_stuck", "reboot")]),
    ("reboot: one on an earlier boot blocks it while this boot is less than a day old",
     {"booted": NOW - 3600},
     History((attempt(None, "reboot", "interrupted"), attempt(NOW - 1300),
              attempt(NOW - 900, "link-bounce"), attempt(NOW - 500, "usb-reauthorize")),
             failures_in_row=3), {}, [("skip", "reboot_once_a_day", "")]),
    ("reboot: ... and allows it once this boot is a day old", {"booted": NOW - 90_000},
     History((attempt(None, "reboot", "interrupted"), attempt(NOW - 1300),
              attempt(NOW - 900, "link-bounce"), attempt(NOW - 500, "usb-reauthorize")),
             failures_in_row=3), {}, [("restart", "uplink_stuck", "reboot")]),
    ("reboot: a dry-run reboot does not count for the day", {},
     History((attempt(NOW - 20_000, "reboot", "dry_run"), attempt(NOW - 1300),
              attempt(NOW - 900, "link-bounce"), attempt(NOW - 500, "usb-reauthorize")),
             failures_in_row=3), {}, [("restart", "uplink_stuck", "reboot")]),
]


@pytest.mark.parametrize(("overrides", "hist", "settings", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_uplink_ladder_decides(overrides: dict[str, Any], hist: History,
                                   settings: dict[str, Any],
                                   expected: list[tuple[str, str, str]]) -> None:
    actions = decide(view(**overrides), hist, NOW, replace(SETTINGS, **settings))
    assert kinds(actions) == expected
    for action in actions:
        assert action.message
        assert action.dry_run == bool(settings.get("dry_run")) or action.kind != "restart"


@pytest.mark.parametrize("reason", ["no_coverage", "link_down", "no_address", "no_route"])
def test_no_time_and_no_history_ever_turns_a_non_stuck_verdict_into_a_rung(
        reason: str) -> None:
    clock = Clock(now=0.0)
    for _ in range(200):  # two days in 15-minute steps, with every safeguard open
        clock.advance(900.0)
        actions = decide(view(reason=reason, since=0.0, failed_since=0.0), History(),
                         clock.now, SETTINGS)
        assert [a.kind for a in actions] == ["skip"]
    for state, why in ((UNK, "silent"), (UNK, "modem_not_ready"), (None, "")):
        actions = decide(view(state=state, reason=why, since=0.0, failed_since=0.0),
                         History(), clock.now, SETTINGS)
        assert all(a.kind != "restart" for a in actions)


def test_escalation_walks_the_rungs_in_order_then_opens_the_circuit() -> None:
    """The ladder fed its own outcomes: every rung fails to cure; each next attempt comes
    after the cooldown and uses the next rung; then the circuit."""
    clock = Clock(now=NOW)
    hist, used = History(), []
    for _ in range(12):
        actions = decide(view(), hist, clock.now, SETTINGS)
        action = actions[0]
        if action.kind == "restart":
            used.append(action.rung)
            hist = hist.with_record(attempt(clock.now, action.rung))
        elif action.kind == "open_circuit":
            hist = hist.opened()
            break
        clock.advance(130.0)
    assert used == list(ALL)
    assert hist.circuit_open
    assert kinds(decide(view(), hist, clock.now, SETTINGS)) == [("skip", "circuit_open", "")]
    assert kinds(decide(view(state=OK, reason="ok"), hist, clock.now, SETTINGS)) == [
        ("close_circuit", "uplink_healthy", "")]


def test_a_cured_rung_resets_the_ladder_to_rung_one() -> None:
    hist = History().with_record(attempt(NOW - 900)).with_record(
        attempt(NOW - 500, "link-bounce", "recovered"))
    assert hist.failures_in_row == 0
    assert kinds(decide(view(), hist, NOW, SETTINGS)) == [
        ("restart", "uplink_stuck", "modem-reconnect")]


def status(name: str, state: State, reason: str, since: float) -> CheckStatus:
    from datetime import datetime

    from edgeheal.base.compat import UTC

    return CheckStatus(name=name, state=state, reason=reason, message="",
                       since=datetime(2026, 1, 1, tzinfo=UTC), since_mono=since, detail={},
                       required=False, runs=3, observed=CheckResult(state, reason),
                       last_run_mono=since + 1)


def test_the_view_reads_the_uplink_check_and_every_direct_target() -> None:
    config = loads_generic("""
[uplink]
interfaces = ["wwan0"]
[[mqtt.targets]]
name = "d1"
host = "127.0.0.1"
path = "direct"
[[mqtt.targets]]
name = "d2"
host = "127.0.0.2"
path = "direct"
[[mqtt.targets]]
name = "t"
host = "10.0.0.1"
path = "tunnel"
""")
    checks = {"uplink": status("uplink", FAIL, "stuck", 50.0),
              "d1": status("d1", FAIL, "timeout", 70.0),
              "d2": status("d2", FAIL, "timeout", 60.0),
              "t": status("t", OK, "ok", 0.0)}
    snap = Snapshot(node="n", checks=checks, started_mono=0.0, taken_mono=100.0,
                    round_complete=True)
    v = view_of(snap, config, rungs=ALL, booted_mono=-5.0)
    assert (v.uplink, v.reason, v.since) == (FAIL, "stuck", 50.0)
    assert v.direct_failed_since == 70.0  # the later of the two: *every* target failed since
    assert set(v.direct_mqtt) == {"d1", "d2"}
    checks["d2"] = status("d2", OK, "ok", 60.0)
    v = view_of(replace(snap, checks=checks), config, rungs=ALL)
    assert v.direct_failed_since is None
    assert uplink.decide(replace(v, since=-1e9), History(), 1e6, SETTINGS)[0].reason \
        == "direct_path_ok"


def test_a_stuck_right_after_no_coverage_waits_its_own_act_after() -> None:
    """The snapshot dates the *state* (failed since the coverage went), not the reason: a
    ``stuck`` that follows ``no_coverage`` counts from when the reason changed."""
    config = loads_generic('[uplink]\ninterfaces = ["wwan0"]\n[[mqtt.targets]]\nname = "d"\n'
                   'host = "127.0.0.1"\npath = "direct"\n')
    checks = {"uplink": status("uplink", FAIL, "stuck", 0.0),  # failed since 0: no_coverage
              "d": status("d", FAIL, "timeout", 0.0)}
    snap = Snapshot(node="n", checks=checks, started_mono=0.0, taken_mono=NOW,
                    round_complete=True)
    became_stuck = NOW - 10
    view = view_of(snap, config, rungs=ALL, booted_mono=-200_000.0, reason_since=became_stuck)
    assert view.since == became_stuck
    assert kinds(decide(view, History(), NOW, SETTINGS)) == [("skip", "stuck_window", "")]
    later = NOW - 10 + SETTINGS.act_after
    assert kinds(decide(view, History(), later, SETTINGS))[0][0] == "restart"


# --- the modem's own verdicts: each its own rungs ----------------------------------------

SIX = ("modem-reconnect", "radio-cycle", "link-bounce", "modemmanager-restart",
       "usb-reauthorize", "reboot")


def denied(mono: float | None, result: str = "not_recovered") -> Record:
    return Record(mono=mono, wall="2026-01-01T00:00:00.000Z", mode="radio-cycle",
                  reason="registration_denied", result=result, duration=5.0)


# (id, view overrides, history, expected [(kind, reason, rung)])
VERDICTS: list[tuple[str, dict[str, Any], History, list[tuple[str, str, str]]]] = [
    ("a vanished modem: ModemManager restarted first, without waiting act_after (the "
     "verdict already waited modem_absent_after)", {"reason": "modem_absent",
                                                    "since": NOW - 10}, History(),
     [("restart", "modem_absent", "modemmanager-restart")]),
    ("a vanished modem after the restart did not cure: the USB device",
     {"reason": "modem_absent"},
     History((attempt(NOW - 500, "modemmanager-restart"),), failures_in_row=1),
     [("restart", "modem_absent", "usb-reauthorize")]),
    ("a failed modem: ModemManager restarted first", {"reason": "modem_failed"}, History(),
     [("restart", "modem_failed", "modemmanager-restart")]),
    ("a failed modem without the restart rung on this node: the USB device",
     {"reason": "modem_failed", "rungs": ("modem-reconnect", "usb-reauthorize")}, History(),
     [("restart", "modem_failed", "usb-reauthorize")]),
    ("a vanished modem with only session rungs usable: no rung, said",
     {"reason": "modem_absent", "rungs": ("modem-reconnect", "link-bounce")}, History(),
     [("skip", "no_rung", "")]),
    ("a vanished modem while a direct-path target answers: no rung",
     {"reason": "modem_absent", "direct": {"a": OK}, "failed_since": None}, History(),
     [("skip", "direct_path_ok", "")]),
    ("a denial waits act_after (a congested cell may refuse for a while)",
     {"reason": "registration_denied", "since": NOW - 100}, History(),
     [("skip", "stuck_window", "")]),
    ("a denial past act_after: one radio-cycle", {"reason": "registration_denied"},
     History(), [("restart", "registration_denied", "radio-cycle")]),
    ("a denial the radio-cycle did not cure: the circuit opens (a person is needed)",
     {"reason": "registration_denied"}, History((denied(NOW - 500),), failures_in_row=1),
     [("open_circuit", "registration_denied", "")]),
    ("a denial again within the hour of a radio-cycle (the uplink was ok between): only "
     "said", {"reason": "registration_denied"}, History((denied(NOW - 1800, "recovered"),)),
     [("skip", "denied_once_an_hour", "")]),
    ("a denial an hour after the last radio-cycle: one more",
     {"reason": "registration_denied"}, History((denied(NOW - 3700, "recovered"),)),
     [("restart", "registration_denied", "radio-cycle")]),
    ("a denial without the radio-cycle rung: no rung", {"reason": "registration_denied",
                                                        "rungs": ("modem-reconnect",)},
     History(), [("skip", "no_rung", "")]),
    ("stuck walks its own rungs: after a new session, the radio",
     {}, History((attempt(NOW - 500),), failures_in_row=1),
     [("restart", "uplink_stuck", "radio-cycle")]),
]


@pytest.mark.parametrize(("overrides", "hist", "expected"), [c[1:] for c in VERDICTS],
                         ids=[c[0] for c in VERDICTS])
def test_each_modem_verdict_takes_its_own_rungs(overrides: dict[str, Any], hist: History,
                                                 expected: list[tuple[str, str, str]],
                                                 ) -> None:
    actions = decide(view(**{"rungs": SIX, **overrides}), hist, NOW, SETTINGS)
    assert kinds(actions) == expected
    assert all(a.message for a in actions)


@pytest.mark.parametrize("reason", ["stuck", "modem_absent", "modem_failed"])
def test_each_verdict_walks_only_its_rungs_then_opens_the_circuit(reason: str) -> None:
    clock = Clock(now=NOW)
    hist, used = History(), []
    for _ in range(12):
        (action,) = decide(view(reason=reason, rungs=SIX), hist, clock.now, SETTINGS)
        if action.kind == "restart":
            used.append(action.rung)
            hist = hist.with_record(Record(clock.now, "w", action.rung, action.reason,
                                           "not_recovered", 1.0))
        elif action.kind == "open_circuit":
            break
        clock.advance(130.0)
    want = [r for r in SIX if r in uplink.RUNGS_FOR[reason]][:SETTINGS.give_up_after]
    assert used == want
    assert "modem-reconnect" not in used or reason == "stuck"
    assert "modemmanager-restart" not in used or reason != "stuck"


def test_a_denial_is_never_more_than_one_radio_cycle_an_hour_and_never_a_reboot() -> None:
    """Two days of a network that refuses the SIM, the uplink briefly ok every 40 minutes
    (the circuit closes then, as it would): never a rung but ``radio-cycle``, never two
    within an hour."""
    clock = Clock(now=NOW)
    hist, cycles = History(), []
    for step in range(2 * 24 * 60 // 5):  # every 5 minutes
        clock.advance(300.0)
        if step % 8 == 7:  # a brief ok: the circuit closes, the streak clears
            for action in decide(view(state=OK, reason="ok", rungs=SIX), hist, clock.now,
                                 SETTINGS):
                if action.kind == "close_circuit":
                    hist = hist.closed()
            continue
        since = clock.now - 1000.0
        for action in decide(view(reason="registration_denied", rungs=SIX, since=since,
                                  failed_since=since), hist, clock.now, SETTINGS):
            assert action.kind != "restart" or action.rung == "radio-cycle", action
            if action.kind == "restart":
                cycles.append(clock.now)
                hist = hist.with_record(denied(clock.now))
            elif action.kind == "open_circuit":
                hist = hist.opened()
    assert len(cycles) >= 20  # it did act, hourly at most
    assert all(b - a >= 3600.0 for a, b in itertools.pairwise(cycles))
