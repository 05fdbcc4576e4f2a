"""The evidence: what diagnose gathers on the node, and the gathering.

:func:`gather` reads, in one pass and in this order:

1. the tunnel devices' listen port(s) and peers (:mod:`edgeheal.boundaries.wg`), before and after;
2. the uplink (``--interface``, else the ``[offload] interfaces`` match, else the interface
   of the route to the peers' endpoints over rtnetlink; pyroute2 only then) and whether its
   link is up;
3. its TX checksum offload (:mod:`edgeheal.boundaries.kernel.ethtool`, the configured features);
4. the kernel's UDP ``InCsumErrors`` / ``InErrors`` (``/proc/net/snmp``) before and after;
5. the capture (:mod:`edgeheal.tools.diagnose.capture`) in between.

:func:`build_evidence` then joins the capture with the devices' peers by endpoint into one
frozen :class:`CaptureEvidence`, pure, so the join is tested without a capture. Whether a peer's
handshake completed during the capture is the shared health model's answer
(:func:`edgeheal.boundaries.wg.health.new_handshake`), the same the ``wireguard`` check uses.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from edgeheal.base.ifglob import matching
from edgeheal.boundaries.wg import DeviceStats, NoSuchDevice, PeerStats, WireGuardError, read_device
from edgeheal.boundaries.wg.health import new_handshake
from edgeheal.boundaries.wg.readings import (
    REKEY_TIMEOUT,
    endpoint_host,
    fingerprint,
    normalize_endpoint,
)
from edgeheal.tools.diagnose.capture import capture, require_capture
from edgeheal.tools.diagnose.errors import DiagnoseError, EnvironmentProblem
from edgeheal.tools.diagnose.wire import Direction, Tally

log = logging.getLogger("edgeheal.diagnose.evidence")  # the name operators grep for

DEFAULT_MIN_SECONDS = 2 * REKEY_TIMEOUT
"""Two REKEY_TIMEOUTs: an unanswered handshake is retried every 5 s."""
MAX_SECONDS = 600.0


# --- the kernel's UDP counters ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class UdpCounters:
    in_csum_errors: int
    in_errors: int

    def to_json(self) -> dict[str, int]:
        return {"InCsumErrors": self.in_csum_errors, "InErrors": self.in_errors}


def parse_snmp(text: str) -> UdpCounters:
    """``/proc/net/snmp`` -> the ``Udp:`` InCsumErrors and InErrors (ValueError if absent)."""
    rows = [line.split() for line in text.splitlines() if line.startswith("Udp:")]
    if len(rows) < 2:
        raise ValueError("no Udp: lines in /proc/net/snmp")
    names, values = rows[0], rows[1]
    try:
        return UdpCounters(int(values[names.index("InCsumErrors")]),
                           int(values[names.index("InErrors")]))
    except (ValueError, IndexError) as err:
        raise ValueError(f"unexpected Udp: lines in /proc/net/snmp: {err}") from None


def read_udp_counters(path: str = "/proc/net/snmp") -> UdpCounters | None:
    try:
        with open(path, encoding="ascii") as f:
            return parse_snmp(f.read())
    except (OSError, ValueError) as err:
        log.warning("cannot read UDP counters: %s", err)
        return None


# --- the evidence (pure values) -----------------------------------------------------------

def _frozen(data: Mapping[str, int] | None) -> Mapping[str, int]:
    return MappingProxyType(dict(data or {}))


@dataclass(frozen=True, slots=True)
class PeerEvidence:
    """One peer endpoint: what we sent it, what it sent us, and the device's view."""

    endpoint: str
    """``ip:port`` on the wire (or the device's endpoint for a peer that was silent)."""
    public_key: str | None = None
    """The device's peer with this endpoint (public, not a secret); None: not matched."""
    interface: str | None = None
    sent: Mapping[str, int] = field(default_factory=dict)
    """Message type value -> count."""
    received: Mapping[str, int] = field(default_factory=dict)
    handshake_before: float | None = None
    """Wall-clock last handshake reported before the capture; None = never/unknown."""
    handshake_after: float | None = None
    rx_bytes_delta: int | None = None
    tx_bytes_delta: int | None = None
    persistent_keepalive: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "sent", _frozen(self.sent))
        object.__setattr__(self, "received", _frozen(self.received))

    @property
    def advanced(self) -> bool | None:
        """Did a handshake complete during the capture? None: the device was not read."""
        if self.public_key is None:
            return None
        return new_handshake(self.handshake_before, self.handshake_after)

    def handshake_age(self, now: float) -> float | None:
        return None if self.handshake_after is None else max(0.0, now - self.handshake_after)

    @property
    def name(self) -> str:
        peer = f"peer {fingerprint(self.public_key)}" if self.public_key else "unknown peer"
        return f"{peer} ({self.endpoint})"


