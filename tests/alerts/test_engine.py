"""The engine without a broker: what is raised, when, with which correlation, and bounds."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from edgeheal.agent.alerts import engine as engine_mod
from edgeheal.agent.alerts.engine import AlertEngine
from edgeheal.agent.alerts.kinds import KINDS
from edgeheal.agent.alerts.payload import Alert, UlidFactory, build, ulid_time_ms
from edgeheal.model import Event, State
from tests.alerts.support import Harness, harness, snapshot, status, validate
from tests.support import Clock

REMIND = 'reminder_interval = "10m"'


def _engine(h: Harness) -> AlertEngine:
    return AlertEngine(h.ctx, link=h.link)


def _alerts(engine: AlertEngine) -> list[Alert]:
    return [Alert.decode(e.payload) for e in engine.outbox.entries()]


def _kinds(engine: AlertEngine, skip: tuple[str, ...] = ("agent.started",)) -> list[str]:
    return [a.kind for a in _alerts(engine) if a.kind not in skip]


def _sample(registry: Any, name: str, labels: dict[str, str] | None = None) -> float:
    value = registry.get_sample_value(name, labels or {})
    return float(value or 0.0)


# --- ids and payloads -------------------------------------------------------------------

def test_ids_sort_in_the_order_alerts_were_raised_even_within_one_millisecond() -> None:
    ids = UlidFactory()
    clock = Clock()
    made = [ids(clock.wall()) for _ in range(1000)]
    assert made == sorted(made)
    assert len(set(made)) == 1000
    assert all(re.fullmatch(r"[0-9A-HJKMNP-TV-Z]{26}", i) for i in made)
    assert ulid_time_ms(made[0]) == int(clock.wall().timestamp() * 1000)


def test_a_payload_validates_against_the_schema_and_says_when_it_was_raised() -> None:
    clock = Clock()
    alert = build("wireguard.dead", node="edge-7", message="m", wall=clock.wall(),
                  detail={"peer": "abc"})
    doc = json.loads(alert.encode())
    validate(doc, "alert.schema.json")
    assert doc["time"] == "2026-12-02T20:00:00.000Z"
    assert doc["correlation"] == doc["id"]
    assert doc["severity"] == "critical"


def test_an_unknown_kind_is_a_programming_error() -> None:
    with pytest.raises(KeyError, match=r"not\.a_kind"):
        build("not.a_kind", node="n", message="m", wall=Clock().wall())


def test_the_schema_lists_exactly_the_kinds_table() -> None:
    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" /
                         "alert.schema.json").read_text())
    assert schema["properties"]["kind"]["enum"] == sorted(KINDS)


def test_the_docs_list_every_kind_with_its_severity() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "alerts.md").read_text()
    for kind, spec in KINDS.items():
        assert re.search(rf"`{re.escape(kind)}`\s*\|\s*{spec.severity}", text), kind


# --- start-up ---------------------------------------------------------------------------

def test_agent_started_says_whether_the_previous_run_ended_cleanly(tmp_path: Path) -> None:
    first = _engine(harness(tmp_path))
    assert _alerts(first)[0].detail["previous_run"] == "none"
    first.outbox.close()  # "killed": the running marker stays behind
    second = _engine(harness(tmp_path))
    assert [a.detail["previous_run"] for a in _alerts(second)
            if a.kind == "agent.started"] == ["none", "unclean"]
    second.outbox.close()


async def test_a_clean_close_is_reported_at_the_next_start(tmp_path: Path) -> None:
    first = _engine(harness(tmp_path))
    await first.close()
    assert not (tmp_path / "state" / engine_mod.RUNNING_MARKER).exists()
    second = _engine(harness(tmp_path))
    assert _alerts(second)[-1].detail["previous_run"] == "clean"
    await second.close()


# --- transitions, reminders, recovery ----------------------------------------------------

async def test_a_problem_opens_once_reminds_and_clears_with_one_correlation(
        tmp_path: Path) -> None:
    h = harness(tmp_path, f"[alerts]\n{REMIND}\n")
    engine = _engine(h)
    ok = status("wireguard", State.OK)
    dead = status("wireguard", State.FAILED, "dead")
    engine.observe(snapshot(ok))
    assert _kinds(engine) == []
    engine.observe(snapshot(dead))
    engine.observe(snapshot(dead))  # the same state again: no new alert
    h.clock.now += 599
    engine.observe(snapshot(dead))
    assert _kinds(engine) == ["wireguard.dead"]
    h.clock.now += 1  # reminder_interval reached
    engine.observe(snapshot(dead))
    h.clock.now += 600
    engine.observe(snapshot(dead))
    engine.observe(snapshot(ok))
    alerts = [a for a in _alerts(engine) if a.kind != "agent.started"]
    assert [(a.kind, a.reminder) for a in alerts] == [
        ("wireguard.dead", False), ("wireguard.dead", True), ("wireguard.dead", True),
        ("wireguard.recovered", False)]
    assert len({a.correlation for a in alerts}) == 1
    assert alerts[0].correlation == alerts[0].id
    assert alerts[-1].severity == "info"
    for a in alerts:
        validate(a.to_json(), "alert.schema.json")
    await engine.close()


async def test_a_worse_reason_while_the_problem_lasts_keeps_the_correlation(
        tmp_path: Path) -> None:
    engine = _engine(harness(tmp_path))
    engine.observe(snapshot(status("wireguard", State.DEGRADED, "rekey_failing")))
    engine.observe(snapshot(status("wireguard", State.FAILED, "dead")))
    engine.observe(snapshot(status("wireguard", State.OK)))
    alerts = [a for a in _alerts(engine) if a.kind != "agent.started"]
    assert [(a.kind, a.severity) for a in alerts] == [
        ("wireguard.rekey_failing", "warning"), ("wireguard.dead", "critical"),
        ("wireguard.recovered", "info")]
    assert len({a.correlation for a in alerts}) == 1
    await engine.close()


@pytest.mark.parametrize(("name", "state", "reason", "required", "kind", "severity"), [
    ("broker-direct", State.FAILED, "unreachable", True, "mqtt.unreachable", "critical"),
    ("broker-direct", State.FAILED, "refused", False, "mqtt.unreachable", "warning"),
    ("offload", State.FAILED, "cannot_disable", True, "offload.cannot_disable", "critical"),
    ("wireguard", State.UNKNOWN, "check_timeout", True, "check.failed", "warning"),
    ("wireguard", State.FAILED, "no_peers", True, "wireguard.failed", "critical"),
    ("wireguard", State.UNKNOWN, "permission_denied", True, "check.failed", "warning"),
    ("offload", State.DEGRADED, "cannot_disable", True, "offload.cannot_disable", "critical"),
    ("offload", State.FAILED, "interface_missing", True, "check.failed", "critical"),
    ("other", State.DEGRADED, "slow", True, "check.failed", "warning"),
])
async def test_the_kind_and_severity_follow_the_check_and_the_table(  # noqa: PLR0917
        tmp_path: Path, name: str, state: State, reason: str, required: bool, kind: str,
        severity: str) -> None:
    toml = ('[[mqtt.targets]]\nname = "broker-direct"\nhost = "127.0.0.1"\n'
            'path = "direct"\n')
    engine = _engine(harness(tmp_path, toml))
    engine.observe(snapshot(status(name, state, reason, required=required)))
    alert = _alerts(engine)[-1]
    assert (alert.kind, alert.severity) == (kind, severity)
    if name == "broker-direct":
        assert alert.detail["path"] == "direct"
    await engine.close()


async def test_checks_without_a_verdict_yet_raise_nothing(tmp_path: Path) -> None:
    engine = _engine(harness(tmp_path))
    engine.observe(snapshot(status("wireguard", State.UNKNOWN, "pending", runs=0),
                            complete=False))
    engine.observe(snapshot(status("alerts-link", State.UNKNOWN, "connecting", runs=1)))
    assert _kinds(engine) == []
    await engine.close()


async def test_a_restart_continues_an_open_problem_instead_of_reopening_it(
        tmp_path: Path) -> None:
    engine = _engine(harness(tmp_path))
    engine.observe(snapshot(status("wireguard", State.FAILED, "dead")))
    opened = _alerts(engine)[-1]
    await engine.close()
    again = _engine(harness(tmp_path))
    again.observe(snapshot(status("wireguard", State.FAILED, "dead")))
    again.observe(snapshot(status("wireguard", State.OK)))
    kinds = [(a.kind, a.correlation) for a in _alerts(again) if a.kind != "agent.started"]
    assert kinds == [("wireguard.dead", opened.correlation),
                     ("wireguard.recovered", opened.correlation)]
    await again.close()


# --- events, test alerts, bounds ---------------------------------------------------------

async def test_events_become_alerts_and_unknown_kinds_are_refused_loudly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = harness(tmp_path)
    engine = _engine(h)
    engine.event(Event("offload.drift_corrected", "tx-checksum-ipv4 was on on wwan0",
                       {"interface": "wwan0"}))
    engine.event(Event("remediation.not_in_table", "x"))
    assert _kinds(engine) == ["offload.drift_corrected"]
    assert "not in the alert kinds table" in caplog.text
    assert _sample(h.ctx.registry, "edgeheal_alerts_raised_total",
                   {"kind": "offload.drift_corrected"}) == 1
    await engine.close()


async def test_alert_test_raises_n_alerts_through_the_outbox(tmp_path: Path) -> None:
    h = harness(tmp_path)
    engine = _engine(h)
    reply = await h.handlers["alert.test"]({"count": 3})
    assert reply["raised"] == 3
    assert reply["ids"] == [a.id for a in _alerts(engine) if a.kind == "agent.test"]
    assert reply["outbox_depth"] == 4  # agent.started + 3
    for bad in (0, -1, "3", 1001, True):
        with pytest.raises(ValueError, match="count must be"):
            await h.handlers["alert.test"]({"count": bad})
    await engine.close()


async def test_the_count_bound_drops_oldest_and_one_dropped_alert_counts_them(
        tmp_path: Path) -> None:
    h = harness(tmp_path, "[alerts]\noutbox_max_count = 5\n")
    engine = _engine(h)
    await h.handlers["alert.test"]({"count": 8})  # + agent.started = 9 -> 4 dropped
    alerts = _alerts(engine)
    dropped = [a for a in alerts if a.kind == "alerts.dropped"]
    assert len(dropped) == 1
    assert dropped[0].detail["dropped"] == 4
    assert [a.detail["index"] for a in alerts if a.kind == "agent.test"] == [4, 5, 6, 7, 8]
    await h.handlers["alert.test"]({"count": 2})
    dropped = [a for a in _alerts(engine) if a.kind == "alerts.dropped"]
    assert len(dropped) == 1  # updated in place while undelivered
    assert dropped[0].detail["dropped"] == 6
    assert _sample(h.ctx.registry, "edgeheal_alerts_dropped_total",
                   {"reason": "outbox_max_count"}) == 6
    assert _sample(h.ctx.registry, "edgeheal_alerts_dropped_total",
                   {"reason": "outbox_max_age"}) == 0
    assert _sample(h.ctx.registry, "edgeheal_alerts_outbox_depth") == 6
    await engine.close()


async def test_the_age_bound_drops_old_alerts_and_says_so(tmp_path: Path) -> None:
    h = harness(tmp_path, '[alerts]\noutbox_max_age = "1h"\n')
    engine = _engine(h)
    await h.handlers["alert.test"]({"count": 2})
    h.clock.now += 3601
    engine._prune()
    kinds = _kinds(engine, skip=())
    assert kinds == ["alerts.dropped"]
    assert _alerts(engine)[0].detail["bound"] == "outbox_max_age"
    await engine.close()


async def test_without_a_target_alerts_are_kept_and_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    h = harness(tmp_path)
    assert h.link is None
    engine = _engine(h)
    assert engine.link is None
    engine.event(Event("offload.drift_corrected", "drift on wwan0"))
    await engine.outbox.settled()  # logged once stored, on the outbox's thread
    assert "alert offload.drift_corrected" in caplog.text
    assert engine.outbox.depth() == 2
    await engine.close()


async def test_every_kind_and_drop_reason_is_counted_from_zero_and_the_backlog_has_an_age(
        tmp_path: Path) -> None:
    h = harness(tmp_path)
    engine = _engine(h)
    await engine.outbox.settled()  # counted once stored, on the outbox's thread
    reg = h.ctx.registry
    for kind in KINDS:
        expected = 1 if kind == "agent.started" else 0
        assert _sample(reg, "edgeheal_alerts_raised_total", {"kind": kind}) == expected
        assert reg.get_sample_value("edgeheal_alerts_raised_total", {"kind": kind}) is not None
    for reason in engine_mod.DROP_REASONS:
        assert reg.get_sample_value("edgeheal_alerts_dropped_total", {"reason": reason}) == 0
    assert reg.get_sample_value("edgeheal_alerts_outbox_oldest_age_seconds") == 0.0
    h.clock.advance(90)
    engine.raise_alert("agent.test", "second")
    h.clock.advance(10)
    assert reg.get_sample_value("edgeheal_alerts_outbox_oldest_age_seconds") == \
        pytest.approx(100, abs=0.5)  # the oldest (agent.started), not the newest
    for entry in engine.outbox.entries():  # as the drain does on each PUBACK
        engine.outbox.delete(entry.seq)
        engine._gauges()
    assert reg.get_sample_value("edgeheal_alerts_outbox_oldest_age_seconds") == 0.0
    assert reg.get_sample_value("edgeheal_alerts_outbox_depth") == 0
    await engine.close()
