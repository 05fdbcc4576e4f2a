"""Remediation alerts name the problem they act on (issue 21, item 4).

A subscriber keys incidents by ``correlation``: the tunnel problem's alerts (``wireguard.*``,
or a tunnel-path target's ``mqtt.*``) share one. Remediation alerts are events, not
problems: a restart's alerts share the attempt's own correlation, the others carry their
own id. ``detail.problem`` links each to the tunnel problem's correlation: while it is
open, and for the circuit closing just after it recovered.
"""

from __future__ import annotations

from pathlib import Path

from edgeheal.agent.alerts.engine import AlertEngine
from edgeheal.agent.alerts.payload import Alert
from edgeheal.model import Event, State
from tests.alerts.support import harness, snapshot, status, validate

TUNNEL_TARGET = """
[[mqtt.targets]]
name = "broker-tunnel"
host = "10.43.0.10"
path = "tunnel"
"""


def _alerts(engine: AlertEngine) -> list[Alert]:
    return [Alert.decode(e.payload) for e in engine.outbox.entries()
            if Alert.decode(e.payload).kind != "agent.started"]


async def test_remediation_alerts_carry_the_wireguard_problem_they_act_on(
        tmp_path: Path) -> None:
    h = harness(tmp_path)
    engine = AlertEngine(h.ctx, link=h.link)
    engine.observe(snapshot(status("wireguard", State.OK)))
    engine.event(Event("remediation.skipped", "before any problem", {"reason": "paused"}))
    engine.observe(snapshot(status("wireguard", State.FAILED, "dead")))
    engine.event(Event("remediation.restarted", "restarted", {"target": "pod"}, "a1b2c3"))
    engine.event(Event("remediation.recovered", "recovered", {"target": "pod"}, "a1b2c3"))
    engine.observe(snapshot(status("wireguard", State.OK)))
    engine.event(Event("remediation.recovered", "circuit closed", {"circuit": "closed"}))
    early, opened, restarted, recovered, closed_problem, circuit = _alerts(engine)
    assert "problem" not in early.detail
    assert opened.kind == "wireguard.dead"
    assert closed_problem.kind == "wireguard.recovered"
    assert opened.correlation == closed_problem.correlation
    for alert in (restarted, recovered, circuit):
        assert alert.detail["problem"] == opened.correlation
        validate(alert.to_json(), "alert.schema.json")
    assert restarted.correlation == recovered.correlation == "a1b2c3"  # the attempt
    assert circuit.correlation == circuit.id
    await engine.close()


async def test_a_failed_tunnel_path_target_is_the_problem_when_wireguard_is_fine(
        tmp_path: Path) -> None:
    h = harness(tmp_path, TUNNEL_TARGET)
    engine = AlertEngine(h.ctx, link=h.link)
    engine.observe(snapshot(status("wireguard", State.OK),
                            status("broker-tunnel", State.FAILED, "timeout")))
    engine.event(Event("remediation.skipped", "direct path down",
                       {"reason": "direct_path_down"}))
    opened, skipped = _alerts(engine)
    assert opened.kind == "mqtt.unreachable"
    assert skipped.detail["problem"] == opened.correlation
    await engine.close()


async def test_other_events_get_no_problem(tmp_path: Path) -> None:
    h = harness(tmp_path)
    engine = AlertEngine(h.ctx, link=h.link)
    engine.observe(snapshot(status("wireguard", State.FAILED, "dead")))
    engine.event(Event("offload.drift_corrected", "offload was on", {"interface": "wwan0"}))
    _, drift = _alerts(engine)
    assert "problem" not in drift.detail
    assert drift.correlation == drift.id
    await engine.close()
