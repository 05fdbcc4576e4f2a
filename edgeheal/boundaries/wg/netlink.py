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

Bytes handed to :func:`decode` (and :func:`parse_bytes`) are first walked by
:func:`check_structure`, which checks every attribute's length against its parent and the
minimum size of its type, because pyroute2's decoder loops forever or raises assorted
exceptions on some malformed attribute lengths. Numbers are bounded to their real widths
(ports u16, counters u64, handshake seconds s64, nanoseconds below 10^9).

One write: :func:`set_listen_port` sends ``WG_CMD_SET_DEVICE`` with only
``WGDEVICE_A_IFNAME`` and ``WGDEVICE_A_LISTEN_PORT`` (the kernel's ``wg_set_device``: a new
port re-opens the device's sockets, ``set_port`` -> ``wg_socket_init``, and clears every
peer's cached source address; peers, sessions and endpoints stay). The message is built by
:func:`listen_port_request`, tested byte for byte like the reader.

Errors: the family missing (no kernel module), no such interface or not a WireGuard one ->
:class:`NoSuchDevice`; EPERM/EACCES (no CAP_NET_ADMIN) -> :class:`PermissionDenied`;
anything else, including any malformed message -> :class:`ProtocolError`.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from edgeheal.base import compat
from edgeheal.boundaries.kernel import pyroute2_light as _pyroute2
from edgeheal.boundaries.wg.readings import (
    DeviceStats,
    NoSuchDevice,
    PeerStats,
    PermissionDenied,
    ProtocolError,
    WireGuardError,
    format_endpoint,
)

log = logging.getLogger("edgeheal.wg.netlink")  # the name operators grep for


async def read(ifname: str, *, answer_within: float = 2.0) -> DeviceStats:
    """Dump one device from the kernel."""
    _pyroute2.light()
    from pyroute2.netlink.exceptions import NetlinkError  # heavy, lazy
    from pyroute2.netlink.generic.wireguard import AsyncWireGuard

    sock = AsyncWireGuard()
    try:
        async with compat.timeout(answer_within):
            await sock.setup_endpoint()
            msgs = [m async for m in await sock.info(ifname)]
    except NetlinkError as err:
        raise _error(ifname, err.code, str(err)) from err
    except PermissionError as err:
        raise PermissionDenied(ifname, f"netlink: {err.strerror}") from err
    except compat.TimeoutErrors:
        raise ProtocolError(ifname, f"netlink: no answer within {answer_within:g}s") from None
    except OSError as err:
        raise _error(ifname, err.errno or 0, err.strerror or str(err)) from err
    finally:
        sock.close()
    return parse_messages(ifname, msgs)


def listen_port_request(ifname: str, port: int) -> Any:
    """The ``WG_CMD_SET_DEVICE`` message that moves ``ifname`` to ``port`` (not encoded:
    the socket fills in the family id and pid)."""
    if not 0 < port < 2**16:
        raise ValueError(f"listen port {port} out of range (1 to 65535)")
    _pyroute2.light()
    from pyroute2.netlink.generic.wireguard import WG_CMD_SET_DEVICE, WG_GENL_VERSION, wgmsg

    msg = wgmsg()
    msg["attrs"].append(["WGDEVICE_A_IFNAME", ifname])
    msg["attrs"].append(["WGDEVICE_A_LISTEN_PORT", port])
    msg["cmd"] = WG_CMD_SET_DEVICE
    msg["version"] = WG_GENL_VERSION
    return msg


async def set_listen_port(ifname: str, port: int, *, answer_within: float = 2.0) -> None:
    """Move the kernel device ``ifname`` to UDP ``port``; EADDRINUSE is a ProtocolError."""
    msg = listen_port_request(ifname, port)
    from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
    from pyroute2.netlink.exceptions import NetlinkError
    from pyroute2.netlink.generic.wireguard import AsyncWireGuard

    sock = AsyncWireGuard()
    try:
        async with compat.timeout(answer_within):
            await sock.setup_endpoint()
            msg["header"]["type"] = sock.prid
            msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
            msg["header"]["pid"] = sock.pid
            msg.encode()
            sock.sendto(msg.data, (0, 0))
            answers = [m async for m in sock.get()]
    except NetlinkError as err:
        raise _error(ifname, err.code, str(err)) from err
    except PermissionError as err:
        raise PermissionDenied(ifname, f"netlink: {err.strerror}") from err
    except compat.TimeoutErrors:
        raise ProtocolError(ifname, f"netlink: no answer within {answer_within:g}s") from None
    except OSError as err:
        raise _error(ifname, err.errno or 0, err.strerror or str(err)) from err
    finally:
        sock.close()
    for answer in answers:
        error = answer["header"].get("error")
        if error is not None:
            raise _error(ifname, getattr(error, "code", 0), str(error))


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


# Minimum payload sizes of the attributes pyroute2 decodes with fixed layouts, by nest.
_DEVICE_MIN = {1: 4, 3: 32, 4: 32, 5: 4, 6: 2, 7: 4}
_PEER_MIN = {1: 32, 2: 32, 3: 4, 4: 16, 5: 2, 6: 16, 7: 8, 8: 8, 10: 4}
_AIP_MIN = {1: 2, 3: 1}
WGDEVICE_A_PEERS, WGPEER_A_ALLOWEDIPS = 8, 9
MAX_DUMP = 16 * 1024 * 1024
"""Bytes :func:`decode` accepts (a dump of a few thousand peers is a few MB)."""


def _walk(data: bytes, start: int, end: int, level: str) -> None:
    """Check the attributes in ``data[start:end]``; ValueError on the first bad one."""
    import struct

    offset = start
    while offset + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, offset)
        kind &= 0x3FFF  # NLA_F_NESTED / NLA_F_NET_BYTEORDER
        if length < 4 or offset + length > end:
            raise ValueError(f"bad attribute length {length} at offset {offset} ({level})")
        body, stop = offset + 4, offset + length
        if level == "device" and kind == WGDEVICE_A_PEERS:
            _walk_list(data, body, stop, "peer")
        elif level == "peer" and kind == WGPEER_A_ALLOWEDIPS:
            _walk_list(data, body, stop, "allowed IP")
        else:
            minimum = {"device": _DEVICE_MIN, "peer": _PEER_MIN,
                       "allowed IP": _AIP_MIN}[level].get(kind, 0)
            if length - 4 < minimum:
                raise ValueError(f"{level} attribute {kind} has {length - 4} bytes, expected "
                                 f"at least {minimum}")
        offset += (length + 3) & ~3
    if offset < end and offset + 4 > end and any(data[offset:end]):
        raise ValueError(f"{end - offset} stray bytes at offset {offset} ({level})")


