"""How an MQTT session ends, named: a refused CONNECT, a lost, timed-out or closed connection.

Why apart from the session (:mod:`edgeheal.boundaries.mqtt.client`): paho tells the end of
a connection as a callback with flags and a reason-code object, and what it means depends
on what came before (was CONNACK seen? were we in a keepalive tick? did any byte arrive?).
The naming is a pure function of those facts, so it lives here, without paho, and the
session only gathers the facts and acts on the answer: an
:class:`~edgeheal.boundaries.mqtt.MqttError` with a reason from the closed table.

A refusal is named by its own code under MQTT 3.1.1 (:data:`CONNACK_311`): paho reports
those as MQTT 5 reason codes (5 becomes 135) and answers code 1 by retrying MQTT 3.1 over
a socket it does not have, so the code is read from the framer's view of the CONNACK.

How a connection ended by the broker is also kept (the session's ``ended_by``), for the
link's takeover count (a second client with our client id): ``session_taken_over`` is MQTT
5's DISCONNECT reason 0x8E, the broker's own word (later Mosquitto releases send it: their
``test/broker/01-connect-take-over.py``); ``closed_by_broker`` is a connection the broker
closed in order (FIN) after CONNACK with no DISCONNECT, which is what Mosquitto does to the
older of two clients with one id under MQTT 3.1.1, and what Mosquitto 2.0.11 (Debian 12's)
does under MQTT 5 too. A broker restart looks the same, once: only a repeat means a
takeover.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgeheal.boundaries.mqtt import MqttError
from edgeheal.boundaries.mqtt.transport import where

if TYPE_CHECKING:
    from edgeheal.config import MqttTarget

CONNACK_311 = {1: "unacceptable protocol version", 2: "identifier rejected",
               3: "server unavailable", 4: "bad user name or password",
               5: "not authorized"}
"""MQTT 3.1.1 CONNACK return codes (paho reports them as MQTT 5 reason codes: 5 -> 135)."""

SESSION_TAKEN_OVER = 0x8E
"""MQTT 5 DISCONNECT reason "Session taken over": another client connected with our id."""


def refused(target: MqttTarget, what: str) -> MqttError:
    """The broker answered CONNECT and said no: a configuration problem."""
    return MqttError("refused", f"{where(target)}: the broker refused the "
                     f"connection: {what}; check username, password_file and the "
                     "broker's ACL: this is a configuration problem")


def refusal(target: MqttTarget, connack_code: int | None) -> MqttError | None:
    """An MQTT 3.1.1 CONNACK refusal, named by its own code (None: not one)."""
    if target.protocol == "5" or connack_code not in CONNACK_311:
        return None
    return refused(target, f"{CONNACK_311[connack_code]} (MQTT 3.1.1 code {connack_code})")


def disconnected(target: MqttTarget, *, connack_seen: bool, connack_code: int | None,
                 received: int, eof: bool, in_keepalive: bool, keepalive: int,
                 flags: Any, reason: Any) -> tuple[MqttError, str | None]:
    """Why a connection we did not close ended, and how the broker ended it
    (``session_taken_over``, ``closed_by_broker``; None: not told).

    ``received``: bytes the peer sent; ``eof``: it closed its side in order;
    ``in_keepalive``: paho gave up inside its keepalive tick; ``flags`` and ``reason``:
    what paho passed to ``on_disconnect``."""
    if not connack_seen:
        if (refusal_error := refusal(target, connack_code)) is not None:
            return refusal_error, None
        if received:
            return MqttError("protocol_error", f"{where(target)}: the peer answered "
                             "with something that is not an MQTT CONNACK"), None
        return MqttError("protocol_error", f"{where(target)}: the peer closed "
                         "the connection without answering CONNECT"), None
    if in_keepalive:
        return MqttError("timeout", f"{where(target)}: no answer to keepalive "
                         f"within {keepalive}s"), None
    if getattr(flags, "is_disconnect_packet_from_server", False):
        taken = getattr(reason, "value", None) == SESSION_TAKEN_OVER
        return (MqttError("unreachable", f"{where(target)}: the broker disconnected "
                          f"us: {reason}"), "session_taken_over" if taken else None)
    return (MqttError("unreachable", f"{where(target)}: connection lost"),
            "closed_by_broker" if eof else None)
