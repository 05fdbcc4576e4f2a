"""One MQTT session over an open socket: paho speaks MQTT, the asyncio loop drives it.

The socket comes from :mod:`edgeheal.boundaries.mqtt.transport` (resolved, connected and, with TLS,
handshaken by asyncio); it is handed to a paho client (``_create_socket`` is the hand-over
point) whose reads, writes and keepalive are driven by ``loop.add_reader``/``add_writer``
and a 1 s ``loop_misc`` tick, the way aiomqtt 2.x drives paho. The caller puts one deadline
around :meth:`Connection.connect`. paho is imported here and only here, so it loads the
first time a connection is made (:func:`edgeheal.boundaries.mqtt.probe` and the link import this
module on demand).

Every byte from the broker passes :class:`edgeheal.boundaries.mqtt.transport.Framer` before paho
sees it: a peer that is not MQTT is recognised by its first byte (a broker's first packet
must be a CONNACK, 0x20), and a packet announced larger than
:data:`~edgeheal.boundaries.mqtt.transport.MAX_PACKET` ends the connection before a byte of it is
buffered; both are ``protocol_error`` at once. A host name or client id that cannot be
sent is ``config_error`` before any traffic. Everything that goes wrong becomes an
:class:`~edgeheal.boundaries.mqtt.MqttError` with a reason from the closed table; an unexpected
exception in the keepalive task ends the connection as ``internal_error`` (logged).

What a refused CONNECT or a lost connection is called, and how the broker ended one
(:attr:`Connection.ended_by`, for the link's takeover count), is
:mod:`edgeheal.boundaries.mqtt.endings`: this module gathers the facts paho gives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from edgeheal.base import compat
from edgeheal.boundaries.mqtt import MqttError, client_id, endings, string_problem
from edgeheal.boundaries.mqtt.transport import FramingError, Tap, TlsResumption, open_socket, where
from edgeheal.config import MqttTarget

log = logging.getLogger("edgeheal.mqtt.client")  # the name operators grep for

MISC_TICK = 1.0
"""Seconds between paho ``loop_misc`` calls (keepalive PINGREQ and its deadline)."""
_SSL_PENDING_ROUNDS = 64

__all__ = ("Connection", "client_id", "read_password")


def _check_strings(target: MqttTarget, node: str) -> None:
    """A client id or user name paho could not encode is a configuration error."""
    for what, value in (("client id", client_id(target, node)),
                        ("username", target.username)):
        problem = string_problem(value)
        if problem is not None:
            raise MqttError("config_error", f"{where(target)}: the {what} {problem}")


def read_password(target: MqttTarget) -> str | None:
    """The password from ``password_file`` (trailing newline stripped), or None."""
    if not target.password_file:
        return None
    try:
        text = Path(target.password_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise MqttError("config_error", f"{where(target)}: cannot read password_file "
                        f"{target.password_file}: {why}") from err
    return text.rstrip("\r\n")


class _Client(paho.Client):
    """paho's client, connecting over the socket we already opened."""

    prepared: Tap | None = None

    def _create_socket(self) -> Any:
        sock, self.prepared = self.prepared, None
        if sock is None:
            raise ConnectionError("no prepared socket (reconnects are ours to make)")
        return sock


