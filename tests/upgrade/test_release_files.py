"""Issue 28 item 4: state files carry a format version; 0.2.0's are read, a newer one is
left alone.

The fixtures under ``fixtures/release-0.2.0`` were written by release 0.2.0's own code
(``make_fixtures.py``), before any state file carried a format. The current code must read
them with nothing lost: the queued alerts delivered, the open problem continued, both
histories' budget, circuit, pause and records intact; the next write stamps the format.

A file of a newer format (an older build installed over a newer one's state) must never be
misread or overwritten. The issue asked for a refusal; edgeheal gates every collector's
readiness, so a refusal would be the outage itself: the agent runs on with that piece of
state in memory and says so (log once, ``/status``, ``edgeheal_state_file_newer``,
``agent.state_newer``). Both are proven through a real ``edgeheal run`` and a real
Mosquitto, and at the level of each file.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from edgeheal.agent.alerts import lifecycle, outbox_file
from edgeheal.agent.alerts.outbox import Outbox
from edgeheal.agent.alerts.outbox_file import FORMAT as OUTBOX_FORMAT
from edgeheal.agent.remediation.history import FORMAT as HISTORY_FORMAT
from edgeheal.agent.remediation.history import Store, Timeline
from edgeheal.base import statefile
from edgeheal.base.statefile import NewerFormat, StateFileError
from edgeheal.cli.status import render_status
from edgeheal.lab.mosquitto import Mosquitto, free_port
from edgeheal.lab.netns import Sandbox
from edgeheal.tools.doctor import state
from edgeheal.tools.doctor.finding import Result
from tests.doctor.support import config as doctor_config
from tests.hardening.test_agent_process import AgentProcess, get, wait_serving, write_config
from tests.support import wait_until
from tests.upgrade.make_fixtures import BOOT_ID, OFFSET, PROBLEM, QUEUED

FIXTURES = Path(__file__).parent / "fixtures" / "release-0.2.0"
FILES = ("alerts.sqlite3", "remediation-history.json", "uplink-history.json")


def _copy(state: Path) -> None:
    state.mkdir(mode=0o700, exist_ok=True)
    for name in FILES:
        shutil.copyfile(FIXTURES / name, state / name)
        (state / name).chmod(0o600)


def _user_version(path: Path) -> int:
    db = sqlite3.connect(f"{path.as_uri()}?immutable=1", uri=True)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _make_newer(state: Path) -> dict[str, str]:
    """Turn the copied files into a later release's (format 2); return their digests."""
    db = sqlite3.connect(state / "alerts.sqlite3")
    db.execute(f"PRAGMA user_version = {OUTBOX_FORMAT + 1}")
    db.close()
    for name in FILES[1:]:
        data = json.loads((state / name).read_text())
        data["format"] = HISTORY_FORMAT + 1
        data["failures_in_row"] = "whatever format 2 means by it"
        (state / name).write_text(json.dumps(data))
    assert not (state / "alerts.sqlite3-wal").exists()
    return {name: _digest(state / name) for name in FILES}


# --- each file on its own --------------------------------------------------------------------

def test_the_fixtures_are_release_0_2_0s_files_without_a_format() -> None:
    assert _user_version(FIXTURES / "alerts.sqlite3") == 0
    for name in FILES[1:]:
        assert "format" not in json.loads((FIXTURES / name).read_text())


def test_0_2_0s_histories_are_read_with_budget_circuit_and_pause_intact(tmp_path: Path) -> None:
    _copy(tmp_path)
    timeline = Timeline(BOOT_ID, OFFSET)  # the boot that wrote them: records count
    flannel = Store(tmp_path, timeline).load()
    assert flannel.circuit_open
    assert flannel.failures_in_row == 2
    assert flannel.paused_until == math.inf
    assert [(r.mono, r.result, r.target) for r in flannel.records] == [
        (10.0, "not_recovered", "kube-flannel/kube-flannel-ds-a"),
        (400.0, "interrupted", "kube-flannel/kube-flannel-ds-b")]
    assert len(flannel.restarts_within(500.0)) == 2  # the budget sees both
    store = Store(tmp_path, timeline, name="uplink-history.json")
    uplink = store.load()
    assert uplink.failures_in_row == 1
    assert uplink.direct_was_down
    assert [(r.action, r.target, r.mono) for r in uplink.records] == [
        ("modem-reset", "wwan0", 200.0)]
    assert store.reset is None
    assert store.newer is None
    store.save(uplink)  # the next write migrates: the format is stamped, nothing lost
    data = json.loads((tmp_path / "uplink-history.json").read_text())
    assert data["format"] == HISTORY_FORMAT
    assert Store(tmp_path, timeline, name="uplink-history.json").load() == uplink


