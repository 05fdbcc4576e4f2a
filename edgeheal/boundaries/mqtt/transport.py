"""The network side of an MQTT connection: resolve, connect, TLS, byte counts; no MQTT.

Why apart from the client (:mod:`edgeheal.boundaries.mqtt.client`): paho's ``connect()`` would
resolve, connect and handshake TLS synchronously (a thread per probe, or a blocked loop).
Here :func:`open_socket` resolves (numeric hosts without the resolver thread), connects a
non-blocking socket with ``loop.sock_connect`` and runs the TLS handshake by waiting on
the file descriptor; the client then hands the connected socket to paho. This module
never imports paho, so the socket and TLS steps can be read (and timed) on their own.

``stage`` lists carry the step in progress (resolving, TCP connect, TLS handshake), so the
one deadline the caller puts around a connect can say where it struck. Every failure here
is an :class:`~edgeheal.boundaries.mqtt.MqttError` (``unreachable``, ``tls_error``,
``config_error``).

:class:`Tap` is the socket paho reads from: every read is bounded (:data:`RECV_CHUNK`) and
passes :class:`Framer`, edgeheal's own reader of the MQTT fixed header, which refuses a
stream that cannot be a broker's (and a packet over :data:`MAX_PACKET`) before paho
buffers a byte of it.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from typing import Any

from edgeheal.boundaries.mqtt import MqttError, host_problem
from edgeheal.config import MqttTarget

_UNREACHABLE_ERRNOS = {errno.ECONNREFUSED: "connection refused",
                       errno.EHOSTUNREACH: "no route to host",
                       errno.ENETUNREACH: "network unreachable",
                       errno.ECONNRESET: "connection reset",
                       errno.ETIMEDOUT: "connection timed out"}


def where(target: MqttTarget) -> str:
    """``name (host:port)`` for messages; IPv6 hosts in brackets."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    return f"{target.name} ({host}:{target.port})"


def _no_key_passphrase() -> bytes:
    """Refuse encrypted client keys instead of letting OpenSSL prompt on a terminal."""
    raise ValueError("encrypted client keys are not supported")


def tls_context(target: MqttTarget) -> ssl.SSLContext:
    try:
        ctx = ssl.create_default_context(cafile=target.ca_file or None)
        if target.cert_file:
            ctx.load_cert_chain(target.cert_file, target.key_file or None,
                                password=_no_key_passphrase)
    except (OSError, ssl.SSLError, ValueError) as err:
        files = ", ".join(f for f in (target.ca_file, target.cert_file, target.key_file) if f)
        raise MqttError("config_error", f"{where(target)}: cannot load TLS files ({files}): "
                        f"{getattr(err, 'strerror', None) or err}") from err
    return ctx


async def _resolve(target: MqttTarget) -> list[tuple[Any, ...]]:
    problem = host_problem(target.host)  # the IDNA codec raises UnicodeError on "a..b"
    if problem is not None:
        raise MqttError("config_error", f"{target.name}: host {problem}")
    try:  # an address literal needs no resolver (and no executor thread)
        return socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        pass
    loop = asyncio.get_running_loop()
    try:
        return await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise MqttError("unreachable", f"{where(target)}: cannot resolve host: "
                        f"{err.strerror}") from err


async def _wait_fd(fd: int, *, write: bool) -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, ready)
    try:
        await fut
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


class TlsResumption:
    """TLS state kept between probes of one target: the context and the last session.

    Resuming the session (TLS 1.3 ticket / 1.2 session id) skips the certificate chain and
    the key exchange, which is most of a TLS probe's bytes. A session can only be resumed
    with the context that made it, so both are kept; a failed probe drops both (a changed
    CA file is then read again).
    """

    def __init__(self) -> None:
        self.context: ssl.SSLContext | None = None
        self.session: ssl.SSLSession | None = None

    def reset(self) -> None:
        self.context = self.session = None


async def open_socket(target: MqttTarget, stage: list[str],
                      resume: TlsResumption | None = None) -> socket.socket:
    """A connected (and, with ``tls``, handshaken) non-blocking socket.

    ``stage`` receives the step in progress, so a deadline can say where it struck.
    """
    ctx: ssl.SSLContext | None = None
    if target.tls:
        ctx = resume.context if resume is not None and resume.context else tls_context(target)
        if resume is not None:
            resume.context = ctx
    stage[0] = "resolving the host"
    infos = await _resolve(target)
    loop = asyncio.get_running_loop()
    errors: list[str] = []
    sock: socket.socket | None = None
    stage[0] = "TCP connect"
    for family, _type, proto, _canon, addr in infos:
        candidate = socket.socket(family, socket.SOCK_STREAM, proto)
        try:
            candidate.setblocking(False)
            candidate.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(candidate, addr)
        except OSError as err:
            candidate.close()
            errors.append(_UNREACHABLE_ERRNOS.get(err.errno or 0, err.strerror or str(err)))
            continue
        except BaseException:
            candidate.close()
            raise
        sock = candidate
        break
    if sock is None:
        raise MqttError("unreachable", f"{where(target)}: {'; '.join(dict.fromkeys(errors))}")
    if ctx is None:
        return sock
    stage[0] = "TLS handshake"
    return await _tls_handshake(target, ctx, sock, resume.session if resume else None)