class Connection:
    """One MQTT session over one socket. Not reusable: make a new one to reconnect.

    ``connect()`` (put a deadline around it) -> ``publish()`` futures resolve on PUBACK ->
    ``closed`` resolves with the :class:`MqttError` that ended it (None for our own clean
    DISCONNECT) -> ``disconnect()`` or ``abort()``.
    """

    def __init__(self, target: MqttTarget, node: str, *, keepalive: float = 60.0,
                 will: tuple[str, bytes] | None = None,
                 resume: TlsResumption | None = None, accept: str = "",
                 on_message: Callable[[bytes], None] | None = None) -> None:
        self.target = target
        self.accept = accept
        """The one topic this session subscribes to and accepts PUBLISH on ("": none)."""
        self.on_message = on_message
        self.node = node
        self.keepalive = max(1, round(keepalive))
        self.will = will
        self.resume = resume
        self.loop = asyncio.get_running_loop()
        self.stage = ["starting"]
        self.connected = False
        self.rtt: float | None = None
        self.tcp_seconds: float | None = None
        self.closed: asyncio.Future[MqttError | None] = self.loop.create_future()
        self._connack: asyncio.Future[None] = self.loop.create_future()
        self._acks: dict[int, asyncio.Future[None]] = {}
        self._client: _Client | None = None
        self._tap: Tap | None = None
        self._fd: int | None = None
        self._misc: asyncio.Task[None] | None = None
        self._pong: asyncio.Future[None] | None = None
        self._in_misc = False
        self._disconnecting = False
        self.ended_by: str | None = None
        """``session_taken_over`` (MQTT 5 DISCONNECT 0x8E), ``closed_by_broker`` (the broker
        closed the connection in order after CONNACK, with no DISCONNECT), or None
        (:mod:`~edgeheal.boundaries.mqtt.endings`)."""

    @property
    def byte_counts(self) -> tuple[int, int]:
        """MQTT-level bytes (received, sent) on this connection (TLS: plaintext)."""
        return (self._tap.rx, self._tap.tx) if self._tap else (0, 0)

    @property
    def session(self) -> ssl.SSLSession | None:
        """The TLS session, for resumption by the next connection to the same broker."""
        return self._tap.session if self._tap else None

    async def connect(self) -> float:
        """Open the socket, send CONNECT, wait for CONNACK; return the CONNACK round trip."""
        target = self.target
        _check_strings(target, self.node)
        password = read_password(target)
        began = time.monotonic()
        sock = await open_socket(target, self.stage, self.resume)
        self.tcp_seconds = time.monotonic() - began
        self._tap = tap = Tap(sock, accept=self.accept.encode() if self.accept else None)
        v5 = target.protocol == "5"
        client = _Client(CallbackAPIVersion.VERSION2, client_id=client_id(target, self.node),
                         clean_session=None if v5 else True,
                         protocol=MQTTProtocolVersion.MQTTv5 if v5
                         else MQTTProtocolVersion.MQTTv311,
                         reconnect_on_failure=False)
        self._client = client
        if target.username or password is not None:
            client.username_pw_set(target.username or None, password)
        if self.will is not None:
            client.will_set(self.will[0], self.will[1], qos=1, retain=True)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        client.prepared = tap
        self.stage[0] = "waiting for CONNACK"
        sent = time.monotonic()
        try:
            extra: dict[str, Any] = {"clean_start": True} if v5 else {}
            client.connect(target.host, target.port, keepalive=self.keepalive, **extra)
        except OSError as err:
            self.abort()
            raise MqttError("unreachable", f"{where(target)}: cannot send CONNECT: "
                            f"{err.strerror or type(err).__name__}") from err
        except (ValueError, TypeError, struct.error) as err:  # paho cannot encode a setting
            self.abort()
            raise MqttError("config_error", f"{where(target)}: cannot build CONNECT from "
                            f"the settings ({type(err).__name__})") from err
        try:
            await asyncio.shield(self._connack)
        except BaseException:
            self.abort()
            raise
        self.rtt = time.monotonic() - sent
        self.connected = True
        self.stage[0] = "connected"
        self._misc = asyncio.create_task(self._misc_loop(),
                                         name=f"edgeheal.mqtt.keepalive.{target.name}")
        return self.rtt

    def publish(self, topic: str, payload: bytes, *, retain: bool = False,
                ) -> asyncio.Future[None]:
        """Publish at QoS 1; the future resolves when the PUBACK arrives."""
        if self._client is None or not self.connected or self.closed.done():
            raise MqttError("unreachable", f"{where(self.target)}: not connected")
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise MqttError("unreachable", f"{where(self.target)}: publish failed: "
                            f"{paho.error_string(info.rc)}")
        fut: asyncio.Future[None] = self.loop.create_future()
        self._acks[info.mid] = fut
        return fut

    def subscribe(self) -> None:
        """Subscribe to :attr:`accept` at QoS 1 (a retained message comes at once)."""
        if self._client is None or not self.connected or not self.accept:
            raise MqttError("unreachable", f"{where(self.target)}: not connected")
        rc, _ = self._client.subscribe(self.accept, qos=1)
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            raise MqttError("unreachable", f"{where(self.target)}: subscribe failed: "
                            f"{paho.error_string(rc)}")

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        if self.on_message is not None and message.topic == self.accept:
            try:
                self.on_message(bytes(message.payload))
            except Exception:  # paho would swallow it: say it
                log.exception("mqtt %s: the message handler failed", self.target.name)

    async def ping(self, limit: float) -> float:
        """One PINGREQ answered by PINGRESP within ``limit`` seconds: the round trip. No
        answer in time ends the connection as ``timeout`` (raised, like a lost one's error).
        The session's own keepalive is not needed for this (paho's resets with it)."""
        client = self._client
        if client is None or not self.connected or self.closed.done():
            raise MqttError("unreachable", f"{where(self.target)}: not connected")
        self._pong = pong = self.loop.create_future()
        sent = time.monotonic()
        if client._send_pingreq() != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self.abort(MqttError("unreachable", f"{where(self.target)}: cannot send PINGREQ"))
        await asyncio.wait((pong, self.closed), timeout=limit,
                           return_when=asyncio.FIRST_COMPLETED)
        if pong.done():
            return time.monotonic() - sent
        if not self.closed.done():
            self.abort(MqttError("timeout", f"{where(self.target)}: no PINGRESP within "
                                 f"{limit:g}s"))
        raise self.closed.result() or MqttError("unreachable", f"{where(self.target)}: closed")

    async def disconnect(self, limit: float = 1.0) -> None:
        """Send DISCONNECT and wait (bounded) for it to leave; then make sure all is shut."""
        client = self._client
        if client is not None and self.connected and not self.closed.done():
            self._disconnecting = True
            client.disconnect()
            with contextlib.suppress(*compat.TimeoutErrors):
                async with compat.timeout(limit):
                    await asyncio.shield(self.closed)
        self.abort()

    def abort(self, error: MqttError | None = None) -> None:
        """Close the socket now (no DISCONNECT); idempotent."""
        client = self._client
        if client is not None:
            with contextlib.suppress(Exception):
                client._sock_close()  # the one way to drop paho's socket
        self._unwatch()
        if self._tap is not None:
            with contextlib.suppress(OSError):
                self._tap.close()
        self._finish(error or MqttError("unreachable", f"{where(self.target)}: closed"))

    # --- paho callbacks (never raise: paho would) -------------------------------------

    def _finish(self, error: MqttError | None) -> None:
        self.connected = False
        if not self._connack.done():
            self._connack.set_exception(error or MqttError(
                "protocol_error", f"{where(self.target)}: closed before CONNACK"))
            self._connack.exception()  # retrieved: no "never retrieved" warning
        failure = error or MqttError("unreachable", f"{where(self.target)}: disconnected")
        for fut in self._acks.values():
            if not fut.done():
                fut.set_exception(failure)
                fut.exception()
        self._acks.clear()
        if not self.closed.done():
            self.closed.set_result(error)
        if self._misc is not None and self._misc is not asyncio.current_task():
            self._misc.cancel()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any,
                    properties: Any) -> None:
        if self._connack.done():
            return
        if reason.is_failure:
            self._connack.set_exception(self._refusal() or endings.refused(
                self.target, f"{reason} (code {reason.value})"))
        else:
            self._connack.set_result(None)

    def _refusal(self) -> MqttError | None:
        """An MQTT 3.1.1 CONNACK refusal, named by the code the framer saw."""
        code = self._tap.framer.connack_code if self._tap is not None else None
        return endings.refusal(self.target, code)

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any,
                       properties: Any) -> None:
        if self._disconnecting and not self._in_misc:
            self._finish(None)
            return
        tap = self._tap
        error, ended_by = endings.disconnected(
            self.target, connack_seen=self._connack.done(),
            connack_code=tap.framer.connack_code if tap is not None else None,
            received=tap.rx if tap is not None else 0, eof=tap is not None and tap.eof,
            in_keepalive=self._in_misc, keepalive=self.keepalive, flags=flags, reason=reason)
        if ended_by is not None:
            self.ended_by = ended_by
        self._unwatch()
        self._finish(error)

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any,
                    properties: Any) -> None:
        fut = self._acks.pop(mid, None)
        if fut is None or fut.done():
            return
        if reason is not None and reason.is_failure:
            fut.set_exception(MqttError("refused", f"{where(self.target)}: the broker "
                                        f"rejected the publish: {reason}"))
        else:
            fut.set_result(None)

    def _on_socket_open(self, client: Any, userdata: Any, sock: Any) -> None:
        self._fd = sock.fileno()
        self.loop.add_reader(self._fd, self._readable)

    def _on_socket_close(self, client: Any, userdata: Any, sock: Any) -> None:
        self._unwatch()

    def _on_register_write(self, client: Any, userdata: Any, sock: Any) -> None:
        if self._fd is not None:
            self.loop.add_writer(self._fd, self._writable)

    def _on_unregister_write(self, client: Any, userdata: Any, sock: Any) -> None:
        if self._fd is not None:
            self.loop.remove_writer(self._fd)

    def _unwatch(self) -> None:
        if self._fd is not None:
            self.loop.remove_reader(self._fd)
            self.loop.remove_writer(self._fd)
            self._fd = None

    def _readable(self) -> None:
        client, tap = self._client, self._tap
        if client is None or tap is None:
            return
        try:
            client.loop_read()
            rounds = 0
            while tap.pending() and client.socket() is not None and rounds < _SSL_PENDING_ROUNDS:
                client.loop_read()
                rounds += 1
            if self._pong is not None and not self._pong.done() and client._ping_t == 0:
                self._pong.set_result(None)  # paho clears _ping_t on PINGRESP
        except FramingError as err:  # before paho buffered it: no 256 MB allocations
            self.abort(MqttError("protocol_error", f"{where(self.target)}: {err}"))
        except Exception as err:  # paho choking on garbage must not reach the loop
            log.debug("mqtt %s: read failed: %r", self.target.name, err)
            self.abort(self._refusal() or MqttError(
                "protocol_error", f"{where(self.target)}: unreadable answer "
                f"({type(err).__name__})"))

    def _writable(self) -> None:
        client = self._client
        if client is None:
            return
        try:
            client.loop_write()
        except Exception as err:
            log.debug("mqtt %s: write failed: %r", self.target.name, err)
            self.abort(MqttError("unreachable", f"{where(self.target)}: write failed"))

    async def _misc_loop(self) -> None:
        client = self._client
        while client is not None and not self.closed.done():
            await asyncio.sleep(MISC_TICK)
            self._in_misc = True
            try:
                client.loop_misc()
            except Exception as err:  # supervised: a dead keepalive must not go unseen
                log.exception("mqtt %s: keepalive task failed", self.target.name)
                self.abort(MqttError("internal_error", f"{where(self.target)}: keepalive "
                                     f"task failed ({type(err).__name__})"))
                return
            finally:
                self._in_misc = False
