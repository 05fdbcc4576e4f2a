"""Issue 17, findings 8 and 12 (MQTT): a bad broker cannot blow up memory or mislead.

A fake broker announcing a 256 MB packet (``0x20 FF FF FF 7F`` as the CONNACK; a PUBLISH
of that length on the kept-open alert link) drove a probe to 274 MB and the link to
856 MB: paho asks ``recv()`` for the whole remaining length at once. Now every byte passes
edgeheal's own fixed-header reader (:class:`edgeheal.boundaries.mqtt.transport.Framer`) first, which
refuses a packet over 64 KiB, and any PUBLISH (the agent subscribes to nothing: a QoS 2
flood once reached 405 MB), before anything is buffered: ``protocol_error``, and the peak
RSS of the process (measured in a child process, its ``VmHWM``) stays that of an idle
agent. An MQTT 3.1.1 refusal is reported with its own code and name, not paho's MQTT 5
translation (code 5 was printed as "code 135").
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from edgeheal.boundaries.mqtt import probe
from edgeheal.boundaries.mqtt.transport import MAX_PACKET
from edgeheal.config import MqttTarget

ANNOUNCE_256MB = bytes([0xFF, 0xFF, 0xFF, 0x7F])
CONNACK_OK = bytes([0x20, 0x02, 0x00, 0x00])
STREAMED = 96 * 1024 * 1024
"""Bytes the fake broker really sends after announcing the huge packet."""
RSS_LIMIT_MB = 100
"""A child with edgeheal and paho loaded peaks near 50 MB; buffering the stream took 130+
before the fix."""

ROOT = Path(__file__).resolve().parents[2]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], object]


class FakeBroker:
    """A loopback TCP server that answers every CONNECT with ``replies`` bytes."""

    def __init__(self, replies: bytes, *, later: bytes = b"", stream: int = 0) -> None:
        self.replies, self.later, self.stream = replies, later, stream
        self.port = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            await reader.read(65536)  # the CONNECT
            writer.write(self.replies)
            await writer.drain()
            if self.later:
                await asyncio.sleep(0.3)  # after the client handled the CONNACK
                writer.write(self.later)
                await writer.drain()
            chunk = b"\0" * 65536
            for _ in range(self.stream // len(chunk)):
                writer.write(chunk)
                await writer.drain()
            await reader.read(65536)  # until the client gives up
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> FakeBroker:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for w in self._writers:
            w.close()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


def _target(port: int, **kw: object) -> MqttTarget:
    return MqttTarget(name="fake", host="127.0.0.1", port=port, timeout=5.0,
                      **kw)  # type: ignore[arg-type]


CHILD = r"""
import asyncio, json, sys
from edgeheal.base import compat
from edgeheal.config import MqttTarget
port, mode = int(sys.argv[1]), sys.argv[2]
target = MqttTarget(name="fake", host="127.0.0.1", port=port, timeout=8.0, keepalive=30)

async def main():
    if mode == "probe":
        from edgeheal.boundaries.mqtt import probe
        result = await probe(target, "edge-1")
        return {"reason": result.reason, "message": result.message}
    from edgeheal.boundaries.mqtt.link import Link
    link = Link(target, "edge-1", min_delay=5.0)
    task = asyncio.create_task(link.run())
    seen = []
    async with compat.timeout(8):
        while True:
            await link.wait_change()
            seen.append(link.state.reason)
            if not link.state.up and link.state.reason != "connecting":
                break
    link.abort()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return {"reason": link.state.reason, "message": link.state.message, "seen": seen}