def test_0_2_0s_outbox_is_read_whole_and_stamped_with_its_format(tmp_path: Path) -> None:
    _copy(tmp_path)
    box = Outbox(tmp_path / "alerts.sqlite3", max_count=100, max_age=3650 * 86400.0)
    try:
        assert box.fault is None
        assert box.resets == []
        assert [e.id for e in box.entries()] == list(QUEUED)
        problems = lifecycle.restore(box.get_meta("problems") or "", now=0.0)
        assert problems.open["wireguard"].to_json() == PROBLEM.to_json()
    finally:
        box.close()
    assert _user_version(tmp_path / "alerts.sqlite3") == OUTBOX_FORMAT


def test_a_newer_outbox_is_never_written_and_alerts_wait_in_memory(tmp_path: Path) -> None:
    _copy(tmp_path)
    digest = _make_newer(tmp_path)["alerts.sqlite3"]
    box = Outbox(tmp_path / "alerts.sqlite3", max_count=100, max_age=3600.0)
    box.add("a1", "agent.test", time.time(), b"{}")
    box.set_meta("problems", "")
    assert box.fault == "newer_format"
    assert box.newer is not None
    assert box.newer.found == OUTBOX_FORMAT + 1
    assert box.memory_depth == 1
    assert box.entries()[0].id == "a1"
    assert box.retry(force=True) is False
    assert box.close() == 1  # lost with the process, and said
    assert _digest(tmp_path / "alerts.sqlite3") == digest
    assert not list(tmp_path.glob("alerts.sqlite3*corrupt*"))
    assert not (tmp_path / "alerts.sqlite3-wal").exists()


def test_a_newer_history_is_never_read_nor_written(tmp_path: Path) -> None:
    _copy(tmp_path)
    digest = _make_newer(tmp_path)["remediation-history.json"]
    store = Store(tmp_path, Timeline(BOOT_ID, OFFSET))
    history = store.load()
    assert history.records == ()
    assert store.reset is None
    assert store.newer is not None
    assert store.newer.detail() == {
        "file": "remediation-history.json", "format": 2, "known_format": 1}
    store.save(history)
    assert _digest(tmp_path / "remediation-history.json") == digest
    assert not list(tmp_path.glob("*.corrupt-*"))


@pytest.mark.parametrize("value", ["2", 0, -1, 1.0, True, None])
def test_a_format_that_is_not_a_format_number_is_a_damaged_file(value: object) -> None:
    with pytest.raises(StateFileError) as caught:
        statefile.format_of({"format": value}, what="x.json", known=1)
    assert not isinstance(caught.value, NewerFormat)
    assert "format" in caught.value.reason


# --- through the real agent and a real broker ------------------------------------------------

def _agent(sandbox: Sandbox, tmp_path: Path, broker: Mosquitto) -> tuple[AgentProcess, int]:
    port = free_port()
    extra = (f'[[mqtt.targets]]\nname = "broker"\nhost = "127.0.0.1"\nport = {broker.port}\n'
             'keepalive = "2s"\ntimeout = "2s"\n'
             '[alerts]\ntarget = "broker"\nreconnect_max = "1s"\noutbox_max_age = "365d"\n')
    cfg = write_config(tmp_path / "edgeheal.toml", tmp_path / "state", port, extra)
    agent = AgentProcess(sandbox, tmp_path, cfg, name="agent")
    wait_serving(agent, port)
    return agent, port