@dataclass(frozen=True, slots=True)
class CaptureEvidence:
    uplink: str
    seconds: float
    ports: tuple[int, ...]
    interfaces: tuple[str, ...]
    """The WireGuard interfaces found (configured and present)."""
    missing_interfaces: tuple[str, ...] = ()
    offload: Mapping[str, bool] | None = None
    """Uplink TX checksum feature -> on; None: could not be read."""
    uplink_down: str | None = None
    """``down`` / ``no carrier`` / ``went down during the capture``; None: up."""
    udp_before: UdpCounters | None = None
    udp_after: UdpCounters | None = None
    peers: tuple[PeerEvidence, ...] = ()
    packets: int = 0
    now: float = 0.0
    """Wall-clock time at the end of the capture (for handshake ages only)."""
    notes: tuple[str, ...] = ()

    @property
    def offload_on(self) -> bool | None:
        return None if self.offload is None else any(self.offload.values())

    @property
    def csum_errors(self) -> int | None:
        if self.udp_before is None or self.udp_after is None:
            return None
        return self.udp_after.in_csum_errors - self.udp_before.in_csum_errors

    @property
    def in_errors(self) -> int | None:
        if self.udp_before is None or self.udp_after is None:
            return None
        return self.udp_after.in_errors - self.udp_before.in_errors


# --- gathering ----------------------------------------------------------------------------

def link_down(ifname: str) -> str | None:
    """``"down"`` / ``"no carrier"`` when the link is not up and running, else None."""
    import fcntl

    siocgifflags, iff_up, iff_running = 0x8913, 0x1, 0x40
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), siocgifflags,
                                 struct.pack("16sH22x", ifname.encode()[:15], 0))
        except OSError:
            return None
    (flags,) = struct.unpack_from("H", answer, 16)
    if not flags & iff_up:
        return "down"
    return None if flags & iff_running else "no carrier"


async def read_devices(names: Iterable[str]) -> tuple[list[DeviceStats], list[str]]:
    """Read each configured WireGuard interface; absent ones are listed, not errors."""
    found, missing = [], []
    for name in names:
        try:
            found.append(await read_device(name))
        except NoSuchDevice:
            missing.append(name)
        except WireGuardError as err:
            raise EnvironmentProblem(f"cannot read WireGuard interface {err}") from err
    return found, missing


def present_interfaces() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


async def route_interface(addresses: Iterable[str]) -> str | None:
    """The interface of the route to the first of ``addresses`` that has one (rtnetlink)."""
    from edgeheal.boundaries.kernel import pyroute2_light as _pyroute2

    _pyroute2.light()
    from pyroute2.iproute.linux import AsyncIPRoute  # heavy, lazy

    ipr = AsyncIPRoute()
    try:
        for address in addresses:
            try:
                msgs = await ipr.route("get", dst=address)
                if hasattr(msgs, "__aiter__"):
                    msgs = [m async for m in msgs]
            except Exception as err:  # netlink says "unreachable" in many ways
                log.debug("no route to %s: %s", address, err)
                continue
            for msg in msgs:
                oif = msg.get_attr("RTA_OIF")
                if oif:
                    return socket.if_indextoname(int(oif))
    finally:
        ipr.close()
    return None


def choose_uplink(patterns: Sequence[str], present: Sequence[str], routed: str | None,
                  ) -> str | None:
    """The uplink: an ``[offload] interfaces`` match (the routed one if several), else the
    interface of the route to the peers' endpoints. Pure."""
    matches = sorted(matching(present, patterns))
    if routed in matches or (not matches and routed):
        return routed
    return matches[0] if matches else None


def default_seconds(devices: Iterable[DeviceStats]) -> float:
    """Long enough to see a keepalive from every peer (longest keepalive + 5 s), >= 10 s."""
    longest = max((p.persistent_keepalive for d in devices for p in d.peers), default=0)
    return min(MAX_SECONDS, max(DEFAULT_MIN_SECONDS, float(longest) + 5.0))


def read_offload(uplink: str, features: Sequence[str]) -> tuple[dict[str, bool] | None, str]:
    from edgeheal.boundaries.kernel.ethtool import Ethtool, EthtoolError

    try:
        with Ethtool() as source:
            present = source.features(uplink)
    except EthtoolError as err:
        return None, f"cannot read the uplink's offload state: {err}"
    return {name: present[name].on for name in features if name in present}, ""


