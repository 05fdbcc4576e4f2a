"""Probing a broker: one CONNECT/CONNACK/DISCONNECT (:func:`probe`), or a session kept open
and asked with one PINGREQ/PINGRESP per check (:class:`Session`, what the mqtt check uses).

Why a kept-open session: edge boxes pay for their 4G/5G bytes, and a new connection per
probe pays the TCP handshake, CONNECT, CONNACK, DISCONNECT and the TCP close every time
(644 bytes, 11 packets; through the tunnel each packet also pays WireGuard's 60 bytes),
where a PINGREQ answered by PINGRESP on an open connection is 160 bytes in 3 packets and
proves the same thing: the broker answers MQTT over this path, now. With TLS the saving
is larger still (a resumed handshake is ~2 KB). A session that was lost between checks
(the broker restarted, closed us) is made again in the same check, so what a check
reports is what a fresh probe would have reported; a ping that gets no answer within
:data:`PING_GRACE` ends the session, and a new connection in what is left of the deadline
gives the check's result (a dead path's ``timeout``, or ``unreachable`` at once when the
route is gone, which an established connection would only retry), so a dead path is
confirmed as fast as with one probe per check.
Through the tunnel the session's TCP flow is inside WireGuard, so no carrier NAT times it
out; on the direct path one ping per minute is far below the carrier NATs' TCP timeouts.

The session's MQTT keepalive (sent in CONNECT) is :func:`session_keepalive`: longer than
the check's cadence, so neither paho nor the broker pings or drops on its own between
checks, and a broker still drops a session whose agent is gone without a DISCONNECT.
"""

from __future__ import annotations

import logging
import time

from edgeheal.base import compat
from edgeheal.boundaries.mqtt import MqttError, ProbeResult
from edgeheal.boundaries.mqtt.client import Connection
from edgeheal.boundaries.mqtt.transport import TlsResumption, where
from edgeheal.config import MqttTarget

log = logging.getLogger("edgeheal.mqtt.client")  # the name operators grep for

__all__ = ("Session", "connect", "probe", "session_keepalive")

PING_GRACE = 1.0
"""Seconds a ping may take before the check asks a new connection instead: a broker answers
in a round trip, and TCP retransmits a lost PINGREQ within about 0.2-0.6 s."""
DEFAULT_INTERVAL = 60.0
"""The cadence assumed for a target without an ``interval`` of its own."""


def _margin(timeout: float) -> float:
    """The probe finishes a little before the supervisor's own timeout would strike."""
    return max(timeout * 0.9, timeout - 0.5)


def session_keepalive(target: MqttTarget) -> float:
    """The kept-open probe session's MQTT keepalive: two check intervals and a timeout."""
    interval = target.interval if target.interval is not None else DEFAULT_INTERVAL
    return min(65535.0, 2 * interval + target.timeout)


async def connect(conn: Connection, limit: float,
                  resume: TlsResumption | None = None) -> ProbeResult:
    """``conn.connect()`` under one deadline, as a result; never raises for the peer. A
    failure aborts ``conn`` and forgets the TLS session; a success keeps both open."""
    target = conn.target
    try:
        async with compat.timeout(limit):
            rtt = await conn.connect()
    except MqttError as err:
        result = ProbeResult(err.reason, None, err.message, conn.tcp_seconds)
    except compat.TimeoutErrors:
        result = ProbeResult("timeout", None, f"{where(target)}: no progress within "
                             f"{limit:g}s ({conn.stage[0]})", conn.tcp_seconds)
    except Exception as err:  # a bug must show as one, not as a dead check
        log.exception("mqtt %s: unexpected %s while probing", target.name,
                      type(err).__name__)
        result = ProbeResult("internal_error", None, f"{where(target)}: unexpected "
                             f"{type(err).__name__} while connecting (a bug; see the log)",
                             conn.tcp_seconds)
    except BaseException:
        conn.abort()
        raise
    else:
        if resume is not None:
            resume.session = conn.session
        return ProbeResult("ok", rtt, f"CONNACK in {rtt * 1000:.1f} ms", conn.tcp_seconds)
    conn.abort()
    if resume is not None:
        resume.reset()
    return result


async def probe(target: MqttTarget, node: str, *, limit: float | None = None,
                resume: TlsResumption | None = None) -> ProbeResult:
    """One CONNECT/CONNACK/DISCONNECT under one deadline; never raises for the peer."""
    limit = limit if limit is not None else _margin(target.timeout)
    conn = Connection(target, node, keepalive=max(60.0, target.keepalive), resume=resume)
    result = await connect(conn, limit, resume)
    if result.ok:
        await conn.disconnect(min(1.0, limit))
    return result


class Session:
    """One target's kept-open probe session: CONNECT once, then a PINGREQ per check."""

    def __init__(self, target: MqttTarget, node: str) -> None:
        self.target, self.node = target, node
        self.resume = TlsResumption() if target.tls else None
        self.keepalive = session_keepalive(target)
        self.connects = 0
        """Connections made (1 for a session that never broke)."""
        self.rtt: float | None = None
        """CONNECT -> CONNACK of the current connection."""
        self._conn: Connection | None = None

    @property
    def open(self) -> bool:
        conn = self._conn
        return conn is not None and conn.connected and not conn.closed.done()

    async def check(self, limit: float | None = None) -> ProbeResult:
        """Ping the open session, or (re)connect; never raises for the peer."""
        limit = limit if limit is not None else _margin(self.target.timeout)
        conn = self._conn
        began = time.monotonic()
        if conn is not None and self.open:
            try:
                ping = await conn.ping(min(PING_GRACE, limit / 2))
            except MqttError as err:
                # no answer in time, or closed under us (a FIN or RST not read yet): a new
                # connection says what the path does now, in what is left of the deadline
                # (at once when the route is gone: an established connection only retries)
                self._forget(reset=err.reason == "timeout")
            except BaseException:
                self._forget(reset=True)
                raise
            else:
                return ProbeResult("ok", self.rtt, f"PINGRESP in {ping * 1000:.1f} ms on "
                                   "the kept-open session", ping_seconds=ping)
        self._forget()  # lost since the last check: make it again now
        limit = max(0.1, limit - (time.monotonic() - began))
        conn = Connection(self.target, self.node, keepalive=self.keepalive,
                          resume=self.resume)
        result = await connect(conn, limit, self.resume)
        if result.ok:
            self._conn, self.rtt = conn, result.rtt_seconds
            self.connects += 1
        return result

    def _forget(self, *, reset: bool = False) -> None:
        """Drop the connection; keep its TLS session for the next one unless ``reset`` (a
        session that stopped answering starts TLS afresh and re-reads the CA file)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.resume is not None:
            if reset:
                self.resume.reset()
            elif conn.session is not None:
                self.resume.session = conn.session  # the latest ticket
        conn.abort()

    async def close(self, limit: float = 0.2) -> None:
        """DISCONNECT (bounded), then make sure the socket is shut."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.disconnect(limit)
