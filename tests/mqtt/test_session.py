"""The kept-open probe session: one CONNECT, then one PINGREQ per check; a session lost
between checks is made again in the check, one that does not answer fails it."""

from __future__ import annotations

import os
import signal

import pytest

from edgeheal.boundaries.mqtt.session import Session, session_keepalive
from edgeheal.lab.mosquitto import Mosquitto
from tests.mqtt.conftest import target_for


@pytest.mark.netns
async def test_later_checks_are_pings_on_the_one_connection(broker: Mosquitto) -> None:
    session = Session(target_for(broker), "edge-1")
    try:
        first = await session.check()
        assert (first.reason, first.ping_seconds) == ("ok", None), first.message
        conn = session._conn
        assert conn is not None
        rx, tx = conn.byte_counts
        for _ in range(3):
            result = await session.check()
            assert result.ok, result.message
            assert result.ping_seconds is not None
            assert result.rtt_seconds == first.rtt_seconds  # the session's CONNACK
        assert session._conn is conn
        assert session.connects == 1
        # three PINGREQs (2 bytes each) and three PINGRESPs: nothing else on the wire
        assert conn.byte_counts == (rx + 6, tx + 6)
    finally:
        await session.close()
    assert not session.open


@pytest.mark.netns
async def test_a_session_lost_between_checks_is_made_again_in_the_check(
        broker: Mosquitto) -> None:
    session = Session(target_for(broker), "edge-1")
    try:
        assert (await session.check()).ok
        broker.stop()
        broker.start()  # the broker restarted: our connection is gone
        result = await session.check()
        assert (result.reason, result.ping_seconds) == ("ok", None), result.message
        assert session.connects == 2
    finally:
        await session.close()


@pytest.mark.netns
async def test_a_ping_without_answer_asks_a_new_connection_in_the_same_check(
        broker: Mosquitto) -> None:
    session = Session(target_for(broker, timeout=2.0), "edge-1")
    assert broker.proc is not None
    try:
        assert (await session.check()).ok
        os.kill(broker.proc.pid, signal.SIGSTOP)  # the kernel still ACKs; MQTT is silent
        try:
            # the ping goes unanswered, so a new connection is asked: unanswered too
            result = await session.check(limit=2.0)
            assert result.reason == "timeout", result.message
            assert "CONNACK" in result.message
            assert not session.open
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        result = await session.check()
        assert (result.reason, session.connects) == ("ok", 2), result.message
    finally:
        await session.close()


def test_the_session_keepalive_outlasts_the_cadence() -> None:
    from edgeheal.config import MqttTarget

    default = MqttTarget()
    assert default.interval is not None
    assert session_keepalive(default) > default.interval + default.timeout
    assert session_keepalive(MqttTarget(interval=86400.0)) == 65535.0  # MQTT's maximum