def _walk_list(data: bytes, start: int, end: int, level: str) -> None:
    import struct

    offset = start
    while offset + 4 <= end:
        (length,) = struct.unpack_from("=H", data, offset)
        if length < 4 or offset + length > end:
            raise ValueError(f"bad {level} nest length {length} at offset {offset}")
        _walk(data, offset + 4, offset + length, level)
        offset += (length + 3) & ~3


def check_structure(data: bytes) -> None:
    """Walk a raw netlink byte stream of ``WG_CMD_GET_DEVICE`` answers; ValueError naming
    the first malformed header or attribute (lengths, minimum sizes), before pyroute2."""
    import struct

    if len(data) > MAX_DUMP:
        raise ValueError(f"dump of {len(data)} bytes, more than {MAX_DUMP}")
    offset = 0
    while offset + 16 <= len(data):
        (length,) = struct.unpack_from("=I", data, offset)
        if length < 20 or offset + length > len(data):
            raise ValueError(f"bad netlink message length {length} at offset {offset}")
        _walk(data, offset + 20, offset + length, "device")
        offset += (length + 3) & ~3
    if offset < len(data):
        raise ValueError(f"{len(data) - offset} trailing bytes after the last message")


def decode(data: bytes) -> list[Any]:
    """Split a raw netlink byte stream (as read from the socket) into decoded ``wgmsg``;
    ValueError (naming what is wrong, never a value) for anything malformed."""
    import struct

    check_structure(data)
    _pyroute2.light()
    from pyroute2.netlink.generic.wireguard import wgmsg

    out = []
    offset = 0
    while offset + 16 <= len(data):
        (length,) = struct.unpack_from("=I", data, offset)
        msg = wgmsg(data[offset:offset + length])
        try:
            msg.decode()
        except Exception as err:  # pyroute2 raises many kinds on odd contents
            raise ValueError(f"undecodable netlink message at offset {offset} "
                             f"({type(err).__name__})") from None
        out.append(msg)
        offset += (length + 3) & ~3
    return out


def parse_bytes(ifname: str, data: bytes) -> DeviceStats:
    """A raw dump (bytes) -> :class:`DeviceStats`; :class:`ProtocolError` if malformed."""
    try:
        msgs = decode(data)
    except ValueError as err:
        raise ProtocolError(ifname, f"netlink: {err}") from None
    return parse_messages(ifname, msgs)


def parse_messages(ifname: str, msgs: Iterable[Any]) -> DeviceStats:
    """Decoded ``wgmsg`` messages of one device dump -> :class:`DeviceStats`."""
    try:
        return _parse_messages(ifname, msgs)
    except WireGuardError:
        raise
    except Exception as err:  # odd attribute contents pyroute2 decoded into odd types
        raise ProtocolError(ifname, f"netlink: malformed device dump "
                            f"({type(err).__name__})") from None


def _bounded(value: Any, top: int, what: str, ifname: str) -> int:
    number = int(value or 0)
    if not 0 <= number <= top:
        raise ProtocolError(ifname, f"netlink: {what} out of range (0 to {top})")
    return number


def _parse_messages(ifname: str, msgs: Iterable[Any]) -> DeviceStats:
    listen_port = 0
    merged: list[dict[str, Any]] = []
    for msg in msgs:
        error = msg.get("header", {}).get("error") if hasattr(msg, "get") else None
        if error is not None:
            raise _error(ifname, getattr(error, "code", 0), str(error))
        port = msg.get_attr("WGDEVICE_A_LISTEN_PORT")
        if port is not None:
            listen_port = _bounded(port, 2**16 - 1, "listen port", ifname)
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
        sec = _bounded(hs["tv_sec"], 2**63 - 1, "handshake seconds", ifname)
        nsec = _bounded(hs["tv_nsec"], 999_999_999, "handshake nanoseconds", ifname)
        last = sec + nsec / 1e9 if (sec or nsec) else None
    return {
        "public_key": public_key,
        "endpoint": _endpoint(peer.get_attr("WGPEER_A_ENDPOINT")),
        "allowed_ips": [_allowed_ip(ifname, a)
                        for a in peer.get_attr("WGPEER_A_ALLOWEDIPS") or ()],
        "last_handshake": last,
        "rx_bytes": _bounded(peer.get_attr("WGPEER_A_RX_BYTES"), 2**64 - 1, "rx bytes", ifname),
        "tx_bytes": _bounded(peer.get_attr("WGPEER_A_TX_BYTES"), 2**64 - 1, "tx bytes", ifname),
        "persistent_keepalive": _bounded(
            peer.get_attr("WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL"), 2**16 - 1,
            "keepalive", ifname),
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


__all__: Sequence[str] = ("check_structure", "decode", "listen_port_request", "parse_bytes",
                          "parse_messages", "read", "set_listen_port")