async def _tls_handshake(target: MqttTarget, ctx: ssl.SSLContext, sock: socket.socket,
                         tls_session: ssl.SSLSession | None) -> ssl.SSLSocket:
    try:
        tls = ctx.wrap_socket(sock, server_hostname=target.server_name or target.host,
                              do_handshake_on_connect=False, session=tls_session)
    except BaseException:
        sock.close()
        raise
    try:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await _wait_fd(tls.fileno(), write=False)
            except ssl.SSLWantWriteError:
                await _wait_fd(tls.fileno(), write=True)
    except ssl.SSLCertVerificationError as err:
        tls.close()
        raise MqttError("tls_error", f"{where(target)}: certificate not accepted: "
                        f"{err.verify_message}") from err
    except (ssl.SSLError, ConnectionError, OSError) as err:
        tls.close()
        text = (getattr(err, "reason", None) or getattr(err, "strerror", None)
                or type(err).__name__)
        raise MqttError("tls_error", f"{where(target)}: TLS handshake failed ({text}); does "
                        "the port speak TLS?") from err
    except BaseException:
        tls.close()
        raise
    return tls


MAX_PACKET = 64 * 1024
"""The largest MQTT packet (remaining length, bytes) accepted from a broker. The agent
only ever receives CONNACK, PUBACK, PINGRESP and (MQTT 5) DISCONNECT: a few bytes, a few
hundred with MQTT 5 properties. A larger announcement is refused before anything is
buffered, so a broken or hostile broker cannot make the agent allocate its 256 MB."""
RECV_CHUNK = 16 * 1024
"""At most this many bytes per ``recv``: paho asks for a whole packet's remaining length
at once, and ``recv(n)`` allocates ``n`` bytes before a single one arrives."""

# Packet types a client may receive (MQTT 3.1.1 and 5): CONNACK, PUBLISH, PUBACK, PUBREC,
# PUBREL, PUBCOMP, SUBACK, UNSUBACK, PINGRESP, DISCONNECT (5), AUTH (5).
_FROM_BROKER = frozenset({2, 3, 4, 5, 6, 7, 9, 11, 13, 14, 15})
PUBLISH = 3
"""A broker's PUBLISH is refused (:class:`Framer`): the agent subscribes to nothing but the
fleet hold's one topic (when ``[fleet] hold`` is on), so any other can only be a
misbehaving or hostile broker, and paho would keep each QoS 2 message until its PUBREL
(issue 27: 6,000 x 60 KB reached 405 MB)."""
MAX_ACCEPTED_PUBLISH = 2048
"""Bytes (remaining length) of the one PUBLISH accepted: the hold's topic, its packet id,
MQTT 5 properties and a payload of at most 1 KiB."""
_NAMES = {1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL",
          7: "PUBCOMP", 8: "SUBSCRIBE", 9: "SUBACK", 10: "UNSUBSCRIBE", 11: "UNSUBACK",
          12: "PINGREQ", 13: "PINGRESP", 14: "DISCONNECT", 15: "AUTH"}


class FramingError(Exception):
    """The broker's byte stream is not acceptable MQTT (message says why, never payload)."""


