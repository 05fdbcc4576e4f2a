"""The userspace API reader: parsing recorded answers, and live against wireguard-go."""

from __future__ import annotations

import asyncio
import base64
import logging
import socket
from pathlib import Path

import pytest

from edgeheal.boundaries import wg
from edgeheal.boundaries.wg import uapi
from edgeheal.lab.wireguard import WgMesh

PRIV_HEX = "a8" * 32  # a made-up private key that must never come out
PSK_HEX = "5c" * 32
PEER1_HEX = "347686196716ddad6c6a9b7e243ff685aad50e10f128e9f1044f4234ed09fc3f"
PEER2_HEX = "0f" * 32

# Recorded from wireguard-go 0.0.2023 (`get=1`), keys replaced by the made-up ones above.
RECORDED = f"""private_key={PRIV_HEX}
listen_port=51820
fwmark=0
public_key={PEER1_HEX}
preshared_key={PSK_HEX}
protocol_version=1
endpoint=10.200.0.2:51820
last_handshake_time_sec=1796240084
last_handshake_time_nsec=614035471
tx_bytes=528
rx_bytes=436
persistent_keepalive_interval=25
allowed_ip=10.201.0.2/32
allowed_ip=10.42.1.0/24
public_key={PEER2_HEX}
preshared_key={PSK_HEX}
protocol_version=1
endpoint=[fd00::2]:51821
last_handshake_time_sec=0
last_handshake_time_nsec=0
tx_bytes=0
rx_bytes=0
persistent_keepalive_interval=0
errno=0

"""


def test_a_recorded_answer_becomes_peers_with_base64_keys() -> None:
    dev = uapi.parse("flannel-wg", RECORDED)
    assert dev.listen_port == 51820
    assert dev.reader == "uapi"
    first, second = dev.peers
    assert first.public_key == base64.b64encode(bytes.fromhex(PEER1_HEX)).decode()
    assert first.public_key == "NHaGGWcW3a1sapt+JD/2harVDhDxKOnxBE9CNO0J/D8="
    assert first.fingerprint == "NHaGGWcW"
    assert first.endpoint == "10.200.0.2:51820"
    assert first.allowed_ips == ("10.201.0.2/32", "10.42.1.0/24")
    assert first.last_handshake == pytest.approx(1796240084.614035471)
    assert (first.rx_bytes, first.tx_bytes, first.persistent_keepalive) == (436, 528, 25)
    assert second.endpoint == "[fd00::2]:51821"
    assert second.allowed_ips == ()


def test_a_zero_handshake_means_never_not_1970() -> None:
    assert uapi.parse("wg0", RECORDED).peers[1].last_handshake is None


def test_private_and_preshared_keys_are_nowhere_in_the_result() -> None:
    dev = uapi.parse("wg0", RECORDED)
    text = repr(dev)
    for secret in (PRIV_HEX, PSK_HEX, base64.b64encode(bytes.fromhex(PRIV_HEX)).decode(),
                   base64.b64encode(bytes.fromhex(PSK_HEX)).decode()):
        assert secret not in text


@pytest.mark.parametrize(("answer", "expected"), [
    ("listen_port=1\n", "without errno"),
    ("errno=2\n\n", "errno=2"),
    (f"public_key={PEER1_HEX}\nrx_bytes=lots\nerrno=0\n", "line 2: bad value for rx_bytes"),
    (f"public_key={PEER1_HEX}\ntx_bytes=-5\nerrno=0\n", "line 2: bad value for tx_bytes"),
    ("public_key=abcd\nerrno=0\n", "line 1: bad value for public_key"),
    ("garbage\nerrno=0\n", "line 1: expected key=value"),
])
def test_bad_answers_are_protocol_errors_naming_what_was_wrong(answer: str,
                                                                expected: str) -> None:
    with pytest.raises(wg.ProtocolError, match=expected) as info:
        uapi.parse("wg0", answer)
    assert info.value.ifname == "wg0"


def test_a_malformed_secret_line_is_skipped_without_quoting_it() -> None:
    answer = f"private_key=not-hex-{PRIV_HEX}\npublic_key={PEER1_HEX}\nerrno=0\n"
    assert len(uapi.parse("wg0", answer).peers) == 1


async def test_a_missing_socket_is_no_such_device(tmp_path: Path) -> None:
    with pytest.raises(wg.NoSuchDevice, match="no userspace API socket"):
        await uapi.read("ehnone", uapi_dir=tmp_path)
    assert wg.reader_kind("ehnone", uapi_dir=tmp_path) == "netlink"


