"""Reader for the cross-platform WireGuard userspace API (wireguard-go, boringtun).

A userspace implementation serves ``/var/run/wireguard/<ifname>.sock``. The ``get``
operation is one request, ``get=1\\n\\n``, answered by ``key=value`` lines: interface keys
first, then one block per peer opened by ``public_key=``, and ``errno=N`` and an empty line
at the end (https://www.wireguard.com/xplatform/). Keys are 64 hex digits; we convert
public keys to the base64 form operators know from ``wg`` and configs.

The answer starts with the device's ``private_key`` and carries each peer's
``preshared_key``. Those lines are skipped by name before anything else looks at them: they
are never stored, compared, logged or quoted in an error. Parse errors name the key (one we
know) and the line number only, never a value or an unknown line: a line that is not
``key=value`` may be a secret split by a broken daemon.

Numbers are decimal ASCII digits within their real width (``rx_bytes`` is a u64,
``listen_port`` a u16, ...; :data:`BOUNDS`): a 400-digit counter is a parse error, not a
number that later breaks ``/metrics``. Endpoints and allowed IPs must be addresses.

Errors: a missing socket or a dead daemon (connection refused) is :class:`NoSuchDevice`; a
socket we may not open is :class:`PermissionDenied`; a malformed answer, a non-zero errno
or no answer within ``answer_within`` seconds is :class:`ProtocolError`.

One write: :func:`set_listen_port`, the ``set`` operation with the one interface key
``listen_port`` (``set=1\\nlisten_port=N\\n\\n``, answered by ``errno=N``). wireguard-go
rebinds its sockets to the new port (``device.BindUpdate``) and keeps every peer, session
and endpoint: the next packet to a peer leaves from the new port.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
from dataclasses import dataclass, field
from pathlib import Path

from edgeheal.base import compat
from edgeheal.boundaries.wg.readings import (
    DeviceStats,
    NoSuchDevice,
    PeerStats,
    PermissionDenied,
    ProtocolError,
    key_from_hex,
)

log = logging.getLogger("edgeheal.wg.uapi")  # the name operators grep for

SECRET_KEYS = frozenset({"private_key", "preshared_key"})
MAX_ANSWER = 4 * 1024 * 1024
"""Bytes we accept in one answer (a few thousand peers); more means a broken daemon."""


async def read(ifname: str, *, uapi_dir: Path, answer_within: float = 2.0) -> DeviceStats:
    """Ask the daemon behind ``uapi_dir/<ifname>.sock`` for its device and peers."""
    path = uapi_dir / f"{ifname}.sock"
    try:
        async with compat.timeout(answer_within):
            answer = await _exchange(path)
    except FileNotFoundError:
        raise NoSuchDevice(ifname, f"no userspace API socket at {path}") from None
    except ConnectionRefusedError:
        raise NoSuchDevice(ifname, f"nothing listens on {path} (daemon gone)") from None
    except PermissionError as err:
        raise PermissionDenied(ifname, f"cannot open {path}: {err.strerror}") from err
    except compat.TimeoutErrors:
        raise ProtocolError(
            ifname, f"no complete answer on {path} within {answer_within:g}s") from None
    except OSError as err:
        raise ProtocolError(ifname, f"{path}: {err.strerror or err}") from err
    return parse(ifname, answer)


async def set_listen_port(ifname: str, port: int, *, uapi_dir: Path,
                          answer_within: float = 2.0) -> None:
    """Move the device behind ``uapi_dir/<ifname>.sock`` to UDP ``port`` (1-65535)."""
    if not 0 < port <= U16:
        raise ValueError(f"listen port {port} out of range (1 to {U16})")
    path = uapi_dir / f"{ifname}.sock"
    try:
        async with compat.timeout(answer_within):
            answer = await _exchange(path, f"set=1\nlisten_port={port}\n\n".encode())
    except FileNotFoundError:
        raise NoSuchDevice(ifname, f"no userspace API socket at {path}") from None
    except ConnectionRefusedError:
        raise NoSuchDevice(ifname, f"nothing listens on {path} (daemon gone)") from None
    except PermissionError as err:
        raise PermissionDenied(ifname, f"cannot open {path}: {err.strerror}") from err
    except compat.TimeoutErrors:
        raise ProtocolError(
            ifname, f"no answer to set on {path} within {answer_within:g}s") from None
    except OSError as err:
        raise ProtocolError(ifname, f"{path}: {err.strerror or err}") from err
    code = _errno_of(answer)
    if code is None:
        raise ProtocolError(ifname, f"set answered without errno= ({len(answer)} bytes)")
    if code != 0:
        why = " (port in use)" if abs(code) == errno.EADDRINUSE else ""
        raise ProtocolError(ifname, f"set listen_port={port} answered errno={code}{why}")


def _errno_of(answer: str) -> int | None:
    """The answer's ``errno``: wireguard-go writes a failed set as a negative one
    (``errno=-98``, EADDRINUSE)."""
    for line in answer.split("\n"):
        key, _, value = line.partition("=")
        if key == "errno":
            digits = value[1:] if value.startswith("-") else value
            if not digits or len(digits) > 10 or not (digits.isascii() and digits.isdigit()):
                return None
            return int(value)
    return None


async def _exchange(path: Path, request: bytes = b"get=1\n\n") -> str:
    reader, writer = await asyncio.open_unix_connection(path, limit=MAX_ANSWER)
    try:
        writer.write(request)
        await writer.drain()
        # The answer ends with an empty line; the daemon keeps the connection open.
        data = await reader.readuntil(b"\n\n")
    except asyncio.IncompleteReadError as err:
        data = err.partial
    except asyncio.LimitOverrunError as err:
        raise OSError(f"answer longer than {MAX_ANSWER} bytes") from err
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            log.debug("closing %s failed", path)
    return data.decode("utf-8", errors="replace")


@dataclass
class _Peer:
    """A peer block while it is being read (mutable; turned into PeerStats at its end)."""

    public_key: str
    endpoint: str | None = None
    hs_sec: int = 0
    hs_nsec: int = 0
    rx_bytes: int = 0
    tx_bytes: int = 0
    keepalive: int = 0
    allowed_ips: list[str] = field(default_factory=list)

    def stats(self) -> PeerStats:
        never = self.hs_sec == 0 and self.hs_nsec == 0
        return PeerStats(
            public_key=self.public_key, endpoint=self.endpoint,
            allowed_ips=tuple(self.allowed_ips),
            last_handshake=None if never else self.hs_sec + self.hs_nsec / 1e9,
            rx_bytes=self.rx_bytes, tx_bytes=self.tx_bytes,
            persistent_keepalive=self.keepalive)


U16, U32, U64, I64 = 2**16 - 1, 2**32 - 1, 2**64 - 1, 2**63 - 1
BOUNDS = {"listen_port": U16, "fwmark": U32, "errno": U32, "last_handshake_time_sec": I64,
          "last_handshake_time_nsec": 999_999_999, "rx_bytes": U64, "tx_bytes": U64,
          "persistent_keepalive_interval": U16, "protocol_version": U32}
"""The largest value of each numeric key (the widths wireguard-go and the kernel use)."""


class _Bad(ValueError):
    """A reason that quotes no value (safe to show)."""


def _number(key: str, value: str) -> int:
    if not value or len(value) > 20 or not (value.isascii() and value.isdigit()):
        raise _Bad("expected a decimal number")
    number = int(value)
    if number > BOUNDS[key]:
        raise _Bad(f"out of range (at most {BOUNDS[key]})")
    return number


def _endpoint(value: str) -> str:
    host, sep, port = value.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or len(bare) > 64 or not port.isascii() or not port.isdigit() \
            or len(port) > 5 or int(port) > U16:
        raise _Bad("expected address:port")
    try:
        ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        raise _Bad("expected address:port") from None
    return value


def _allowed_ip(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise _Bad("expected address/prefix") from None


_INT_FIELDS = {
    "last_handshake_time_sec": "hs_sec",
    "last_handshake_time_nsec": "hs_nsec",
    "rx_bytes": "rx_bytes",
    "tx_bytes": "tx_bytes",
    "persistent_keepalive_interval": "keepalive",
}


def parse(ifname: str, text: str) -> DeviceStats:
    """Parse a ``get=1`` answer. Secret lines are dropped before their value is read."""
    listen_port = 0
    peers: list[PeerStats] = []
    peer: _Peer | None = None
    errno: int | None = None
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line:
            continue
        key, sep, value = line.partition("=")
        if key in SECRET_KEYS:
            continue  # never look at the value
        if not sep:
            raise ProtocolError(ifname, f"line {lineno}: expected key=value")
        try:
            if key == "public_key":
                if peer is not None:
                    peers.append(peer.stats())
                peer = _Peer(key_from_hex(value))
            elif key == "errno":
                errno = _number(key, value)
            elif peer is None:
                if key == "listen_port":
                    listen_port = _number(key, value)
                # fwmark and future interface keys are not needed
            elif key in _INT_FIELDS:
                setattr(peer, _INT_FIELDS[key], _number(key, value))
            elif key == "endpoint":
                peer.endpoint = _endpoint(value) if value else None
            elif key == "allowed_ip":
                peer.allowed_ips.append(_allowed_ip(value))
            # protocol_version and unknown keys: ignored (forward compatible)
        except _Bad as err:
            raise ProtocolError(ifname, f"line {lineno}: bad value for {key}: {err}") from None
        except ValueError:  # its text may quote the value: never pass it on
            raise ProtocolError(ifname, f"line {lineno}: bad value for {key}") from None
    if peer is not None:
        peers.append(peer.stats())
    if errno is None:
        raise ProtocolError(ifname, "answer ended without errno= (truncated?)")
    if errno != 0:
        raise ProtocolError(ifname, f"device answered errno={errno}")
    return DeviceStats(interface=ifname, listen_port=listen_port, peers=tuple(peers),
                       reader="uapi")
