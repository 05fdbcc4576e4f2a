"""The generic netlink reader, on recorded kernel-layout messages (no kernel module here)."""

from __future__ import annotations

import base64
import errno

import pytest

from edgeheal.boundaries import wg
from edgeheal.boundaries.wg import netlink
from tests.wireguard.genl import GenlPeer, device_message

KEY1 = base64.b64encode(bytes(range(32))).decode()
KEY2 = base64.b64encode(bytes(range(100, 132))).decode()
PRIVATE = bytes(range(200, 232))
PSK = b"\x99" * 32


def recorded() -> bytes:
    p1 = GenlPeer(KEY1, preshared_key=PSK, endpoint=("10.200.0.2", 51820), keepalive=25,
                  handshake=(1796240084, 500_000_000), rx=436, tx=528,
                  allowed_ips=["10.201.0.2/32", "10.42.1.0/24"])
    p2 = GenlPeer(KEY2, preshared_key=PSK, endpoint=("fd00::2", 51821),
                  allowed_ips=["fd00:42::/64"])
    return device_message(family_id=27, ifname="flannel-wg", listen_port=51820,
                          peer_blobs=[p1.encode(), p2.encode()], private_key=PRIVATE)


def test_a_recorded_dump_becomes_the_same_stats_as_the_uapi_reader_gives() -> None:
    dev = netlink.parse_messages("flannel-wg", netlink.decode(recorded()))
    assert dev.reader == "netlink"
    assert dev.listen_port == 51820
    first, second = dev.peers
    assert first == wg.PeerStats(
        public_key=KEY1, endpoint="10.200.0.2:51820",
        allowed_ips=("10.201.0.2/32", "10.42.1.0/24"), last_handshake=1796240084.5,
        rx_bytes=436, tx_bytes=528, persistent_keepalive=25)
    assert second.endpoint == "[fd00::2]:51821"
    assert second.last_handshake is None  # 0 means never
    assert second.allowed_ips == ("fd00:42::/64",)


def test_a_peer_continued_in_the_next_message_is_merged() -> None:
    # The kernel splits a dump when a peer's allowed IPs do not fit; the next message
    # starts with the same peer (public key) carrying the rest of its allowed IPs.
    peer = GenlPeer(KEY1, endpoint=("10.0.0.2", 51820), keepalive=25, handshake=(5, 0),
                    allowed_ips=["10.42.1.0/24", "10.42.2.0/24", "10.42.3.0/24"])
    other = GenlPeer(KEY2, endpoint=("10.0.0.3", 51820))
    part1 = device_message(family_id=27, ifname="wg0", listen_port=1, seq=1,
                           peer_blobs=[peer.encode(peer.allowed_ips[:2])])
    part2 = device_message(family_id=27, ifname="wg0", listen_port=1, seq=1,
                           peer_blobs=[peer.encode(peer.allowed_ips[2:]), other.encode()])
    dev = netlink.parse_messages("wg0", netlink.decode(part1 + part2))
    assert [p.public_key for p in dev.peers] == [KEY1, KEY2]
    assert dev.peers[0].allowed_ips == ("10.42.1.0/24", "10.42.2.0/24", "10.42.3.0/24")


def test_a_device_without_peers_has_none() -> None:
    data = device_message(family_id=27, ifname="wg0", listen_port=7, peer_blobs=[])
    dev = netlink.parse_messages("wg0", netlink.decode(data))
    assert (dev.listen_port, dev.peers) == (7, ())


def test_keys_other_than_public_ones_never_reach_the_result() -> None:
    dev = netlink.parse_messages("flannel-wg", netlink.decode(recorded()))
    text = repr(dev)
    for secret in (PRIVATE, PSK):
        assert base64.b64encode(secret).decode() not in text
        assert secret.hex() not in text


def test_a_truncated_stream_is_rejected() -> None:
    with pytest.raises(ValueError, match="bad netlink message length"):
        netlink.decode(recorded()[:-10])


@pytest.mark.parametrize(("code", "kind", "text"), [
    (errno.EPERM, wg.PermissionDenied, "CAP_NET_ADMIN"),
    (errno.ENOENT, wg.NoSuchDevice, "kernel module not loaded"),
    (errno.ENODEV, wg.NoSuchDevice, "no such interface"),
    (errno.EOPNOTSUPP, wg.NoSuchDevice, "not a WireGuard interface"),
    (errno.EIO, wg.ProtocolError, "errno 5"),
])
def test_kernel_errors_map_to_the_reader_errors(code: int, kind: type[Exception],
                                                text: str) -> None:
    err = netlink._error("flannel-wg", code, "boom")
    assert isinstance(err, kind)
    assert text in str(err)
    assert str(err).startswith("flannel-wg: ")


async def test_without_the_kernel_module_a_device_is_reported_missing() -> None:
    # No WireGuard module on this machine: the real netlink path must say so clearly.
    with pytest.raises(wg.NoSuchDevice):
        await netlink.read("ehnosuchwg0")


def test_the_listen_port_request_carries_the_name_and_the_port_only() -> None:
    # WG_CMD_SET_DEVICE (1) with WGDEVICE_A_IFNAME (2, NUL-terminated string) and
    # WGDEVICE_A_LISTEN_PORT (6, u16 host order): the kernel's wg_set_device then re-opens
    # the sockets on the new port and keeps the peers (no WGDEVICE_F_REPLACE_PEERS)
    import struct

    msg = netlink.listen_port_request("flannel-wg", 40555)
    msg["header"]["type"], msg["header"]["pid"] = 0x1F, 0
    msg.encode()
    data = bytes(msg.data)
    cmd, _version = struct.unpack_from("=BB", data, 16)
    assert cmd == 1
    attrs, offset = {}, 20
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        attrs[kind] = data[offset + 4:offset + length]
        offset += (length + 3) & ~3
    assert set(attrs) == {2, 6}
    assert attrs[2] == b"flannel-wg\0"
    assert struct.unpack("=H", attrs[6]) == (40555,)
    with pytest.raises(ValueError, match="out of range"):
        netlink.listen_port_request("flannel-wg", 70000)
