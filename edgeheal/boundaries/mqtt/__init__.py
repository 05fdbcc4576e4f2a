"""The MQTT boundary: broker probes and the kept-open alert connection, over paho-mqtt 2.x.

Why a boundary of our own: paho is a fine codec for MQTT 3.1.1 and 5 but its network side
is blocking (``connect`` resolves, connects and does the TLS handshake synchronously) and
its failures arrive as integers, reason-code objects or exceptions depending on where they
happen. Here the TCP connect and the TLS handshake are done by asyncio on a non-blocking
socket, then handed to paho, which is driven by the event loop's reader/writer callbacks
(``loop_read``/``loop_write``, as aiomqtt 2.x does) — no thread per probe, and every step
is under one hard deadline, so a peer that accepts and never answers, or answers garbage,
cannot hang or crash the agent. Every failure becomes one :class:`MqttError` whose
``reason`` is from the closed table below.

Reasons (and what the mqtt check makes of them):

=================  ======  ==============================================================
reason             state   meaning
=================  ======  ==============================================================
``ok``             ok      CONNECT answered by a successful CONNACK (then DISCONNECT)
``refused``        failed  the broker answered but rejected us (bad credentials, not
                           authorized, client id rejected): a configuration problem
``tls_error``      failed  the TLS handshake failed (untrusted or mismatching certificate,
                           the peer does not speak TLS)
``timeout``        failed  no CONNACK (or no keepalive answer) within the deadline
``unreachable``    failed  connection refused, no route, name does not resolve
``protocol_error`` failed  the peer answered with something that is not MQTT, closed
                           the connection without answering, or announced a packet larger
                           than :data:`~edgeheal.boundaries.mqtt.transport.MAX_PACKET` (64 KiB)
``config_error``   failed  a local file (password_file, ca/cert/key file) is unusable, or
                           a setting cannot be sent (host name, client id: see
                           :func:`host_problem`, :func:`string_problem`)
``internal_error`` failed  an unexpected error inside edgeheal while connecting (logged
                           with a traceback): a bug to report
=================  ======  ==============================================================

The password is read from ``password_file`` at each connect, passed to paho, and never
logged, shown or kept in an error message.

Modules: :mod:`~edgeheal.boundaries.mqtt.transport` (resolve, TCP, TLS and its session resumption;
no paho), :mod:`~edgeheal.boundaries.mqtt.client` (the paho-driven session over that
socket), :mod:`~edgeheal.boundaries.mqtt.endings` (what a refused CONNECT or an ended
connection is called; no paho), :mod:`~edgeheal.boundaries.mqtt.session` (the probe, and
the kept-open probe session the check uses: one PINGREQ per check),
:mod:`~edgeheal.boundaries.mqtt.link` (the kept-open
alert connection). Public API:
:func:`probe` (one CONNECT/CONNACK/DISCONNECT), :class:`ProbeResult`, :class:`MqttError`,
:class:`edgeheal.boundaries.mqtt.transport.TlsResumption` and
:class:`edgeheal.boundaries.mqtt.link.Link`. paho is imported only when a connection is made.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgeheal.boundaries.mqtt.transport import TlsResumption
    from edgeheal.config import MqttTarget

REASONS = ("ok", "refused", "tls_error", "timeout", "unreachable", "protocol_error",
           "config_error", "internal_error")
"""The closed table of probe reasons (see the module docstring)."""


MAX_STRING = 65535
"""Bytes in an MQTT UTF-8 string (client id, user name, topic): a 16-bit length prefix."""
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def host_problem(host: str) -> str | None:
    """Why ``host`` cannot be connected to (None if it can): an IP address, or a DNS name of
    labels of 1-63 letters, digits, '-' or '_' (IDNA for other letters), 253 at most."""
    if not host:
        return "is empty"
    try:
        ipaddress.ip_address(host.split("%", 1)[0] if ":" in host else host)
    except ValueError:
        pass
    else:
        return None
    if len(host) > 253:
        return f"is {len(host)} characters long; a host name has at most 253"
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return "is not a valid host name (an empty or over-long label, e.g. '..')"
    labels = ascii_host[:-1].split(".") if ascii_host.endswith(".") else ascii_host.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return ("is not a valid host name (labels of 1-63 letters, digits, '-' and '_', "
                "separated by single dots)")
    return None


def string_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as an MQTT string (None if it can)."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_STRING:
        return f"is {size} bytes long; MQTT allows at most {MAX_STRING}"
    if "\0" in value:
        return "contains a NUL character"
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        return "is not valid UTF-8 text"
    return None


def client_id(target: MqttTarget, node: str) -> str:
    """The client id sent in CONNECT: ``client_id`` or ``edgeheal-<node>-<target name>``."""
    return target.client_id or f"edgeheal-{node}-{target.name}"


class MqttError(Exception):
    """A broker could not be reached or used; ``reason`` is from :data:`REASONS`.

    The message names the broker and what went wrong, never a password.
    """

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown MQTT failure reason {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The outcome of one probe. ``rtt_seconds`` is CONNECT -> CONNACK, None on failure."""

    reason: str
    rtt_seconds: float | None
    message: str
    tcp_connect_seconds: float | None = None
    ping_seconds: float | None = None
    """PINGREQ -> PINGRESP when a kept-open session was asked (its ``rtt_seconds`` is the
    session's CONNECT -> CONNACK); None for a connect."""

    @property
    def ok(self) -> bool:
        return self.reason == "ok"


async def probe(target: MqttTarget, node: str, *, limit: float | None = None,
                resume: TlsResumption | None = None) -> ProbeResult:
    """One CONNECT answered by CONNACK, then a clean DISCONNECT, under one hard deadline.

    The deadline is ``limit`` seconds or, by default, a little less than ``target.timeout`` (so
    the probe, not the supervisor's own timeout, reports a ``timeout``). With ``resume`` a
    TLS probe resumes the session of the previous one (and keeps this one's). Never raises
    for anything the network or the peer does; see :data:`REASONS`.
    """
    from edgeheal.boundaries.mqtt.session import probe as _probe  # paho on demand

    return await _probe(target, node, limit=limit, resume=resume)