def _received(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        topic, _, payload = line.partition(" ")
        if topic.endswith("/alerts"):
            out.append(json.loads(payload))
    return out


@pytest.mark.daemon  # mosquitto
def test_an_upgrade_delivers_0_2_0s_queued_alerts_and_keeps_the_circuit(
        sandbox: Sandbox, tmp_path: Path) -> None:
    state = tmp_path / "state"
    _copy(state)
    db = sqlite3.connect(state / "alerts.sqlite3")  # aged by the calendar, not the upgrade
    db.execute("UPDATE outbox SET raised = ?", (time.time(),))
    db.commit()
    db.close()
    broker = Mosquitto(sandbox, tmp_path)
    broker.start()
    received = tmp_path / "received.txt"
    broker.subscribe("edgeheal/+/alerts", received)
    agent, port = _agent(sandbox, tmp_path, broker)
    wait_until(lambda: {a["id"] for a in _received(received)} >= set(QUEUED), within=30,
               what="the alerts queued by 0.2.0 to arrive")
    ids = [a["id"] for a in _received(received)]
    assert ids[:3] == list(QUEUED), ids  # first, in the order 0.2.0 raised them
    status = json.loads(get(port, "/status")[1])
    assert status["remediation"]["circuit"] == "open", status["remediation"]
    assert status["remediation"]["failures_in_row"] == 2
    assert status["remediation"]["paused_until"] == "indefinite"
    assert "state_files" not in status
    assert agent.stop() == 0, agent.log[-3000:]
    assert "newer" not in agent.log
    assert "state_reset" not in agent.log
    assert _user_version(state / "alerts.sqlite3") == OUTBOX_FORMAT
    history = json.loads((state / "remediation-history.json").read_text())
    assert history["circuit_open"] is True
    assert history["failures_in_row"] == 2
    assert [r["target"] for r in history["records"]] == [
        "kube-flannel/kube-flannel-ds-a", "kube-flannel/kube-flannel-ds-b"]


@pytest.mark.daemon  # mosquitto
def test_a_downgrade_serves_says_it_once_and_leaves_the_newer_files_untouched(
        sandbox: Sandbox, tmp_path: Path) -> None:
    state = tmp_path / "state"
    _copy(state)
    before = _make_newer(state)
    broker = Mosquitto(sandbox, tmp_path)
    broker.start()
    received = tmp_path / "received.txt"
    broker.subscribe("edgeheal/+/alerts", received)
    agent, port = _agent(sandbox, tmp_path, broker)
    assert get(port, "/readyz")[0] == 200
    wait_until(lambda: sum(a["kind"] == "agent.state_newer" for a in _received(received))
               >= 2, within=30, what="agent.state_newer for the outbox and the history")
    newer = [a for a in _received(received) if a["kind"] == "agent.state_newer"]
    assert sorted(a["detail"]["file"] for a in newer) == [  # type: ignore[index]
        "alerts.sqlite3", "remediation-history.json"]
    assert any(a["kind"] == "agent.started" for a in _received(received))  # from memory
    status = json.loads(get(port, "/status")[1])
    assert sorted(n["file"] for n in status["state_files"]["newer"]) == [
        "alerts.sqlite3", "remediation-history.json"]
    assert status["alerts"]["outbox"]["state"] == "newer_format"
    assert status["remediation"]["circuit"] == "closed"  # not misread from the file
    metrics = get(port, "/metrics")[1]
    assert 'edgeheal_state_file_newer{file="alerts.sqlite3"} 1.0' in metrics
    assert 'edgeheal_state_file_newer{file="remediation-history.json"} 1.0' in metrics
    assert agent.stop() == 0, agent.log[-3000:]
    errors = [line for line in agent.log.splitlines() if "level=error" in line]
    for name in ("alerts.sqlite3", "remediation-history.json"):  # logged once each
        assert sum(f"{name} is in format 2" in line for line in errors) == 1, errors
    assert {name: _digest(state / name) for name in FILES} == before
    assert not list(state.glob("*corrupt*"))


def test_doctor_reads_the_formats_and_warns_of_a_newer_file_touching_nothing(
        tmp_path: Path) -> None:
    _copy(tmp_path)
    found = state.formats(doctor_config(state_dir=str(tmp_path)))
    assert found.result is Result.OK
    assert found.detail["formats"] == dict.fromkeys(FILES, 1)  # 0.2.0's: format 1
    before = _make_newer(tmp_path)
    found = state.formats(doctor_config(state_dir=str(tmp_path)))
    assert found.result is Result.WARN
    assert [n["file"] for n in found.detail["newer"]] == list(FILES)
    assert "downgrade" in found.found
    assert {name: _digest(tmp_path / name) for name in FILES} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)


def test_edgeheal_status_says_which_state_file_is_newer() -> None:
    doc = {"node": "n", "version": "v", "uptime_seconds": 1, "ready": True, "checks": {},
           "actions": [], "state_files": {"newer": [
               {"file": "alerts.sqlite3", "format": 2, "known_format": 1}, "junk"]}}
    text = render_status(doc)
    assert "state file alerts.sqlite3 is in format 2, newer than this agent reads " \
        "(up to 1)" in text
    assert "state file" not in render_status({**doc, "state_files": {"newer": "x"}})


def test_the_outbox_format_is_read_through_a_relative_path_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _copy(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert outbox_file.format_of(Path("alerts.sqlite3")) == 0
    assert outbox_file.format_of(Path("missing.sqlite3")) is None
