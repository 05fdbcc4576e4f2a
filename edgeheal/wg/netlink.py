"""Reader for the kernel's WireGuard generic netlink family (``wireguard``), via pyroute2.

``WG_CMD_GET_DEVICE`` with ``NLM_F_DUMP`` answers one or more messages per device: each
repeats the interface attributes and carries a slice of the peers; when a peer's allowed
IPs do not fit, the same peer continues at the start of the next message (the kernel's
``wg_get_device_dump``), so consecutive blocks with one public key are merged here.

The answer includes ``WGDEVICE_A_PRIVATE_KEY`` and each peer's ``WGPEER_A_PRESHARED_KEY``.
:func:`parse_messages` never reads those attributes; the decoded pyroute2 messages that hold
them are dropped as soon as the device is parsed and are never logged.

pyroute2 is imported only here, and only when :func:`read` is called: a host whose devices
are all userspace (UAPI socket) never loads it. The kernel module is not available on the
machines this project is developed and tested on, so this reader is tested against
recorded (byte-exact, kernel-layout) generic netlink messages in
``tests/wireguard/test_netlink.py``.

Errors: the family missing (no kernel module), no such interface or not a WireGuard one ->
:class:`NoSuchDevice`; EPERM/EACCES (no CAP_NET_ADMIN) -> :class:`PermissionDenied`;
anything else -> :class:`ProtocolError`.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from edgeheal import _pyroute2
from edgeheal.wg.model import (
    DeviceStats,
    NoSuchDevice,
    PeerStats,
    PermissionDenied,
    ProtocolError,
    WireGuardError,
    format_endpoint,
)

log = logging.getLogger(__name__)


async def read(ifname: str, *, answer_within: float = 2.0) -> DeviceStats:
    """Dump one device from the kernel."""
    _pyroute2.light()
    from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415 - heavy, lazy
    from pyroute2.netlink.generic.wireguard import AsyncWireGuard  # noqa: PLC0415

    sock = AsyncWireGuard()
    try:
        async with asyncio.timeout(answer_within):
            await sock.setup_endpoint()
            msgs = [m async for m in await sock.info(ifname)]
    except NetlinkError as err:
        raise _error(ifname, err.code, str(err)) from err
    except PermissionError as err:
        raise PermissionDenied(ifname, f"netlink: {err.strerror}") from err
    except TimeoutError:
        raise ProtocolError(ifname, f"netlink: no answer within {answer_within:g}s") from None
    except OSError as err:
        raise _error(ifname, err.errno or 0, err.strerror or str(err)) from err
    finally:
        sock.close()
    return parse_messages(ifname, msgs)


def _error(ifname: str, code: int, text: str) -> WireGuardError:
    if code in (errno.EPERM, errno.EACCES):
        return PermissionDenied(ifname, "netlink: operation not permitted (needs CAP_NET_ADMIN)")
    if code == errno.ENOENT:
        return NoSuchDevice(ifname, "netlink: no 'wireguard' generic netlink family "
                            "(kernel module not loaded) and no userspace API socket")
    if code == errno.ENODEV:
        return NoSuchDevice(ifname, "no such interface")
    if code == errno.EOPNOTSUPP:
        return NoSuchDevice(ifname, "not a WireGuard interface")
    return ProtocolError(ifname, f"netlink: {text} (errno {code})")


def decode(data: bytes) -> list[Any]:
    """Split a raw netlink byte stream (as read from the socket) into decoded ``wgmsg``."""
    import struct  # noqa: PLC0415

    _pyroute2.light()
    from pyroute2.netlink.generic.wireguard import wgmsg  # noqa: PLC0415

    out = []
    offset = 0
    while offset + 16 <= len(data):
        (length,) = struct.unpack_from("=I", data, offset)
        if length < 16 or offset + length > len(data):
            raise ValueError(f"bad netlink message length {length} at offset {offset}")
        msg = wgmsg(data[offset:offset + length])
        msg.decode()
        out.append(msg)
        offset += (length + 3) & ~3
    return out


def parse_messages(ifname: str, msgs: Iterable[Any]) -> DeviceStats:
    """Decoded ``wgmsg`` messages of one device dump -> :class:`DeviceStats`."""
    listen_port = 0
    merged: list[dict[str, Any]] = []
    for msg in msgs:
        error = msg.get("header", {}).get("error") if hasattr(msg, "get") else None
        if error is not None:
            raise _error(ifname, getattr(error, "code", 0), str(error))
        port = msg.get_attr("WGDEVICE_A_LISTEN_PORT")
        if port is not None:
            listen_port = int(port)
        for peer in msg.get_attr("WGDEVICE_A_PEERS") or ():
            block = _peer_block(ifname, peer)
            if merged and merged[-1]["public_key"] == block["public_key"]:
                merged[-1]["allowed_ips"].extend(block["allowed_ips"])  # continuation
            else:
                merged.append(block)
    peers = tuple(PeerStats(**{**b, "allowed_ips": tuple(b["allowed_ips"])}) for b in merged)
    return DeviceStats(interface=ifname, listen_port=listen_port, peers=peers,
                       reader="netlink")


def _peer_block(ifname: str, peer: Any) -> dict[str, Any]:
    key = peer.get_attr("WGPEER_A_PUBLIC_KEY")
    if key is None:
        raise ProtocolError(ifname, "netlink: peer without WGPEER_A_PUBLIC_KEY")
    public_key = key.decode("ascii") if isinstance(key, bytes) else _nested_value(key)
    hs = peer.get_attr("WGPEER_A_LAST_HANDSHAKE_TIME")
    last = None
    if hs is not None:
        sec, nsec = int(hs["tv_sec"]), int(hs["tv_nsec"])
        last = sec + nsec / 1e9 if (sec or nsec) else None
    return {
        "public_key": public_key,
        "endpoint": _endpoint(peer.get_attr("WGPEER_A_ENDPOINT")),
        "allowed_ips": [_allowed_ip(ifname, a)
                        for a in peer.get_attr("WGPEER_A_ALLOWEDIPS") or ()],
        "last_handshake": last,
        "rx_bytes": int(peer.get_attr("WGPEER_A_RX_BYTES") or 0),
        "tx_bytes": int(peer.get_attr("WGPEER_A_TX_BYTES") or 0),
        "persistent_keepalive": int(
            peer.get_attr("WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL") or 0),
    }


def _nested_value(key: Any) -> str:
    value = key["value"]
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def _endpoint(ep: Any) -> str | None:
    if ep is None:
        return None
    addr, port = ep["addr"], int(ep["port"])
    if addr in ("0.0.0.0", "::") and port == 0:  # noqa: S104 - "no endpoint", not a bind
        return None
    return format_endpoint(addr, port)


def _allowed_ip(ifname: str, attr: Any) -> str:
    text = attr.get("addr") if hasattr(attr, "get") else None
    if not text:
        raise ProtocolError(ifname, "netlink: allowed IP without family/address/mask")
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError as err:
        raise ProtocolError(ifname, f"netlink: bad allowed IP: {err}") from None


__all__: Sequence[str] = ("decode", "parse_messages", "read")