out = asyncio.run(main())
# VmHWM, not ru_maxrss: ru_maxrss survives execve, so it would carry the high-water mark
# of the forked pytest worker (100+ MB late in a parallel run), not this program's own
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
out["maxrss_mb"] = int(hwm.split()[1]) / 1024
print(json.dumps(out))
"""


async def _child(port: int, mode: str) -> dict[str, object]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(port), mode, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, cwd=ROOT)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    return dict(json.loads(out.decode().splitlines()[-1]))


@pytest.fixture
async def huge_connack() -> AsyncIterator[FakeBroker]:
    async with FakeBroker(bytes([0x20]) + ANNOUNCE_256MB, stream=STREAMED) as broker:
        yield broker


@pytest.fixture
async def huge_publish() -> AsyncIterator[FakeBroker]:
    async with FakeBroker(CONNACK_OK, later=bytes([0x30]) + ANNOUNCE_256MB,
                          stream=STREAMED) as broker:
        yield broker


async def test_a_probe_refuses_a_256_mb_connack_with_small_memory(
        huge_connack: FakeBroker) -> None:
    out = await _child(huge_connack.port, "probe")
    assert out["reason"] == "protocol_error", out
    assert "268435455-byte CONNACK" in str(out["message"])
    assert f"at most {MAX_PACKET} bytes" in str(out["message"])
    assert float(out["maxrss_mb"]) < RSS_LIMIT_MB, out  # type: ignore[arg-type]


async def test_the_alert_link_refuses_a_256_mb_publish_with_small_memory(
        huge_publish: FakeBroker) -> None:
    out = await _child(huge_publish.port, "link")
    assert out["seen"][:2] == ["ok", "protocol_error"], out  # type: ignore[index]
    assert "268435455-byte PUBLISH" in str(out["message"])
    assert float(out["maxrss_mb"]) < RSS_LIMIT_MB, out  # type: ignore[arg-type]


async def test_a_probe_stops_at_the_connack_and_never_reads_a_publish_behind_it() -> None:
    """A PUBLISH just under the cap behind the CONNACK: the probe's answer is the CONNACK
    (the path works), and it disconnects without reading what follows."""
    body = b"\0" * (MAX_PACKET - 3)  # PUBLISH: topic length 0, then payload
    length = len(body) + 2
    varint = bytes([(length & 0x7F) | 0x80, (length >> 7) & 0x7F | 0x80, length >> 14])
    async with FakeBroker(CONNACK_OK + b"\x30" + varint + b"\0\0" + body) as broker:
        result = await probe(_target(broker.port), "edge-1", limit=3.0)
    assert result.reason == "ok", result.message


def _publish(qos: int, payload: int, packet_id: int = 1) -> bytes:
    """One PUBLISH to topic ``t`` (a packet id from QoS 1 on), remaining length varint."""
    body = b"\x00\x01t" + (packet_id.to_bytes(2, "big") if qos else b"") + b"x" * payload
    n, varint = len(body), bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return bytes([0x30 | qos << 1]) + bytes(varint) + body


@pytest.mark.parametrize("qos", [0, 1, 2])
async def test_the_alert_link_refuses_a_publish_flood_with_small_memory(qos: int) -> None:
    """6,000 x 60 KB of QoS 2 once reached 405 MB: paho kept each message for its PUBREL.
    Now the first PUBLISH drops the connection before paho sees it."""
    flood = b"".join(_publish(qos, 60 * 1024, i + 1) for i in range(1500))
    async with FakeBroker(CONNACK_OK, later=flood) as broker:
        out = await _child(broker.port, "link")
    assert out["seen"][:2] == ["ok", "protocol_error"], out  # type: ignore[index]
    assert "subscribes to nothing" in str(out["message"])
    assert float(out["maxrss_mb"]) < RSS_LIMIT_MB, out  # type: ignore[arg-type]


CODES_311 = {1: "unacceptable protocol version", 2: "identifier rejected",
             3: "server unavailable", 4: "bad user name or password", 5: "not authorized"}


@pytest.mark.parametrize("code", sorted(CODES_311))
async def test_an_mqtt_311_refusal_is_reported_with_its_own_code_and_name(code: int) -> None:
    async with FakeBroker(bytes([0x20, 0x02, 0x00, code])) as broker:
        result = await probe(_target(broker.port), "edge-1", limit=3.0)
    assert result.reason == "refused", result.message
    assert f"{CODES_311[code]} (MQTT 3.1.1 code {code})" in result.message
    assert "code 13" not in result.message  # 128-137 are MQTT 5 codes


async def test_an_mqtt_5_refusal_keeps_its_mqtt_5_code() -> None:
    # CONNACK v5: flags, reason 0x87 (not authorized), properties length 0
    async with FakeBroker(bytes([0x20, 0x03, 0x00, 0x87, 0x00])) as broker:
        result = await probe(_target(broker.port, protocol="5"), "edge-1", limit=3.0)
    assert result.reason == "refused", result.message
    assert "(code 135)" in result.message
