"""The persisted remediation history: round trips, corrupt files, an agent killed in a
loop, wall-clock steps, new boots. The decisions are the pure policy's; only the file and
the timeline mapping are under test here."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from edgeheal.agent.remediation import history
from edgeheal.agent.remediation.history import Timeline
from edgeheal.core import flannel_ladder as policy
from edgeheal.core.flannel_ladder import History, Record, decide
from tests.remediation.test_policy import MODES, SETTINGS, restart_at, view


def test_the_history_round_trips_through_the_state_file(tmp_path: Path) -> None:
    tl = Timeline(boot_id="boot-a", offset=500.0)
    h = History(records=(restart_at(100.0), restart_at(300.0, "recovered")),
                failures_in_row=2, circuit_open=True, paused_until=900.0)
    history.save(tmp_path / "h.json", h, tl)
    assert history.load(tmp_path / "h.json", tl) == h
    assert not list(tmp_path.glob(".h.json.*"))  # the temp file was renamed, not left


def test_a_missing_state_file_is_an_empty_history(tmp_path: Path) -> None:
    assert history.load(tmp_path / "none.json", Timeline("b", 0.0)) == History()


def test_a_corrupt_state_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    path.write_text("{not json")
    with pytest.raises(history.HistoryError, match=r"remediation history .*h\.json: not JSON"):
        history.load(path, Timeline("b", 0.0))
    path.write_text(json.dumps({"version": 1}))
    with pytest.raises(history.HistoryError, match="malformed"):
        history.load(path, Timeline("b", 0.0))


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_killed_and_restarted_in_a_loop_cannot_exceed_the_budget(
        tmp_path: Path, mode: str) -> None:
    """Each incarnation starts on a new monotonic offset (a new process on the same boot),
    waits out its startup grace, restarts Flannel once and is killed. The budget holds."""
    settings = replace(SETTINGS, give_up_after=100, startup_grace=5.0, cooldown=10.0)
    path = tmp_path / "h.json"
    boottime = 1000.0
    restarts_at_boottime: list[float] = []
    for incarnation in range(20):
        tl = Timeline(boot_id="boot-a", offset=boottime - 7.0 * incarnation)  # mono differs
        mono = boottime - tl.offset
        started = mono
        h = history.load(path, tl)
        for _ in range(30):  # 30 s of this incarnation's life, then kill -9
            actions = decide(view(mode, started=started), h, mono, settings)
            if actions[0].kind == "restart":
                restarts_at_boottime.append(tl.to_boot(mono))
                h = h.with_record(restart_at(mono))
                history.save(path, h, tl)
            mono += 1.0
        boottime = tl.to_boot(mono) + 1.0
    assert boottime - 1000.0 < 3600  # all of it within one hour
    assert len(restarts_at_boottime) == settings.max_per_hour


def test_a_wall_clock_step_changes_nothing(tmp_path: Path) -> None:
    """Records carry wall time for humans only; the windows use boottime."""
    tl = Timeline(boot_id="boot-a", offset=0.0)
    h = History(records=(Record(mono=1000.0, wall="1970-01-01T00:00:00.000Z", mode="pod",
                                reason="x", result="not_recovered", duration=1.0),))
    history.save(tmp_path / "h.json", h, tl)
    raw = json.loads((tmp_path / "h.json").read_text())
    raw["records"][0]["wall"] = "2099-12-31T00:00:00.000Z"  # the clock jumped ahead
    (tmp_path / "h.json").write_text(json.dumps(raw))
    loaded = history.load(tmp_path / "h.json", Timeline(boot_id="boot-a", offset=-50.0))
    assert loaded.records[0].mono == 1050.0  # same instant on the new process's timeline
    (action,) = decide(view("pod"), loaded, 1100.0, SETTINGS)
    assert (action.kind, action.reason) == ("skip", "cooldown")


def test_a_new_boot_keeps_the_circuit_but_not_the_time_windows(tmp_path: Path) -> None:
    old = Timeline(boot_id="boot-a", offset=0.0)
    h = History(records=(restart_at(100.0), restart_at(200.0), restart_at(300.0)),
                failures_in_row=3, circuit_open=True, paused_until=400.0)
    history.save(tmp_path / "h.json", h, old)
    new = history.load(tmp_path / "h.json", Timeline(boot_id="boot-b", offset=0.0))
    assert [r.mono for r in new.records] == [None, None, None]
    assert new.circuit_open
    assert new.failures_in_row == 3
    assert new.paused_until is None  # a timed pause ends with the boot
    assert policy.budget_left(new, 10.0, SETTINGS) == SETTINGS.max_per_hour
    # right after the boot, startup grace holds anyway
    fresh = replace(new, circuit_open=False, failures_in_row=0)
    (action,) = decide(view("pod", booted=0.0, started=5.0), fresh, 10.0, SETTINGS)
    assert action.reason == "startup_grace"


def test_an_indefinite_pause_survives_a_reboot(tmp_path: Path) -> None:
    history.save(tmp_path / "h.json", History(paused_until=math.inf), Timeline("a", 0.0))
    assert history.load(tmp_path / "h.json", Timeline("b", 0.0)).paused_until == math.inf


def test_an_attempt_is_counted_before_it_finishes_and_completed_in_place() -> None:
    h = History().with_record(restart_at(10.0, "in_progress"))
    assert h.failures_in_row == 1  # counted while in flight
    assert policy.budget_left(h, 20.0, SETTINGS) == SETTINGS.max_per_hour - 1
    done = h.finished(restart_at(10.0, "recovered"))
    assert [r.result for r in done.records] == ["recovered"]
    assert done.failures_in_row == 0
    failed = h.finished(restart_at(10.0, "not_recovered"))
    assert [r.result for r in failed.records] == ["not_recovered"]
    assert failed.failures_in_row == 1


def test_an_attempt_in_flight_when_the_agent_died_reads_back_as_interrupted(
        tmp_path: Path) -> None:
    tl = Timeline(boot_id="boot-a", offset=0.0)
    history.save(tmp_path / "h.json", History().with_record(restart_at(990.0, "in_progress")),
                tl)
    loaded = history.load(tmp_path / "h.json", tl)
    assert [r.result for r in loaded.records] == ["interrupted"]
    assert loaded.failures_in_row == 1
    (action,) = decide(view("pod"), loaded, 1000.0, SETTINGS)
    assert action.reason == "cooldown"


def test_the_uplink_settle_flag_round_trips_on_the_same_boot_only(tmp_path: Path) -> None:
    tl = Timeline(boot_id="boot-a", offset=0.0)
    history.save(tmp_path / "h.json", History(direct_was_down=True), tl)
    assert history.load(tmp_path / "h.json", tl).direct_was_down
    # a new boot starts without an outage seen: its first ok is the node starting
    assert not history.load(tmp_path / "h.json", Timeline("boot-b", 0.0)).direct_was_down


def test_a_history_file_from_before_the_flag_reads_as_no_outage_seen(tmp_path: Path) -> None:
    tl = Timeline(boot_id="boot-a", offset=0.0)
    history.save(tmp_path / "h.json", History(), tl)
    raw = json.loads((tmp_path / "h.json").read_text())
    del raw["direct_was_down"]
    (tmp_path / "h.json").write_text(json.dumps(raw))
    assert history.load(tmp_path / "h.json", tl) == History()
