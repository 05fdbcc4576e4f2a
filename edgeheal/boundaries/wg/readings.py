"""What a WireGuard reader returns, the errors it raises, and the protocol's facts.

The readers sit at a boundary (a unix socket, generic netlink); everything above them sees
only these frozen values. There is deliberately no field for a private or preshared key:
the parsers drop those lines/attributes as they read, so no later log line, status page,
metric or exception can carry one.

``last_handshake`` is the *wall-clock* time the device reports (seconds since the epoch)
or ``None`` for "never" (the protocol encodes never as 0; it is not 1970). Because it is
wall-clock, the check does not compute ages from it directly; see
:mod:`edgeheal.boundaries.wg.health` for the monotonic bookkeeping.

The protocol constants, the endpoint text form and the public-key test are written here
once: the readers, the health model, the check, ``diagnose`` and the settings rules all
need them, and two copies of "180 s" or of "``[v6]:port``" drift apart.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from dataclasses import dataclass

KEY_LEN = 32
"""Bytes in a Curve25519 key (44 characters of base64)."""

# Protocol timers (wireguard-go device/constants.go, Linux drivers/net/wireguard/messages.h).
REKEY_AFTER_TIME = 120.0
"""Seconds after a handshake at which the initiator starts a new one on its next send."""
REJECT_AFTER_TIME = 180.0
"""Seconds after which a session is refused by both ends: the tunnel carries nothing."""
REKEY_TIMEOUT = 5.0
"""Seconds between retries of an unanswered handshake initiation."""
KEEPALIVE_TIMEOUT = 10.0
"""Passive keepalive: without persistent keepalive, a peer answers data within 10 s."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class WireGuardError(Exception):
    """Reading a WireGuard device failed. The message names the interface, never a key."""

    def __init__(self, ifname: str, problem: str) -> None:
        super().__init__(f"{ifname}: {problem}")
        self.ifname, self.problem = ifname, problem


class NoSuchDevice(WireGuardError):
    """The interface does not exist (or is not WireGuard, or its daemon is gone)."""


class PermissionDenied(WireGuardError):
    """The reader lacks the privilege (CAP_NET_ADMIN for netlink, root for the socket)."""


class ProtocolError(WireGuardError):
    """The device answered something we cannot parse (or an errno)."""


def fingerprint(public_key: str) -> str:
    """A short, stable, non-secret peer id for labels and logs: the first 8 base64 chars."""
    return public_key[:8]


def key_from_hex(value: str) -> str:
    """A 64-hex-digit key (UAPI) -> the 44-char base64 form ``wg`` and configs use."""
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise ValueError("expected 64 hex digits") from None
    if len(raw) != KEY_LEN:
        raise ValueError(f"expected {KEY_LEN} bytes, got {len(raw)}")
    return base64.b64encode(raw).decode("ascii")


def is_public_key(value: str) -> bool:
    """True for a base64 WireGuard key (32 bytes)."""
    try:
        return len(base64.b64decode(value, validate=True)) == KEY_LEN
    except (binascii.Error, ValueError):
        return False


# --- endpoints: "host:port", "[v6]:port" -------------------------------------------------

def format_endpoint(host: str, port: int) -> str:
    """``ip:port``, with an IPv6 address in brackets (as ``wg`` and the UAPI write it)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def endpoint_host(endpoint: str) -> str:
    """The host part of an endpoint, brackets removed (``[fe80::1%eth0]:51820`` ->
    ``fe80::1%eth0``)."""
    return endpoint.rsplit(":", 1)[0].strip("[]")


def endpoint_address(endpoint: str | None) -> IPAddress | None:
    """The endpoint's IP address (zone index dropped); None if absent or not an address."""
    if not endpoint:
        return None
    try:
        return ipaddress.ip_address(endpoint_host(endpoint).split("%")[0])
    except ValueError:
        return None


def normalize_endpoint(endpoint: str) -> str:
    """One spelling per endpoint (compressed IPv6, brackets), so the device's view and the
    wire's can be compared; text that is not ``address:port`` is returned unchanged."""
    host, _, port = endpoint.rpartition(":")
    try:
        host = str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return endpoint
    return format_endpoint(host, int(port)) if port.isdigit() else endpoint


@dataclass(frozen=True, slots=True)
class PeerStats:
    """One peer as the device reports it at one moment."""

    public_key: str
    """Base64, as in ``wg`` output and configuration files (public, not a secret)."""
    endpoint: str | None
    """``host:port`` / ``[v6]:port`` the device currently sends to; None if unknown."""
    allowed_ips: tuple[str, ...]
    last_handshake: float | None
    """Wall-clock seconds since the epoch of the latest handshake; None = never."""
    rx_bytes: int
    tx_bytes: int
    persistent_keepalive: int
    """Seconds; 0 = off."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)


@dataclass(frozen=True, slots=True)
class DeviceStats:
    """One WireGuard interface and all its peers."""

    interface: str
    listen_port: int
    peers: tuple[PeerStats, ...]
    reader: str = ""
    """Which reader produced this (``uapi`` or ``netlink``), for ``detail``."""
