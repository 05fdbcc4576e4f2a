"""The probe against a real Mosquitto and against peers that misbehave."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from edgeheal.base import compat
from edgeheal.boundaries.mqtt import probe
from edgeheal.lab.mosquitto import Mosquitto, free_port
from tests.mqtt.conftest import PASSWORD, FakePeer, target_for

pytestmark = pytest.mark.netns


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
async def test_a_reachable_broker_answers_ok_with_a_round_trip_time(
        broker: Mosquitto, protocol: str) -> None:
    result = await probe(target_for(broker, protocol=protocol), "edge-1")
    assert result.reason == "ok", result.message
    assert result.rtt_seconds is not None
    assert 0 < result.rtt_seconds < 3.0
    # the probe ends with a clean DISCONNECT, not a dropped socket
    assert broker.wait_for_log("Client edgeheal-edge-1-broker disconnected.", 5)


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
async def test_a_wrong_password_is_refused_as_a_configuration_problem(
        broker: Mosquitto, tmp_path: Path, protocol: str,
        caplog: pytest.LogCaptureFixture) -> None:
    wrong = tmp_path / "wrong.pass"
    wrong.write_text("not-the-password\n")
    caplog.set_level(logging.DEBUG)
    result = await probe(target_for(broker, password_file=str(wrong), protocol=protocol),
                         "edge-1")
    assert result.reason == "refused", result.message
    assert "configuration problem" in result.message
    assert "not-the-password" not in result.message + caplog.text


async def test_the_password_never_appears_in_results_or_logs(
        broker: Mosquitto, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    ok = await probe(target_for(broker), "edge-1")
    bad = await probe(target_for(broker, port=free_port()), "edge-1")
    assert ok.reason == "ok"
    assert bad.reason == "unreachable"
    assert PASSWORD not in ok.message + bad.message + caplog.text


async def test_a_stopped_broker_is_unreachable_well_within_the_timeout(
        broker: Mosquitto) -> None:
    target = target_for(broker, timeout=3.0)
    assert (await probe(target, "edge-1")).reason == "ok"
    broker.stop()
    began = time.monotonic()
    result = await probe(target, "edge-1")
    assert result.reason == "unreachable", result.message
    assert "connection refused" in result.message
    assert time.monotonic() - began < 3.0
    broker.start()
    assert (await probe(target, "edge-1")).reason == "ok"


async def test_a_peer_that_answers_garbage_is_a_protocol_error(
        broker: Mosquitto, garbage_peer: FakePeer) -> None:
    result = await probe(target_for(broker, port=garbage_peer.port), "edge-1")
    assert result.reason == "protocol_error", result.message
    assert "0x48" in result.message  # 'H' of "HTTP/1.1"
    assert garbage_peer.connections == 1


async def test_a_peer_that_never_answers_is_a_timeout_bounded_by_the_deadline(
        broker: Mosquitto, silent_peer: FakePeer) -> None:
    began = time.monotonic()
    result = await probe(target_for(broker, port=silent_peer.port), "edge-1", limit=0.5)
    elapsed = time.monotonic() - began
    assert result.reason == "timeout", result.message
    assert "waiting for CONNACK" in result.message
    assert 0.4 < elapsed < 2.5


async def test_the_default_deadline_stays_inside_the_supervisors_timeout(
        broker: Mosquitto, silent_peer: FakePeer) -> None:
    target = target_for(broker, port=silent_peer.port, timeout=1.0)
    async with compat.timeout(target.timeout):  # what the agent wraps around run()
        result = await probe(target, "edge-1")
    assert result.reason == "timeout"


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
async def test_tls_with_the_right_ca_is_ok(broker: Mosquitto, protocol: str) -> None:
    result = await probe(target_for(broker, port=broker.tls_port, tls=True,
                                    ca_file=broker.ca_file, protocol=protocol), "edge-1")
    assert result.reason == "ok", result.message


async def test_tls_with_a_ca_that_did_not_sign_the_broker_is_a_tls_error(
        broker: Mosquitto) -> None:
    result = await probe(target_for(broker, port=broker.tls_port, tls=True,
                                    ca_file=broker.other_ca_file), "edge-1")
    assert result.reason == "tls_error", result.message
    assert "certificate" in result.message


async def test_tls_to_a_plain_port_is_a_tls_error(broker: Mosquitto) -> None:
    result = await probe(target_for(broker, tls=True, ca_file=broker.ca_file), "edge-1")
    assert result.reason == "tls_error", result.message


async def test_tls_with_a_mismatching_server_name_is_a_tls_error(broker: Mosquitto) -> None:
    result = await probe(target_for(broker, port=broker.tls_port, tls=True,
                                    ca_file=broker.ca_file, server_name="broker.example"),
                         "edge-1")
    assert result.reason == "tls_error", result.message


async def test_an_unreadable_password_file_is_a_config_error_naming_the_file(
        broker: Mosquitto, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pass"
    result = await probe(target_for(broker, password_file=str(missing)), "edge-1")
    assert result.reason == "config_error"
    assert str(missing) in result.message


async def test_a_name_that_does_not_resolve_is_unreachable(broker: Mosquitto) -> None:
    result = await probe(target_for(broker, host="no-such-host.invalid"), "edge-1")
    assert result.reason == "unreachable", result.message
    assert "resolve" in result.message


def _open_fds() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


async def test_many_probes_leave_no_sockets_or_tasks_behind(broker: Mosquitto) -> None:
    fds = _open_fds()
    for _ in range(20):
        assert (await probe(target_for(broker), "edge-1")).reason == "ok"
    assert _open_fds() <= fds + 2
