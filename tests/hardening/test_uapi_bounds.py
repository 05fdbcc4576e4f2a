"""Issue 17, finding 12 (UAPI): numbers within their widths, errors that quote no value.

A 400-digit ``rx_bytes`` from the UAPI socket was accepted as a Python int and made
``/metrics`` fail (500) when it was turned into a float; and a parse error quoted the
offending line, so a key-shaped value reached ``/status``. Now every number is decimal
ASCII within its real width (u64 counters, u16 ports, ...) and an error names the key and
the line number only. The same through a real socket with :func:`uapi.read`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edgeheal.boundaries import wg
from edgeheal.boundaries.wg import uapi

PEER = "0f" * 32
SECRETISH = "ab" * 32  # a value shaped like a key: must never be quoted


def _answer(line: str) -> str:
    """``line`` as line 2: in the interface block for interface keys, else in a peer's."""
    if line.startswith("listen_port="):
        return f"fwmark=0\n{line}\npublic_key={PEER}\nerrno=0\n\n"
    return f"public_key={PEER}\n{line}\nerrno=0\n\n"


@pytest.mark.parametrize("line", [
    f"rx_bytes={'9' * 400}",
    f"tx_bytes={2**64}",
    "listen_port=65536",
    "persistent_keepalive_interval=70000",
    f"last_handshake_time_sec={2**63}",
    "last_handshake_time_nsec=1000000000",
    "rx_bytes=-1",
    "rx_bytes=+5",
    "rx_bytes= 5",
    "rx_bytes=5_000",
    "rx_bytes=\u0665",  # an Arabic-Indic digit int() would accept
    "rx_bytes=",
    f"rx_bytes={SECRETISH}",
    f"endpoint={SECRETISH}",
    f"endpoint={SECRETISH}:51820",
    "endpoint=10.0.0.1:99999",
    f"allowed_ip={SECRETISH}",
    f"public_key={SECRETISH[:-2]}",
    f"{SECRETISH}",
])
def test_a_bad_value_is_a_protocol_error_naming_key_and_line_only(line: str) -> None:
    with pytest.raises(wg.ProtocolError) as info:
        uapi.parse("wg0", _answer(line))
    text = str(info.value)
    assert "line 2" in text
    value = line.partition("=")[2] or line
    assert value not in text or len(value) < 6, text
    assert SECRETISH[:16] not in text


def test_numbers_at_their_widths_are_accepted() -> None:
    answer = (f"listen_port=65535\npublic_key={PEER}\nrx_bytes={2**64 - 1}\n"
              f"tx_bytes={2**64 - 1}\nlast_handshake_time_sec={2**63 - 1}\n"
              "last_handshake_time_nsec=999999999\npersistent_keepalive_interval=65535\n"
              "endpoint=[fe80::1%eth0]:51820\nallowed_ip=10.0.0.0/8\nerrno=0\n\n")
    dev = uapi.parse("wg0", answer)
    assert dev.listen_port == 65535
    assert dev.peers[0].rx_bytes == 2**64 - 1
    assert float(dev.peers[0].rx_bytes) < 1.9e19  # what /metrics does with it


async def test_a_400_digit_counter_from_a_real_socket_is_refused(tmp_path: Path) -> None:
    async def daemon(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\n\n")
        writer.write(_answer(f"rx_bytes={'9' * 400}").encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(daemon, path=str(tmp_path / "wgbig.sock"))
    try:
        with pytest.raises(wg.ProtocolError, match="line 2: bad value for rx_bytes"):
            await uapi.read("wgbig", uapi_dir=tmp_path)
    finally:
        server.close()
        await server.wait_closed()