class Framer:
    """Follows the packets a broker sends through the byte stream, before paho sees them.

    Reads each fixed header (type byte, remaining length in at most 4 bytes) and skips the
    body without keeping it; keeps only the first CONNACK's two header bytes (flags,
    return code) for :attr:`connack_code`. Raises :class:`FramingError` when the stream
    cannot be a broker's: the first packet is not a CONNACK, a packet type a broker never
    sends, a remaining length longer than 4 bytes, one above ``max_packet``, or a PUBLISH
    (:data:`PUBLISH`) — except, when ``accept`` names a topic (the fleet hold's), a PUBLISH
    of that exact topic at QoS 0 or 1 of at most :data:`MAX_ACCEPTED_PUBLISH` bytes, which
    is let through to paho: its topic is compared as soon as its bytes arrive.
    """

    def __init__(self, max_packet: int = MAX_PACKET, accept: bytes | None = None) -> None:
        self.max_packet = max_packet
        self.accept = accept
        self.accepted = 0
        """PUBLISH packets of the accepted topic let through."""
        self._topic = bytearray()
        self.packets = 0
        """Complete packets seen."""
        self.first: int | None = None
        self.connack_code: int | None = None
        """The first CONNACK's return code (3.1.1) or reason code (5); None before it."""
        self._kind = 0
        self._flags = 0
        self._length = 0
        self._length_bytes = 0
        self._left = 0
        self._state = "header"  # header -> length -> body -> header
        self._connack = bytearray()

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if self._state == "header":
                self._header(data[i])
                i += 1
                self._state, self._length, self._length_bytes = "length", 0, 0
            elif self._state == "length":
                byte = data[i]
                i += 1
                self._length += (byte & 0x7F) << (7 * self._length_bytes)
                self._length_bytes += 1
                if byte & 0x80:
                    if self._length_bytes >= 4:
                        raise FramingError("malformed MQTT packet: remaining length longer "
                                           "than 4 bytes")
                    continue
                self._body_starts()
            else:
                take = min(self._left, n - i)
                if self._kind == PUBLISH:
                    self._match_topic(data[i:i + take])
                if self._kind == 2 and self.connack_code is None:
                    self._connack += data[i:i + min(take, 2 - len(self._connack))]
                    if len(self._connack) == 2:
                        self.connack_code = self._connack[1]
                i += take
                self._left -= take
                if self._left == 0:
                    self._packet_done()

    def _header(self, byte: int) -> None:
        kind = byte >> 4
        if self.first is None:
            self.first = byte
            if kind != 2:
                raise FramingError(f"the peer answered with something that is not MQTT "
                                   f"(first byte 0x{byte:02x}, a CONNACK starts with 0x20)")
        if kind not in _FROM_BROKER:
            raise FramingError(f"malformed MQTT stream: a broker never sends packet type "
                               f"{kind} ({_NAMES.get(kind, 'reserved')})")
        self._kind = kind
        self._flags = byte & 0x0F

    def _match_topic(self, chunk: bytes) -> None:
        """Compare the PUBLISH's topic (2-byte length, then the name) with ``accept``."""
        want = b"%c%c" % divmod(len(self.accept or b""), 256) + (self.accept or b"")
        room = len(want) - len(self._topic)
        if room <= 0:
            return
        self._topic += chunk[:room]
        if not want.startswith(bytes(self._topic)):
            raise FramingError("the broker sent a PUBLISH of a topic edgeheal never "
                               "subscribed to: refused")
        if len(self._topic) == len(want):
            self.accepted += 1

    def _body_starts(self) -> None:
        if self._length > self.max_packet:
            raise FramingError(f"the broker announced a {self._length}-byte "
                               f"{_NAMES[self._kind]} packet; edgeheal accepts at most "
                               f"{self.max_packet} bytes")
        if self._kind == PUBLISH:
            self._accept_publish()
        if self._kind == 2 and self._length < 2:
            raise FramingError(f"malformed CONNACK: {self._length}-byte body, expected at "
                               "least 2")
        self._left = self._length
        if self._left == 0:
            self._packet_done()
        else:
            self._state = "body"

    def _accept_publish(self) -> None:
        """Only the accepted topic, at QoS 0 or 1, small; its topic is checked as it comes."""
        if self.accept is None:
            raise FramingError("the broker sent a PUBLISH, but edgeheal subscribes to nothing: "
                               "refused (kept, a QoS 2 flood would fill the agent's memory "
                               "until PUBRELs that never come)")
        if (self._flags >> 1) & 3 > 1:
            raise FramingError("the broker sent a QoS 2 PUBLISH; edgeheal subscribes at QoS 1: "
                               "refused")
        if self._length > MAX_ACCEPTED_PUBLISH:
            raise FramingError(f"the broker announced a {self._length}-byte PUBLISH; a fleet "
                               f"hold is at most {MAX_ACCEPTED_PUBLISH} bytes: refused")
        self._topic = bytearray()
        if self._length < 2 + len(self.accept):
            raise FramingError("malformed PUBLISH: shorter than its topic")

    def _packet_done(self) -> None:
        self.packets += 1
        self._state = "header"


class Tap:
    """The socket as paho sees it: follows the packets (:class:`Framer`), bounds every read
    and counts bytes both ways. A :class:`FramingError` leaves ``recv`` before paho sees
    the bytes (paho lets it through ``loop_read``)."""

    def __init__(self, sock: socket.socket, *, max_packet: int = MAX_PACKET,
                 accept: bytes | None = None) -> None:
        self.sock = sock
        self.framer = Framer(max_packet, accept)
        self.rx = 0
        self.tx = 0
        self.eof = False
        """The peer closed the connection in order (a read returned no bytes)."""

    @property
    def first(self) -> int | None:
        return self.framer.first

    def recv(self, bufsize: int) -> bytes:
        data = self.sock.recv(min(bufsize, RECV_CHUNK))
        if not data and bufsize > 0:
            self.eof = True
        self.rx += len(data)
        self.framer.feed(data)
        return data

    def send(self, buf: bytes | bytearray) -> int:
        sent = self.sock.send(buf)
        self.tx += sent
        return sent

    def close(self) -> None:
        self.sock.close()

    def fileno(self) -> int:
        return self.sock.fileno()

    def setblocking(self, flag: bool) -> None:
        self.sock.setblocking(flag)

    def pending(self) -> int:
        """Decrypted bytes TLS holds back from the next read (paho must drain them)."""
        return self.sock.pending() if isinstance(self.sock, ssl.SSLSocket) else 0

    @property
    def session(self) -> ssl.SSLSession | None:
        """The TLS session, for resumption by the next connection to the same broker."""
        return self.sock.session if isinstance(self.sock, ssl.SSLSocket) else None
