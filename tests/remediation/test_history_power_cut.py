"""What tests/qemu/test_power_cut.py found in the state files, each pinned here without a
VM: a save that returned must survive a power cut (the directory is fsynced after the
rename), and the temporary file of a save a cut interrupted is removed at the next start.
The run marker's name is fsynced too (found reading the code while writing that test: its
``agent.started`` after each cut must say ``unclean``)."""

from __future__ import annotations

import logging
import math
import os
import stat
from pathlib import Path

import pytest

from edgeheal.agent.remediation import history
from edgeheal.agent.remediation.history import HISTORY_FILE, Store, Timeline
from edgeheal.base import statefile
from edgeheal.core.flannel_ladder import History


def test_a_save_fsyncs_the_directory_after_the_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without it ext4 commits the rename with its next journal commit (up to 5 s): a cut
    in between brings the old history back although the save returned."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str, dst: str | os.PathLike[str]) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    history.save(tmp_path / HISTORY_FILE, History(paused_until=math.inf), Timeline("b", 0.0))
    assert events == ["fsync file", "rename", "fsync dir"]


def test_the_temporary_file_a_power_cut_left_is_removed_at_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tl = Timeline("b", 0.0)
    history.save(tmp_path / HISTORY_FILE, History(paused_until=math.inf), tl)
    # what the cut left: a save's temp file, created and written, never renamed
    (tmp_path / f".{HISTORY_FILE}.8wdu5ks3").write_text('{"format": 1, "recor')
    (tmp_path / ".uplink-history.json.x1").write_text("")  # another file's: not ours
    (tmp_path / f".{HISTORY_FILE}.dir").mkdir()  # not a regular file: left alone
    os.symlink("/etc/passwd", tmp_path / f".{HISTORY_FILE}.link")  # nor a symlink
    with caplog.at_level(logging.WARNING, logger="edgeheal.remediation.history"):
        loaded = Store(tmp_path, tl).load()
    assert loaded.paused_until == math.inf  # the history itself is read as saved
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [HISTORY_FILE, ".uplink-history.json.x1", f".{HISTORY_FILE}.dir",
         f".{HISTORY_FILE}.link"])
    assert os.path.exists("/etc/passwd")
    (record,) = [r for r in caplog.records if "temporary file" in r.getMessage()]
    assert f".{HISTORY_FILE}.8wdu5ks3" in record.getMessage()


def test_sweeping_a_state_dir_that_cannot_be_listed_removes_nothing(tmp_path: Path) -> None:
    assert statefile.sweep_temporary(tmp_path / "missing" / HISTORY_FILE) == []


def test_the_run_marker_fsyncs_the_directory_after_creating_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``agent.started`` says ``unclean`` after a power cut only if the marker's name was
    on disk: a cut right after the start (before ext4's next commit) lost it."""
    from edgeheal.agent.alerts import markers

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    markers.mark_running(tmp_path)
    assert synced == ["file", "dir"]
    assert markers.previous_run(tmp_path, outbox_existed=True) == "unclean"
