"""One TCP segment of a chosen size, sent with DF, and whether the far end acknowledged it.

Why TCP and not ICMP: the collectors' path to the broker is a Service ClusterIP, which
kube-proxy DNATs for TCP only (an echo request to it is answered by nobody), and the
black hole the ``pmtu`` check looks for is exactly "a TCP handshake passes, full segments
do not". So the probe is the collectors' own path: a TCP connection to the target whose
one data segment is a full IP packet of ``size`` bytes, with the Don't Fragment bit set and
the cached path MTU ignored (``IP_PMTUDISC_PROBE``: an earlier ICMP "fragmentation needed"
must not shrink the probe, and on a black-holed path none arrives anyway).

How the size is chosen: ``TCP_MAXSEG`` before ``connect`` caps the connection's MSS at
``size`` minus the IP and TCP headers; the kernel then sends a segment of exactly
``size`` bytes on the wire (TCP options such as timestamps come out of the MSS: Linux
``__tcp_mtu_to_mss``/``tcp_current_mss``). After the handshake the probe writes exactly
one segment's worth (``TCP_MAXSEG`` read back: the current send MSS) and waits until the
send queue holds nothing unacknowledged (``SIOCOUTQ`` = 0): the far end's *kernel*
acknowledged it, whatever the application thinks of the bytes. The bytes are a valid MQTT
3.1.1 CONNECT whose will message is padding, so a broker sees a client connect and leave.
A lost segment is retransmitted by TCP meanwhile, so one random loss does not lose a size.

A probe that got no acknowledgement is closed with ``SO_LINGER`` 0 (a reset): the kernel
must not keep retransmitting an orphaned segment for minutes. ``mark`` sets ``SO_MARK``
(CAP_NET_ADMIN) so an MSS clamp can leave the probe's own connection alone.

Errors never raise: the outcome says ``passed``, ``lost`` or ``connect_failed`` with the
kernel's words.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import time
from dataclasses import dataclass
from typing import Literal

from edgeheal.base import compat

SIOCGIFMTU = 0x8921
SIOCOUTQ = 0x5411
"""``TIOCOUTQ``: bytes in a TCP socket's send queue not yet acknowledged."""
IP_MTU_DISCOVER, IP_PMTUDISC_PROBE = 10, 3
IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE = 23, 3
SO_MARK = 36
TCP_HEADER = 20
POLL = 0.02
"""Seconds between two reads of the send queue while waiting for the acknowledgement."""

Kind = Literal["passed", "lost", "connect_failed"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one probe."""

    kind: Kind
    size: int
    """The IP packet size actually sent (the requested one unless the peer's MSS or the
    route's MTU is smaller), bytes; the requested size when nothing was sent."""
    message: str = ""
    rtt: float | None = None
    """Seconds from the write to the acknowledgement (``passed`` only)."""


def header(family: int) -> int:
    """IP + TCP header bytes of a segment without options."""
    return (40 if family == socket.AF_INET6 else 20) + TCP_HEADER


def device_mtu(name: str) -> int | None:
    """The MTU of device ``name`` in this thread's network namespace (``SIOCGIFMTU``), or
    None when there is no such device."""
    request = struct.pack("16si12x", name.encode()[:15], 0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), SIOCGIFMTU, request)
        except OSError:
            return None
    return int(struct.unpack("16si12x", answer)[1])


def connect_packet(length: int, client_id: str) -> bytes:
    """An MQTT 3.1.1 CONNECT (clean session, a QoS 0 will) of exactly ``length`` bytes
    (at least 64); the will message is padding."""
    cid = client_id.encode()[:64]
    topic = b"edgeheal/pmtu"
    variable = b"\x00\x04MQTT\x04\x06\x00\x3c"  # level 4, clean + will flag, keepalive 60
    fixed = len(variable) + 2 + len(cid) + 2 + len(topic) + 2
    if length < fixed + 3 + 1:
        raise ValueError(f"a CONNECT needs at least {fixed + 4} bytes, asked for {length}")
    remaining = length - 3  # a two-byte remaining length covers 128..16383
    if not 128 <= remaining <= 16383:
        raise ValueError(f"CONNECT length {length} out of range")
    pad = remaining - fixed
    body = (variable + len(cid).to_bytes(2, "big") + cid + len(topic).to_bytes(2, "big")
            + topic + pad.to_bytes(2, "big") + b"\x00" * pad)
    return bytes((0x10, (remaining & 0x7F) | 0x80, remaining >> 7)) + body


def _options(sock: socket.socket) -> int:
    """TCP option bytes every data segment carries (timestamps: 12)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    return 12 if info[5] & 0x01 else 0  # tcpi_options & TCPI_OPT_TIMESTAMPS


def _unacked(sock: socket.socket) -> int:
    buf = fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\x00\x00\x00\x00")
    return int(struct.unpack("i", buf)[0])


async def probe(address: tuple[str, int], family: int, size: int, *, wait: float,
                connect_timeout: float, mark: int | None = None,
                client_id: str = "edgeheal-pmtu") -> Outcome:
    """Send one segment of ``size`` IP bytes to ``address`` and wait ``wait`` s for its ACK."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(family, socket.SOCK_STREAM)
    acked = False
    try:
        sock.setblocking(False)
        mss = size - header(family)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE)
        else:
            sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_PROBE)
        if mark is not None:
            sock.setsockopt(socket.SOL_SOCKET, SO_MARK, mark)
        try:
            async with compat.timeout(connect_timeout):
                await loop.sock_connect(sock, address)
        except compat.TimeoutErrors:
            return Outcome("connect_failed", size, f"no answer to the TCP handshake within "
                           f"{connect_timeout:g}s")
        except OSError as err:
            return Outcome("connect_failed", size, err.strerror or str(err))
        send_mss = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
        options = _options(sock)
        sent = header(family) + options + send_mss
        payload = (connect_packet(send_mss, client_id) if 131 <= send_mss <= 16386
                   else b"\x00" * send_mss)
        started = time.monotonic()
        try:
            await loop.sock_sendall(sock, payload)
        except OSError as err:
            return Outcome("connect_failed", sent, err.strerror or str(err))
        for _ in range(int(wait / POLL) + 2):
            if _unacked(sock) == 0:
                acked = True
                return Outcome("passed", sent, rtt=time.monotonic() - started)
            if time.monotonic() - started >= wait:
                break
            await asyncio.sleep(POLL)
        return Outcome("lost", sent, f"a {sent}-byte segment was not acknowledged within "
                       f"{wait:g}s")
    finally:
        if not acked:  # a reset: no orphan left retransmitting
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            with contextlib.suppress(OSError):
                sock.send(b"\xe0\x00")  # DISCONNECT: the will is discarded
        sock.close()


__all__ = ["Outcome", "connect_packet", "device_mtu", "header", "probe"]
