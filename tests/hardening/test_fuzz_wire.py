"""Property-based fuzzing (Hypothesis) of the readers of what peers send on the wire.

- the WireGuard userspace API reader (:func:`edgeheal.boundaries.wg.uapi.parse`): any text, and
  recorded answers with lines swapped, mangled or repeated;
- the generic netlink reader (:func:`edgeheal.boundaries.wg.netlink.parse_bytes`): any bytes, and
the
  recorded kernel dump with bytes flipped, cut or spliced;
- edgeheal's MQTT fixed-header reader (:class:`edgeheal.boundaries.mqtt.transport.Framer`), on any
  byte stream and on well-formed streams of random packets;
- the MQTT boundary itself: a fake broker on loopback answering CONNECT with arbitrary
  bytes, to a probe and to the kept-open alert link (paho parses the packets; edgeheal's
  boundary must turn whatever happens into a reason from the closed table).

Every input must give a result or the reader's own error, never another exception, and
no error may quote a secret. CI runs the ``ci`` profile (``tests/conftest.py``:
derandomized, bounded); ``EDGEHEAL_HYPOTHESIS_PROFILE=long`` hunts longer.
"""

from __future__ import annotations

import asyncio
import base64

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeheal.base import compat
from edgeheal.boundaries import wg
from edgeheal.boundaries.mqtt import REASONS, probe
from edgeheal.boundaries.mqtt.link import Link
from edgeheal.boundaries.mqtt.transport import MAX_PACKET, Framer, FramingError
from edgeheal.boundaries.wg import netlink, uapi
from edgeheal.config import MqttTarget
from tests.wireguard.test_netlink import PRIVATE, PSK, recorded
from tests.wireguard.test_uapi import PRIV_HEX, PSK_HEX, RECORDED

SECRETS = (PRIV_HEX, PSK_HEX, base64.b64encode(bytes.fromhex(PRIV_HEX)).decode(),
           base64.b64encode(PRIVATE).decode(), base64.b64encode(PSK).decode())
UAPI_KEYS = ["private_key", "listen_port", "fwmark", "public_key", "preshared_key",
             "protocol_version", "endpoint", "last_handshake_time_sec",
             "last_handshake_time_nsec", "tx_bytes", "rx_bytes",
             "persistent_keepalive_interval", "allowed_ip", "errno", "unknown_key"]


def _no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


# --- UAPI -------------------------------------------------------------------------------

def _uapi(text: str, secrets: tuple[str, ...] = ()) -> None:
    try:
        dev = uapi.parse("wg0", text)
    except wg.ProtocolError as err:
        out = str(err)
    else:
        out = repr(dev)
        for peer in dev.peers:
            assert 0 <= peer.rx_bytes < 2**64
            assert 0 <= peer.tx_bytes < 2**64
            assert 0 <= peer.persistent_keepalive < 2**16
    for secret in secrets:
        assert secret not in out
        assert base64.b64encode(bytes.fromhex(secret)).decode() not in out


@given(st.text(max_size=2000))
def test_uapi_any_text_parses_or_is_a_protocol_error(text: str) -> None:
    _uapi(text)


_hex = st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
_values = st.one_of(st.integers(min_value=-(2**70), max_value=2**70).map(str),
                    st.text(max_size=80), _hex,
                    st.from_regex(r"\[?[0-9a-f:.%]{0,40}\]?:[0-9]{0,7}", fullmatch=True))
_PUBLIC = [k for k in UAPI_KEYS if k not in uapi.SECRET_KEYS]
_lines = st.one_of(st.sampled_from([line for line in RECORDED.splitlines()
                                    if not line.startswith(tuple(uapi.SECRET_KEYS))]),
                   st.tuples(st.sampled_from(_PUBLIC), _values).map("=".join))
_secret_lines = st.tuples(st.sampled_from(sorted(uapi.SECRET_KEYS)), _hex)


@given(st.lists(st.one_of(_lines, _secret_lines), max_size=60))
def test_uapi_answers_of_real_and_mangled_lines_parse_or_fail_cleanly(
        lines: list[str | tuple[str, str]]) -> None:
    secrets = tuple(line[1] for line in lines if isinstance(line, tuple))
    public = [line for line in lines if isinstance(line, str)]
    if any(s in line for s in secrets for line in public):
        return  # the same 64 hex digits as a public key: not a leak
    text = "\n".join(line if isinstance(line, str) else "=".join(line) for line in lines)
    _uapi(text + "\nerrno=0\n\n", secrets)


# --- generic netlink --------------------------------------------------------------------

RECORDED_DUMP = recorded()


def _netlink(data: bytes) -> None:
    try:
        dev = netlink.parse_bytes("wg0", data)
    except wg.ProtocolError as err:
        _no_secret(str(err))
    else:
        _no_secret(repr(dev))


@given(st.binary(max_size=4096))
def test_netlink_any_bytes_parse_or_are_a_protocol_error(data: bytes) -> None:
    _netlink(data)


