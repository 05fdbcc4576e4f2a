"""The mqtt check module (one check per target, reasons, metrics) and the path verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeheal import config
from edgeheal import settings as validation
from edgeheal.boundaries.mqtt import REASONS
from edgeheal.checks import mqtt as mqtt_check
from edgeheal.core.path_verdict import path_verdict
from edgeheal.lab.mosquitto import Mosquitto, free_port
from edgeheal.model import State
from tests.alerts.support import harness, snapshot, status
from tests.mqtt.conftest import USER


def _targets(broker: Mosquitto, *, alert_target: str = "") -> str:
    pw = broker.password_file_for(USER)
    rows = [("broker-tunnel", broker.port, "tunnel"), ("broker-direct", broker.port, "direct"),
            ("broker-off", free_port(), "direct")]
    text = "".join(
        f'[[mqtt.targets]]\nname = "{n}"\nhost = "{broker.host}"\nport = {p}\npath = "{path}"\n'
        f'username = "{USER}"\npassword_file = "{pw}"\ntimeout = "2s"\n' for n, p, path in rows)
    return text + (f'[alerts]\ntarget = "{alert_target}"\n' if alert_target else "")


@pytest.mark.netns
async def test_each_target_is_a_check_named_after_it_with_metrics(
        broker: Mosquitto, tmp_path: Path) -> None:
    h = harness(tmp_path, _targets(broker))
    checks = mqtt_check._factory(h.ctx)
    assert [c.name for c in checks] == ["broker-tunnel", "broker-direct", "broker-off"]
    results = {c.name: await c.run() for c in checks}
    assert (results["broker-tunnel"].state, results["broker-tunnel"].reason) == (State.OK, "ok")
    assert results["broker-tunnel"].detail["path"] == "tunnel"
    assert results["broker-tunnel"].detail["connect_seconds"] > 0
    assert (results["broker-off"].state, results["broker-off"].reason) == (
        State.FAILED, "unreachable")
    reg = h.ctx.registry
    assert reg.get_sample_value("edgeheal_mqtt_up",
                                {"target": "broker-tunnel", "path": "tunnel"}) == 1
    assert reg.get_sample_value("edgeheal_mqtt_up",
                                {"target": "broker-off", "path": "direct"}) == 0
    assert reg.get_sample_value("edgeheal_mqtt_connect_seconds",
                                {"target": "broker-direct"}) > 0
    for check in checks:
        await check.close()  # type: ignore[attr-defined]


@pytest.mark.netns
async def test_the_alert_target_is_read_from_the_link_not_probed(
        broker: Mosquitto, tmp_path: Path) -> None:
    h = harness(tmp_path, _targets(broker, alert_target="broker-direct"))
    checks = {c.name: c for c in mqtt_check._factory(h.ctx)}
    assert type(checks["broker-direct"]).__name__ == "MqttLinkCheck"
    result = await checks["broker-direct"].run()  # no engine serving: still connecting
    assert (result.state, result.reason) == (State.UNKNOWN, "connecting")
    assert "MqttLinkCheck" not in {type(c).__name__ for n, c in checks.items()
                                   if n != "broker-direct"}
    # it runs at the agent's cadence: reading the link costs no bytes
    assert checks["broker-direct"].settings.interval == h.ctx.config.agent.check_interval


def test_every_reason_maps_to_exactly_one_state_and_the_docstring_lists_it() -> None:
    assert set(REASONS) | {"connecting"} == set(mqtt_check.STATES)
    for reason in mqtt_check.STATES:
        assert f"``{reason}``" in (mqtt_check.__doc__ or "")


def test_no_mqtt_targets_means_no_checks(tmp_path: Path) -> None:
    assert mqtt_check._factory(harness(tmp_path).ctx) == []


def test_a_bad_alert_target_or_keepalive_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(config.ConfigError, match=r"alerts\.target"):
        validation.loads('[alerts]\ntarget = "nope"\n')
    with pytest.raises(config.ConfigError, match=r"mqtt\.targets\[0\]\.keepalive"):
        validation.loads('[[mqtt.targets]]\nname = "a"\nhost = "h"\nkeepalive = "0s"\n')
    with pytest.raises(config.ConfigError, match=r"alerts\.outbox_max_count"):
        validation.loads("[alerts]\noutbox_max_count = 0\n")
    with pytest.raises(config.ConfigError, match=r"alerts\.topic_prefix"):
        validation.loads('[alerts]\ntopic_prefix = "a/#"\n')
    with pytest.raises(config.ConfigError, match=r"mqtt\.targets\[0\]\.username"):
        validation.loads('[[mqtt.targets]]\nname = "a"\nhost = "h"\npassword_file = "/p"\n')


# --- the path verdict (pure, table-driven) -------------------------------------------------

PATHS_TOML = ('[[mqtt.targets]]\nname = "t"\nhost = "10.43.0.20"\npath = "tunnel"\n'
              '[[mqtt.targets]]\nname = "d"\nhost = "203.0.113.5"\npath = "direct"\n')

OK, FAILED, UNKNOWN, DEGRADED = State.OK, State.FAILED, State.UNKNOWN, State.DEGRADED


@pytest.mark.parametrize(("tunnel", "direct", "fault", "helps"), [
    (OK, OK, "none", False),
    (FAILED, OK, "tunnel", True),
    (FAILED, DEGRADED, "tunnel", True),
    (FAILED, FAILED, "uplink_or_cloud", False),
    (OK, FAILED, "direct_path", False),
    (FAILED, None, "tunnel_or_uplink", None),
    (FAILED, UNKNOWN, "tunnel_or_uplink", None),
    (UNKNOWN, OK, "unknown", None),
    (None, None, "unknown", None),
])
def test_the_path_verdict(tunnel: State | None, direct: State | None, fault: str,
                          helps: bool | None) -> None:
    cfg = config.loads_generic(PATHS_TOML)
    statuses = [status(n, s) for n, s in (("t", tunnel), ("d", direct)) if s is not None]
    verdict = path_verdict(snapshot(*statuses), cfg)
    assert (verdict["fault"], verdict["restart_flannel_helps"]) == (fault, helps)
    assert verdict["targets"] == {"tunnel": ["t"], "direct": ["d"]}


def test_a_path_with_one_working_target_of_several_works() -> None:
    cfg = config.loads_generic(PATHS_TOML + '[[mqtt.targets]]\nname = "t2"\nhost = "10.43.0.21"\n'
                       'path = "tunnel"\n')
    snap = snapshot(status("t", FAILED), status("t2", OK), status("d", OK))
    assert path_verdict(snap, cfg)["tunnel"] == "works"


def test_checks_without_results_do_not_count() -> None:
    cfg = config.loads_generic(PATHS_TOML)
    snap = snapshot(status("t", FAILED), status("d", UNKNOWN, "pending", runs=0))
    assert path_verdict(snap, cfg)["direct"] == "unknown"


@pytest.mark.netns
async def test_tls_probes_resume_the_session_run_after_run(
        broker: Mosquitto, tmp_path: Path) -> None:
    pw = broker.password_file_for(USER)
    h = harness(tmp_path, f'[[mqtt.targets]]\nname = "tls"\nhost = "{broker.host}"\n'
                f'port = {broker.tls_port}\ntls = true\nca_file = "{broker.ca_file}"\n'
                f'username = "{USER}"\npassword_file = "{pw}"\n')
    (check,) = mqtt_check._factory(h.ctx)
    for _ in range(3):
        result = await check.run()
        assert (result.state, result.reason) == (State.OK, "ok"), result.message
    session = check._session  # type: ignore[attr-defined]
    assert session.resume.session is not None
    assert (session.connects, result.detail["connects"]) == (1, 1)  # one handshake, pings after
    session._conn.abort()  # lost between probes: the next probe resumes the TLS session
    result = await check.run()
    assert (result.state, session.connects) == (State.OK, 2), result.message
    assert session._conn._tap.sock.session_reused
    await check.close()  # type: ignore[attr-defined]
