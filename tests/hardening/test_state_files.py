"""Issue 27, findings 3 and 10: one bad value in a state file crash-looped the agent.

An outbox row whose payload is TEXT or NULL, an open-problems record that is a JSON list
or 100,000 levels deep, a remediation history 100,000 levels deep or with
``failures_in_row: 1e400``: each made ``edgeheal run`` exit 1 on every start. Now every
state file goes through :mod:`edgeheal.base.statefile` (a size cap, a depth cap, a shape
check): what fails is moved aside, logged once and raised as ``agent.state_reset`` (the
file and the reason in ``detail``), and the agent starts and serves its probes. Each case
runs a real agent process on a state directory damaged that way.

Finding 10: an outbox whose AUTOINCREMENT is used up was reported as ``disk_full``; it is
``seq_exhausted`` now, and numbering starts again once the queued rows are delivered.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgeheal.agent.alerts import lifecycle
from edgeheal.agent.alerts.outbox import Outbox
from edgeheal.agent.alerts.outbox_file import SCHEMA, SEQ_MAX
from edgeheal.agent.remediation.history import HistoryError, Timeline, load
from edgeheal.base import statefile
from edgeheal.base.statefile import StateFileError
from edgeheal.lab.mosquitto import free_port
from edgeheal.lab.netns import Sandbox
from tests.hardening.test_agent_process import AgentProcess, get, wait_serving, write_config

DEEP = "[" * 100_000 + "]" * 100_000
LOOSE_SCHEMA = SCHEMA.replace("payload BLOB NOT NULL", "payload BLOB")


def _outbox_with(state: Path, *, rows: tuple[object, ...] = (), problems: str = "") -> None:
    db = sqlite3.connect(state / "alerts.sqlite3")
    db.executescript(LOOSE_SCHEMA)
    for i, payload in enumerate(rows):
        db.execute("INSERT INTO outbox (id, kind, raised, payload) VALUES (?, ?, ?, ?)",
                   (f"bad-{i}", "agent.test", time.time(), payload))
    db.execute("INSERT INTO outbox (id, kind, raised, payload) VALUES "
               "('good', 'agent.test', ?, X'7b7d')", (time.time(),))  # not pruned for age
    if problems:
        db.execute("INSERT INTO meta (key, value) VALUES ('problems', ?)", (problems,))
    db.commit()
    db.close()


def _history(state: Path, text: str) -> None:
    (state / "remediation-history.json").write_text(text)


HISTORY_1E400 = ('{"version": 1, "boot_id": "x", "failures_in_row": 1e400, '
                 '"circuit_open": false, "paused_until_boottime": null, "records": []}')

DAMAGE: dict[str, tuple[Callable[[Path], None], str, str]] = {
    # case -> (how the state dir is damaged, the file named in detail, words of the reason)
    "outbox rows with a NULL and a TEXT payload": (
        lambda s: _outbox_with(s, rows=(None, "text")), "alerts.sqlite3", "wrong types"),
    "open problems that are a JSON list": (
        lambda s: _outbox_with(s, problems="[1, 2]"), "open problems", "JSON array"),
    "open problems 100,000 levels deep": (
        lambda s: _outbox_with(s, problems=DEEP), "open problems", "levels deep"),
    "a history 100,000 levels deep": (
        lambda s: _history(s, DEEP), "remediation-history.json", "levels deep"),
    "a history with failures_in_row 1e400": (
        lambda s: _history(s, HISTORY_1E400), "remediation-history.json", "out of range"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_state_file_is_moved_aside_alerted_and_the_agent_serves(
        sandbox: Sandbox, tmp_path: Path, case: str) -> None:
    damage, file, reason = DAMAGE[case]
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    damage(state)
    port = free_port()
    cfg = write_config(tmp_path / "edgeheal.toml", state, port)
    agent = AgentProcess(sandbox, tmp_path, cfg, name="agent")
    wait_serving(agent, port)
    assert get(port, "/livez")[0] == 200
    assert agent.stop() == 0, agent.log[-3000:]
    db = sqlite3.connect(f"file:{state / 'alerts.sqlite3'}?mode=ro", uri=True)
    try:
        resets = [json.loads(p) for k, p in db.execute("SELECT kind, payload FROM outbox")
                  if k == "agent.state_reset"]
        kinds = [k for (k,) in db.execute("SELECT kind FROM outbox")]
    finally:
        db.close()
    assert len(resets) == 1, (kinds, agent.log[-3000:])
    detail = resets[0]["detail"]
    assert file in detail["file"]
    assert reason in detail["reason"]
    assert agent.log.count("level=error") == 1, agent.log  # logged once
    if file.endswith(".json"):
        assert (state / detail["moved_to"]).read_text() == (
            DEEP if "deep" in case else HISTORY_1E400)
    elif file == "alerts.sqlite3":
        aside = sqlite3.connect(state / detail["moved_to"])
        assert aside.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 2
        aside.close()
        assert "agent.test" in kinds  # the good row stayed, in place


@pytest.mark.parametrize("raw", [DEEP, "[1]", '{"a": [1]}', '{"a": {"kind": 1}}', "nope",
                                 '{"a": ' * 40 + "1" + "}" * 40, "\"x\"", "NaN", "1e400"])
def test_the_open_problems_refuse_anything_record_does_not_write(raw: str) -> None:
    with pytest.raises(StateFileError):
        lifecycle.restore(raw, now=0.0)


def test_the_open_problems_record_round_trips() -> None:
    problem = lifecycle.Problem("c", "k", "r", "failed", "dead", "2026-01-01T00:00:00Z", 0.0)
    state = lifecycle.Problems({"wireguard": problem})
    again = lifecycle.restore(lifecycle.record(state), now=5.0)
    assert again.open["wireguard"].kind == "k"


@pytest.mark.parametrize("text", [
    DEEP, HISTORY_1E400, "[]", "null", HISTORY_1E400.replace("1e400", "true"),
    HISTORY_1E400.replace("1e400", "-1"), HISTORY_1E400.replace("1e400", "1.5"),
    HISTORY_1E400.replace('"records": []', '"records": [1]'),
    HISTORY_1E400.replace('"records": []', '"records": "abc"'), "\udcff{}", "{" + " " * 2**21])
def test_a_history_that_save_never_writes_is_a_history_error(tmp_path: Path,
                                                             text: str) -> None:
    path = tmp_path / "remediation-history.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(HistoryError):
        load(path, Timeline("x", 0.0))


def test_a_state_file_that_is_a_symlink_or_a_fifo_is_refused_not_followed(
        tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    (tmp_path / "link.json").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(StateFileError, match="symlink"):
        statefile.read(tmp_path / "link.json")
    with pytest.raises(StateFileError, match="regular file"):
        statefile.read(tmp_path / "fifo.json")
    assert statefile.read(tmp_path / "missing.json") is None


def test_an_exhausted_outbox_sequence_is_told_apart_from_a_full_disk(tmp_path: Path) -> None:
    path = tmp_path / "alerts.sqlite3"
    box = Outbox(path, max_count=100, max_age=3600)
    box.add("first", "agent.test", 1.0, b"{}")
    box._db.execute("UPDATE sqlite_sequence SET seq = ?", (SEQ_MAX,))  # type: ignore[union-attr]
    box.add("second", "agent.test", 2.0, b"{}")
    assert box.fault == "seq_exhausted"
    assert "AUTOINCREMENT" in box.fault_message
    assert box.memory_depth == 1
    first = box.oldest()
    assert first is not None
    box.delete(first.seq)  # delivered: the table is empty, numbering can start again
    assert box.retry(force=True)
    assert box.fault is None
    assert [e.id for e in box.entries()] == ["second"]
    assert box.entries()[0].seq == 1
    box.close()