def build_evidence(*, uplink: str, seconds: float, before: Sequence[DeviceStats],
                   after: Sequence[DeviceStats], missing: Sequence[str], tally: Tally,
                   offload: Mapping[str, bool] | None, udp_before: UdpCounters | None,
                   udp_after: UdpCounters | None, now: float, notes: Sequence[str] = (),
                   uplink_down: str | None = None) -> CaptureEvidence:
    """Join the capture with the devices' peers by endpoint. Pure."""
    peers_before = {(d.interface, p.public_key): p for d in before for p in d.peers}
    by_endpoint: dict[str, tuple[str, PeerStats]] = {}
    for device in after:
        for peer in device.peers:
            if peer.endpoint:
                by_endpoint[normalize_endpoint(peer.endpoint)] = (device.interface, peer)
    out: list[PeerEvidence] = []
    seen: set[str] = set()
    for endpoint in tally.endpoints():
        match = by_endpoint.get(normalize_endpoint(endpoint))
        out.append(_peer_evidence(endpoint, match, peers_before, tally))
        seen.add(normalize_endpoint(endpoint))
    for endpoint, match in sorted(by_endpoint.items()):
        if endpoint not in seen:
            out.append(_peer_evidence(endpoint, match, peers_before, tally))
    ports = tuple(sorted({d.listen_port for d in after or before if d.listen_port}))
    return CaptureEvidence(uplink=uplink, seconds=seconds, ports=ports,
                    interfaces=tuple(d.interface for d in before),
                    missing_interfaces=tuple(missing), offload=offload,
                    uplink_down=uplink_down or (
                        "went down during the capture" if tally.link_down else None),
                    udp_before=udp_before, udp_after=udp_after, peers=tuple(out),
                    packets=tally.packets, now=now, notes=tuple(notes))


def _peer_evidence(endpoint: str, match: tuple[str, PeerStats] | None,
                   before: Mapping[tuple[str, str], PeerStats], tally: Tally) -> PeerEvidence:
    sent, received = tally.of(endpoint, Direction.SENT), tally.of(endpoint, Direction.RECEIVED)
    if match is None:
        return PeerEvidence(endpoint=endpoint, sent=sent, received=received)
    ifname, peer = match
    prev = before.get((ifname, peer.public_key))
    return PeerEvidence(
        endpoint=endpoint, public_key=peer.public_key, interface=ifname, sent=sent,
        received=received,
        handshake_before=prev.last_handshake if prev is not None else None,
        handshake_after=peer.last_handshake,
        rx_bytes_delta=peer.rx_bytes - prev.rx_bytes if prev is not None else None,
        tx_bytes_delta=peer.tx_bytes - prev.tx_bytes if prev is not None else None,
        persistent_keepalive=peer.persistent_keepalive)


async def gather(config: Any, *, interface: str | None = None, seconds: float | None = None,
                 capture_fn: Callable[..., Tally] | None = None) -> CaptureEvidence:
    """Gather the evidence: devices, uplink, offload, counters, and the capture (blocking,
    in a worker thread) between two readings of the devices."""
    if seconds is not None and not 0 < seconds <= MAX_SECONDS:
        raise DiagnoseError(f"--seconds must be between 0 and {MAX_SECONDS:g}")
    require_capture()
    devices, missing = await read_devices(config.wireguard.interfaces)
    endpoints = [p.endpoint for d in devices for p in d.peers if p.endpoint]
    if interface is not None:
        if interface not in present_interfaces():
            raise DiagnoseError(f"--interface {interface}: no such interface")
        uplink = interface
    else:
        hosts = [endpoint_host(e) for e in endpoints]
        routed = await route_interface(hosts) if hosts else None
        chosen = choose_uplink(config.offload.interfaces, present_interfaces(), routed)
        if chosen is None:
            raise DiagnoseError("cannot tell which interface is the uplink (no [offload] "
                                "interfaces match and no peer endpoint is routed); pass "
                                "--interface")
        uplink = chosen
    span = seconds if seconds is not None else default_seconds(devices)
    offload, problem = await asyncio.to_thread(read_offload, uplink, config.offload.features)
    notes = [problem] if problem else []
    if missing:
        notes.append("not present: " + ", ".join(missing))
    ports = sorted({d.listen_port for d in devices if d.listen_port})
    if not devices or not ports:
        return CaptureEvidence(uplink=uplink, seconds=0.0, ports=(), interfaces=(),
                        missing_interfaces=tuple(missing), offload=offload,
                        uplink_down=link_down(uplink), now=time.time(), notes=tuple(notes))
    down_before = link_down(uplink)
    udp_before = read_udp_counters()
    log.info("capturing %g s of UDP port(s) %s on %s", span, ports, uplink)
    tally = await asyncio.to_thread(capture_fn or capture, uplink, ports, span)
    udp_after = read_udp_counters()
    after, _ = await read_devices(d.interface for d in devices)
    return build_evidence(uplink=uplink, seconds=span, before=devices, after=after,
                          missing=missing, tally=tally, offload=offload,
                          udp_before=udp_before, udp_after=udp_after, now=time.time(),
                          notes=notes, uplink_down=down_before or link_down(uplink))


__all__ = ["DEFAULT_MIN_SECONDS", "MAX_SECONDS", "CaptureEvidence", "PeerEvidence", "UdpCounters",
           "build_evidence", "choose_uplink", "default_seconds", "gather", "link_down",
           "parse_snmp", "read_devices", "read_udp_counters"]