async def test_a_stale_socket_of_a_dead_daemon_is_no_such_device(tmp_path: Path) -> None:
    path = tmp_path / "ehstale.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # bound, never listening: connection refused
    assert wg.reader_kind("ehstale", uapi_dir=tmp_path) == "uapi"
    with pytest.raises(wg.NoSuchDevice, match="nothing listens"):
        await wg.read_device("ehstale", uapi_dir=tmp_path)


async def test_a_daemon_that_never_answers_times_out_as_a_protocol_error(
        tmp_path: Path) -> None:
    release = asyncio.Event()
    handlers: list[asyncio.Task[None]] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        await reader.read(100)
        await release.wait()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_unix_server(silent, path=str(tmp_path / "ehmute.sock"))
    try:
        with pytest.raises(wg.ProtocolError, match="no complete answer"):
            await uapi.read("ehmute", uapi_dir=tmp_path, answer_within=0.3)
    finally:
        release.set()
        await asyncio.gather(*handlers)
        server.close()
        await server.wait_closed()


async def test_reading_a_live_wireguard_go_device(mesh: WgMesh,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    a, b = mesh.nodes
    mesh.wait_handshake(a, b)
    dev = await wg.read_device(a.ifname)
    assert wg.reader_kind(a.ifname) == "uapi"
    assert dev.interface == a.ifname
    assert dev.listen_port == 51820
    (peer,) = dev.peers
    assert peer.public_key == b.public_key
    assert peer.endpoint == mesh.endpoint(a, b)
    assert set(peer.allowed_ips) == {b.pod_cidr}  # Flannel: the lease only
    assert peer.persistent_keepalive == 5
    assert peer.last_handshake is not None
    assert peer.rx_bytes > 0
    assert peer.tx_bytes > 0
    # the same numbers `wg show dump` prints
    row = mesh.dump(a)[b.public_key]
    assert int(row[4]) == int(peer.last_handshake)
    assert a.private_key not in repr(dev) + caplog.text


async def test_a_new_listen_port_is_learned_by_the_peer_from_the_next_packet(
        mesh: WgMesh) -> None:
    # the rebind remedy's mechanism: a's device moves to another port, keeps its peer and
    # session, and b learns a's new endpoint from a's next authenticated packet (roaming)
    import time

    from edgeheal.lab.netns import run

    a, b = mesh.nodes
    mesh.wait_handshake(a, b)
    await wg.set_listen_port(a.ifname, 40123)
    assert (await wg.read_device(a.ifname)).listen_port == 40123
    deadline = time.monotonic() + 20
    endpoint = ""
    while time.monotonic() < deadline:
        run(["ping", "-c", "1", "-W", "1", b.overlay], ns=a.ns, check=False)
        endpoint = mesh.dump(b)[a.public_key][2]
        if endpoint == f"{a.underlay[b.index]}:40123":
            break
        await asyncio.sleep(0.2)
    assert endpoint == f"{a.underlay[b.index]}:40123"
    ping = run(["ping", "-c", "1", "-W", "2", a.overlay], ns=b.ns, check=False)
    assert ping.returncode == 0  # b's answers reach a at its new port


async def test_a_listen_port_in_use_is_a_protocol_error_and_leaves_wireguard_go_unbound(
        mesh: WgMesh) -> None:
    # found here: wireguard-go closes its old sockets before it binds the new port, so a
    # failed set leaves the device on no port at all (listen_port 0); the rebind remedy
    # therefore puts the old port back when a new one fails
    from edgeheal.lab.nsutil import inside

    a, _ = mesh.nodes
    with inside(a.ns):
        taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        taken.bind(("0.0.0.0", 40124))
        with pytest.raises(wg.ProtocolError, match="listen_port=40124 answered errno="):
            await wg.set_listen_port(a.ifname, 40124)
    finally:
        taken.close()
    assert (await wg.read_device(a.ifname)).listen_port == 0
    await wg.set_listen_port(a.ifname, 51820)
    assert (await wg.read_device(a.ifname)).listen_port == 51820


async def test_setting_a_port_out_of_range_is_refused_before_asking(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="out of range"):
        await uapi.set_listen_port("ehx", 0, uapi_dir=tmp_path)
    with pytest.raises(wg.NoSuchDevice):
        await uapi.set_listen_port("ehx", 40000, uapi_dir=tmp_path)