@given(st.lists(st.tuples(st.integers(0, len(RECORDED_DUMP) - 1), st.integers(0, 255)),
                min_size=1, max_size=12),
       st.integers(0, len(RECORDED_DUMP)), st.binary(max_size=64))
def test_netlink_a_mutated_kernel_dump_parses_or_is_a_protocol_error(
        flips: list[tuple[int, int]], cut: int, tail: bytes) -> None:
    data = bytearray(RECORDED_DUMP)
    for index, value in flips:
        data[index] = value
    _netlink(bytes(data[:cut]) + tail)


# --- the MQTT fixed-header reader -------------------------------------------------------

@given(st.lists(st.binary(min_size=1, max_size=64), max_size=40))
def test_the_framer_takes_any_stream_in_any_chunks_or_raises_framing_error(
        chunks: list[bytes]) -> None:
    framer = Framer()
    error = ""
    try:
        for chunk in chunks:
            framer.feed(chunk)
    except FramingError as err:
        error = str(err)
    assert len(error) < 200  # a short reason, never the bytes
    assert len(framer._connack) <= 2  # nothing of a body is ever kept


def _packet(kind: int, body: bytes) -> bytes:
    length, varint = len(body), bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            return bytes([kind << 4]) + bytes(varint) + body


@given(st.integers(0, 255),
       st.lists(st.tuples(st.sampled_from([4, 5, 6, 7, 9, 11, 13, 14, 15]),
                          st.integers(0, 300)), max_size=20),
       st.integers(1, 97))
def test_the_framer_counts_well_formed_packets_whatever_the_chunking(
        code: int, packets: list[tuple[int, int]], step: int) -> None:
    stream = _packet(2, bytes([0, code])) + b"".join(
        _packet(kind, b"\x01" * size) for kind, size in packets)
    framer = Framer()
    for i in range(0, len(stream), step):
        framer.feed(stream[i:i + step])
    assert framer.packets == 1 + len(packets)
    assert framer.connack_code == code


@given(st.lists(st.sampled_from([4, 9, 13]), max_size=5), st.integers(0, 300),
       st.integers(1, 97))
def test_the_framer_refuses_a_publish_wherever_it_comes(
        before: list[int], size: int, step: int) -> None:
    stream = _packet(2, b"\0\0") + b"".join(_packet(k, b"\x01" * 2) for k in before) \
        + _packet(3, b"\x00\x01t" + b"x" * size)
    framer = Framer()

    def feed_all() -> None:
        for i in range(0, len(stream), step):
            framer.feed(stream[i:i + step])

    with pytest.raises(FramingError, match="subscribes to nothing"):
        feed_all()
    assert framer.packets == 1 + len(before)  # everything before it was read


@given(st.integers(MAX_PACKET + 1, 268_435_455))
def test_the_framer_refuses_any_announced_length_over_the_cap(length: int) -> None:
    stream = _packet(2, b"")[:1]
    varint = bytearray()
    rest = length
    while True:
        byte, rest = rest & 0x7F, rest >> 7
        varint.append(byte | (0x80 if rest else 0))
        if not rest:
            break
    with pytest.raises(FramingError, match=f"{length}-byte"):
        Framer().feed(stream + bytes(varint))


# --- the MQTT boundary, over a real socket ------------------------------------------------

async def _serve_bytes(reply: bytes, run: object) -> object:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read(65536)
            writer.write(reply)
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await run(MqttTarget(name="fuzz", host="127.0.0.1", port=port,  # type: ignore[operator]
                                    timeout=2.0, keepalive=30))
    finally:
        server.close()
        await server.wait_closed()


_replies = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda head, tail: head + tail,
              st.sampled_from([b"\x20\x02\x00\x00", b"\x20\x02\x00\x05", b"\x20\x03\x00\x00",
                               b"\x20\xff\xff\xff\x7f", b"\x20", b"\x20\x02\x01"]),
              st.binary(max_size=100)))


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(_replies)
def test_a_probe_turns_any_broker_reply_into_a_reason(reply: bytes) -> None:
    async def run(target: MqttTarget) -> object:
        return await probe(target, "edge-1", limit=1.5)

    result = asyncio.run(_serve_bytes(reply, run))
    assert result.reason in REASONS  # type: ignore[attr-defined]
    assert result.reason != "internal_error", result  # type: ignore[attr-defined]


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(_replies)
def test_the_alert_link_turns_any_broker_reply_into_a_state(reply: bytes) -> None:
    async def run(target: MqttTarget) -> object:
        link = Link(target, "edge-1", min_delay=5.0)
        task = asyncio.create_task(link.run())
        try:
            async with compat.timeout(3):
                while link.state.reason in ("connecting", "ok"):
                    await link.wait_change()
        except compat.TimeoutErrors:
            pass
        finally:
            link.abort()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled() or task.exception() is None  # the task never died
        return link.state

    state = asyncio.run(_serve_bytes(reply, run))
    assert state.reason in (*REASONS, "connecting"), state  # type: ignore[attr-defined]
    assert state.reason != "internal_error", state  # type: ignore[attr-defined]
