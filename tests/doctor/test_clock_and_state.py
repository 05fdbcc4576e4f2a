"""Time (the kernel's NTP status, injected) and state (a real directory and a real outbox)."""

from __future__ import annotations

import os
from pathlib import Path

from edgeheal.agent.alerts.outbox import Outbox
from edgeheal.tools.doctor import clock, state
from edgeheal.tools.doctor.finding import Result
from edgeheal.tools.doctor.system import STA_UNSYNC, KernelClock, kernel_clock
from tests.doctor.support import NOW, SYNCED, UNSYNCED, config, edge


def test_a_synchronized_clock_is_ok() -> None:
    found = clock.synchronized(edge().system(clock=lambda: SYNCED))
    assert found.result is Result.OK
    assert "synchronized" in found.found


def test_a_clock_the_kernel_marks_unsynchronized_warns_with_the_fix() -> None:
    found = clock.synchronized(edge().system(clock=lambda: UNSYNCED))
    assert found.result is Result.WARN
    assert "unsynchronized" in found.found
    assert "timedatectl set-ntp true" in found.fix


def test_sta_unsync_alone_or_time_error_alone_means_unsynchronized() -> None:
    assert not KernelClock(0, STA_UNSYNC, 0, 0).synchronized
    assert not KernelClock(5, 0, 0, 0).synchronized
    assert KernelClock(0, 0, 0, 0).synchronized


def test_a_clock_before_this_software_existed_fails() -> None:
    found = clock.synchronized(edge().system(wall=lambda: 0.0))
    assert found.result is Result.FAIL
    assert "1970-01-01" in found.found


def test_the_real_adjtimex_is_read_without_changing_anything() -> None:
    before = kernel_clock()
    after = kernel_clock()
    assert 0 <= before.state <= 5
    assert before.status == after.status  # modes = 0: nothing was set


def test_a_missing_state_dir_says_systemd_makes_it(tmp_path: Path) -> None:
    found = state.directory(config(state_dir=str(tmp_path / "state")))
    assert found.result is Result.WARN
    assert "StateDirectory=" in found.found


def test_a_writable_state_dir_is_ok_and_left_as_it_was(tmp_path: Path) -> None:
    found = state.directory(config(state_dir=str(tmp_path)))
    assert found.result is Result.OK
    assert found.detail["free_bytes"] > 0
    assert list(tmp_path.iterdir()) == []


def test_a_file_where_the_directory_should_be_fails(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")
    found = state.directory(config(state_dir=str(tmp_path / "state")))
    assert found.result is Result.FAIL


def test_little_free_space_fails(tmp_path: Path, monkeypatch: object) -> None:
    real = os.statvfs

    class Small:
        def __init__(self, path: object) -> None:
            s = real(path)  # type: ignore[arg-type]
            self.f_frsize, self.f_bavail = s.f_frsize, (8 << 20) // s.f_frsize

    monkeypatch.setattr(state.os, "statvfs", Small)  # type: ignore[attr-defined]
    found = state.directory(config(state_dir=str(tmp_path)))
    assert found.result is Result.FAIL
    assert "8 MiB free" in found.found


def test_the_outbox_depth_and_oldest_are_read_without_writing(tmp_path: Path) -> None:
    box = Outbox(tmp_path / state.OUTBOX_FILE, max_count=100, max_age=86400.0)
    box.add("a1", "wireguard.dead", NOW - 3600, b"{}")
    box.add("a2", "wireguard.recovered", NOW - 60, b"{}")
    box.close()
    files = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    found = state.outbox(config(state_dir=str(tmp_path)), edge().system())
    assert found.result is Result.WARN  # an hour-old alert is not being delivered
    assert found.detail == {"depth": 2, "oldest_age_seconds": 3600.0}
    assert "2 alert(s) waiting, the oldest 60 min old" in found.found
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == files


def test_an_empty_outbox_is_ok(tmp_path: Path) -> None:
    Outbox(tmp_path / state.OUTBOX_FILE, max_count=100, max_age=86400.0).close()
    found = state.outbox(config(state_dir=str(tmp_path)), edge().system())
    assert (found.result, found.detail["depth"]) == (Result.OK, 0)


def test_a_corrupt_outbox_fails(tmp_path: Path) -> None:
    (tmp_path / state.OUTBOX_FILE).write_bytes(b"not a database" * 100)
    found = state.outbox(config(state_dir=str(tmp_path)), edge().system())
    assert found.result is Result.FAIL


def test_the_outbox_of_a_running_agent_is_read_alongside_it(tmp_path: Path) -> None:
    box = Outbox(tmp_path / state.OUTBOX_FILE, max_count=100, max_age=86400.0)
    try:
        box.add("a1", "wireguard.dead", NOW - 5, b"{}")
        names = sorted(p.name for p in tmp_path.iterdir())
        found = state.outbox(config(state_dir=str(tmp_path)), edge().system())
        assert (found.result, found.detail["depth"]) == (Result.OK, 1)
        assert sorted(p.name for p in tmp_path.iterdir()) == names
        box.add("a2", "wireguard.recovered", NOW - 1, b"{}")  # the writer is undisturbed
        assert box.depth() == 2
    finally:
        box.close()
