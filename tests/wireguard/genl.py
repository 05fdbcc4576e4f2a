"""Byte-exact WireGuard generic netlink answers, laid out as the kernel writes them.

The kernel module is absent on the machines this project is tested on, so the netlink
reader is tested against messages built here by hand with ``struct`` from the layout in
the kernel's ``include/uapi/linux/wireguard.h`` and ``drivers/net/wireguard/netlink.c``
(``wg_get_device_start/dump``): nlmsghdr, genlmsghdr, device attributes, then a
``WGDEVICE_A_PEERS`` nest holding one nest (type 0) per peer, each with an
``WGPEER_A_ALLOWEDIPS`` nest of allowed-IP nests (type 0). pyroute2's own encoder is
deliberately not used, so a decoder mistake cannot cancel out an encoder mistake.
"""

from __future__ import annotations

import base64
import ipaddress
import socket
import struct
from dataclasses import dataclass, field

NLA_F_NESTED = 0x8000
NLM_F_MULTI = 0x2
WG_CMD_GET_DEVICE = 0

(DEV_IFINDEX, DEV_IFNAME, DEV_PRIVATE_KEY, DEV_PUBLIC_KEY, DEV_FLAGS, DEV_LISTEN_PORT,
 DEV_FWMARK, DEV_PEERS) = range(1, 9)
(PEER_PUBLIC_KEY, PEER_PRESHARED_KEY, PEER_FLAGS, PEER_ENDPOINT, PEER_KEEPALIVE,
 PEER_LAST_HANDSHAKE, PEER_RX, PEER_TX, PEER_ALLOWEDIPS, PEER_PROTOCOL) = range(1, 11)
AIP_FAMILY, AIP_IPADDR, AIP_CIDR = 1, 2, 3


def nla(kind: int, payload: bytes, *, nested: bool = False) -> bytes:
    length = 4 + len(payload)
    head = struct.pack("=HH", length, kind | (NLA_F_NESTED if nested else 0))
    return head + payload + b"\0" * ((4 - length % 4) % 4)


@dataclass
class GenlPeer:
    public_key: str
    preshared_key: bytes = b"\x11" * 32
    endpoint: tuple[str, int] | None = None
    keepalive: int = 0
    handshake: tuple[int, int] = (0, 0)
    rx: int = 0
    tx: int = 0
    allowed_ips: list[str] = field(default_factory=list)

    def encode(self, allowed: list[str] | None = None) -> bytes:
        allowed = self.allowed_ips if allowed is None else allowed
        body = nla(PEER_PUBLIC_KEY, base64.b64decode(self.public_key))
        body += nla(PEER_PRESHARED_KEY, self.preshared_key)
        body += nla(PEER_LAST_HANDSHAKE, struct.pack("=qq", *self.handshake))
        body += nla(PEER_KEEPALIVE, struct.pack("=H", self.keepalive))
        body += nla(PEER_TX, struct.pack("=Q", self.tx))
        body += nla(PEER_RX, struct.pack("=Q", self.rx))
        body += nla(PEER_PROTOCOL, struct.pack("=I", 1))
        if self.endpoint:
            host, port = self.endpoint
            if ":" in host:
                sa = struct.pack("=H", socket.AF_INET6) + struct.pack(">HI", port, 0)
                sa += socket.inet_pton(socket.AF_INET6, host) + struct.pack("=I", 0)
            else:
                sa = struct.pack("=H", socket.AF_INET) + struct.pack(">H", port)
                sa += socket.inet_pton(socket.AF_INET, host) + b"\0" * 8
            body += nla(PEER_ENDPOINT, sa)
        ips = b""
        for cidr in allowed:
            net = ipaddress.ip_network(cidr)
            fam = socket.AF_INET if net.version == 4 else socket.AF_INET6
            one = nla(AIP_CIDR, struct.pack("=B", net.prefixlen))
            one += nla(AIP_IPADDR, net.network_address.packed)
            one += nla(AIP_FAMILY, struct.pack("=H", fam))
            ips += nla(0, one, nested=True)
        body += nla(PEER_ALLOWEDIPS, ips, nested=True)
        return nla(0, body, nested=True)


def device_message(*, family_id: int, ifname: str, listen_port: int, peer_blobs: list[bytes],
                   seq: int = 1, private_key: bytes = b"\x42" * 32) -> bytes:
    attrs = nla(DEV_LISTEN_PORT, struct.pack("=H", listen_port))
    attrs += nla(DEV_PUBLIC_KEY, b"\x07" * 32)
    attrs += nla(DEV_PRIVATE_KEY, private_key)
    attrs += nla(DEV_FWMARK, struct.pack("=I", 0))
    attrs += nla(DEV_IFINDEX, struct.pack("=I", 7))
    attrs += nla(DEV_IFNAME, ifname.encode() + b"\0")
    if peer_blobs:
        attrs += nla(DEV_PEERS, b"".join(peer_blobs), nested=True)
    genl = struct.pack("=BBH", WG_CMD_GET_DEVICE, 1, 0)
    length = 16 + len(genl) + len(attrs)
    return struct.pack("=IHHII", length, family_id, NLM_F_MULTI, seq, 4242) + genl + attrs
