"""What the capture saw, classified: WireGuard message types by size, counted per peer.

Pure: a function of a UDP payload and the addresses around it, tested on real recorded
packets (``tests/diagnose/fixtures``). WireGuard messages are recognised by the first payload
byte and the exact size (type 1 initiation 148 bytes, 2 response 92, 3 cookie reply 64, 4
transport >= 32 in 16-byte steps; a keepalive is transport with an empty payload, 32 bytes),
so nothing is decrypted and no key is needed. Direction comes from the addresses (ours vs.
the peer's), not from the ports: Flannel peers all use 51820 on both ends.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from edgeheal.boundaries.wg.readings import format_endpoint


class MessageType(enum.Enum):
    INITIATION = "initiation"
    RESPONSE = "response"
    COOKIE_REPLY = "cookie_reply"
    TRANSPORT = "transport"
    KEEPALIVE = "keepalive"
    OTHER = "other"
    """On the tunnel's port, but not a well-formed WireGuard message."""


_FIXED_SIZE = {1: (MessageType.INITIATION, 148), 2: (MessageType.RESPONSE, 92),
               3: (MessageType.COOKIE_REPLY, 64)}
TRANSPORT_HEADER = 16
AEAD_TAG = 16
KEEPALIVE_SIZE = TRANSPORT_HEADER + AEAD_TAG


def classify(payload: bytes) -> MessageType:
    """One UDP payload -> its WireGuard message type (by type byte and exact size).

    The three reserved bytes after the type are zero in every valid message; a transport
    message is a 16-byte header plus the encrypted, 16-byte-padded packet plus a 16-byte tag.
    """
    if len(payload) < 4 or payload[1:4] != b"\0\0\0":
        return MessageType.OTHER
    kind = payload[0]
    if kind in _FIXED_SIZE:
        mtype, size = _FIXED_SIZE[kind]
        return mtype if len(payload) == size else MessageType.OTHER
    if kind == 4:
        if len(payload) == KEEPALIVE_SIZE:
            return MessageType.KEEPALIVE
        if len(payload) > KEEPALIVE_SIZE and (len(payload) - KEEPALIVE_SIZE) % 16 == 0:
            return MessageType.TRANSPORT
    return MessageType.OTHER


class Direction(enum.Enum):
    SENT = "sent"
    RECEIVED = "received"


def direction(src: str, sport: int, dst: str, dport: int, *, local: frozenset[str],
              ports: frozenset[int]) -> Direction:
    """Which way a datagram went: by our addresses first, then by our listen ports."""
    if src in local and dst not in local:
        return Direction.SENT
    if dst in local and src not in local:
        return Direction.RECEIVED
    return Direction.SENT if sport in ports and dport not in ports else Direction.RECEIVED


@dataclass
class Tally:
    """What the capture saw: counts per (peer endpoint, direction, message type)."""

    counts: Counter[tuple[str, Direction, MessageType]] = field(default_factory=Counter)
    packets: int = 0
    link_down: int = 0
    """How often the capture socket reported the link going down (ENETDOWN)."""

    def add(self, src: str, sport: int, dst: str, dport: int, payload: bytes, *,
            local: frozenset[str], ports: frozenset[int]) -> None:
        way = direction(src, sport, dst, dport, local=local, ports=ports)
        remote = format_endpoint(dst, dport) if way is Direction.SENT else format_endpoint(
            src, sport)
        self.counts[(remote, way, classify(payload))] += 1
        self.packets += 1

    def endpoints(self) -> list[str]:
        return sorted({key[0] for key in self.counts})

    def of(self, endpoint: str, way: Direction) -> dict[str, int]:
        return {m.value: n for (ep, d, m), n in sorted(
            self.counts.items(), key=lambda kv: list(MessageType).index(kv[0][2]))
            if ep == endpoint and d is way}


__all__ = ["Direction", "MessageType", "Tally", "classify", "direction"]
