"""What a refused CONNECT or an ended connection is called: the pure table of
:mod:`edgeheal.boundaries.mqtt.endings`, one row per branch (the real broker's side of
these is in ``test_probe.py``, ``test_link.py`` and ``tests/hardening/test_broker_packets.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from edgeheal.boundaries.mqtt import endings
from edgeheal.config import MqttTarget


@dataclass
class Flags:
    """paho's DisconnectFlags: only the attribute endings reads."""

    is_disconnect_packet_from_server: bool


@dataclass
class Reason:
    """paho's ReasonCode: its ``value`` and how it prints."""

    value: int
    name: str

    def __str__(self) -> str:
        return self.name


V311 = MqttTarget(name="b", host="127.0.0.1", port=1883)
V5 = MqttTarget(name="b", host="127.0.0.1", port=1883, protocol="5")
NOT_SERVER = Flags(is_disconnect_packet_from_server=False)
FROM_SERVER = Flags(is_disconnect_packet_from_server=True)
TAKEN = Reason(endings.SESSION_TAKEN_OVER, "Session taken over")
SHUTTING = Reason(0x8B, "Server shutting down")


@pytest.mark.parametrize(("target", "facts", "reason", "words", "ended_by"), [
    # 1. before CONNACK, an MQTT 3.1.1 refusal is named by its own code
    (V311, {"connack_seen": False, "connack_code": 5, "received": 4}, "refused",
     "not authorized (MQTT 3.1.1 code 5)", None),
    # 2. ... but under MQTT 5 the same byte is no 3.1.1 code: bytes that are not a CONNACK
    (V5, {"connack_seen": False, "connack_code": 5, "received": 4}, "protocol_error",
     "not an MQTT CONNACK", None),
    # 3. before CONNACK, bytes that were not one
    (V311, {"connack_seen": False, "received": 7}, "protocol_error", "not an MQTT CONNACK",
     None),
    # 4. before CONNACK, nothing at all
    (V311, {"connack_seen": False}, "protocol_error", "without answering CONNECT", None),
    # 5. after CONNACK, paho gave up in its keepalive tick
    (V311, {"in_keepalive": True, "eof": True}, "timeout", "no answer to keepalive within 7s",
     None),
    # 6. the broker's DISCONNECT 0x8E: a takeover, in the broker's own word
    (V5, {"flags": FROM_SERVER, "reason": TAKEN}, "unreachable",
     "disconnected us: Session taken over", "session_taken_over"),
    # 7. another DISCONNECT from the broker is not one
    (V5, {"flags": FROM_SERVER, "reason": SHUTTING}, "unreachable",
     "disconnected us: Server shutting down", None),
    # 8. closed in order after CONNACK, no DISCONNECT: what Mosquitto does to the older client
    (V311, {"eof": True}, "unreachable", "connection lost", "closed_by_broker"),
    # 9. lost without a FIN (a reset, a dead route): no word on who ended it
    (V311, {}, "unreachable", "connection lost", None),
])
def test_each_ending_has_its_reason_and_says_who_ended_it(
        target: MqttTarget, facts: dict[str, object], reason: str, words: str,
        ended_by: str | None) -> None:
    given: dict[str, object] = {"connack_seen": True, "connack_code": None, "received": 0,
                                "eof": False, "in_keepalive": False, "keepalive": 7,
                                "flags": NOT_SERVER, "reason": None, **facts}
    error, by = endings.disconnected(target, **given)  # type: ignore[arg-type]
    assert (error.reason, by) == (reason, ended_by)
    assert words in error.message
    assert error.message.startswith("b (127.0.0.1:1883): ")  # names the broker


@pytest.mark.parametrize(("target", "code", "named"), [
    (V311, 4, "bad user name or password (MQTT 3.1.1 code 4)"),
    (V311, 1, "unacceptable protocol version (MQTT 3.1.1 code 1)"),
    (V311, 0, None),  # accepted: no refusal
    (V311, None, None),  # no CONNACK seen
    (V5, 135, None),  # MQTT 5 reason codes are paho's to name
])
def test_a_311_refusal_is_named_by_its_code_and_blames_the_configuration(
        target: MqttTarget, code: int | None, named: str | None) -> None:
    error = endings.refusal(target, code)
    if named is None:
        assert error is None
        return
    assert error is not None
    assert error.reason == "refused"
    assert named in error.message
    assert "configuration problem" in error.message
