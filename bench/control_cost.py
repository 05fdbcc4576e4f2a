"""What the ``control`` check costs: bytes a day on the metered link, CPU per run.

Runs the check for a simulated day at the shipped defaults (``interval`` 10 s,
``api_interval`` 1 h, ``api_spacing`` 20 s) against the stand-in API server, the
stand-in kubelet renewing the node's Lease, a kubelet ``/healthz`` and an "agent"
connection held to the server, all on loopback. The check's clock is the fake one, so a
day of 8640 runs takes seconds; every API read goes through a counting TCP proxy, so the
bytes are the real TLS records of the check's own HTTP client (a new TLS connection per
read: the check closes it, as the next read is an hour away). Then one simulated hour with
the agent's heartbeat lost (no connection, the Lease frozen): the reads an incident
costs. Wire bytes add 52 bytes of IPv4+TCP headers per segment (the proxy counts
segments as the reads it sees: an upper bound on small records).

    /opt/edgeheal/bin/python bench/control_cost.py
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeheal.checks.control import ControlCheck
from edgeheal.lab.kubeapi import FakeKube
from tests.support import Clock, context

NODE = "edge-1"
DAY = 86400
HEADERS = 52


class Counter:
    def __init__(self) -> None:
        self.bytes = 0
        self.segments = 0
        self.connections = 0


async def proxy(target_port: int, counter: Counter) -> asyncio.base_events.Server:
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                counter.bytes += len(data)
                counter.segments += 1
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counter.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def main() -> None:  # noqa: PLR0915 - one bench, read top to bottom
    api = FakeKube()
    api.add_node(NODE)
    api.set_addresses(NODE, "127.0.0.1")
    agent = api.add_user("system:serviceaccount:kube-flannel:edgeheal-edge-1")
    api.allow_agent(agent.user)
    url = await api.start()
    api.kubelet_start(NODE, renew=0.01, grace=3600.0)
    port = int(url.rsplit(":", 1)[1])
    counter = Counter()
    front = await proxy(port, counter)
    front_port = front.sockets[0].getsockname()[1]

    async def healthz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # the "server" end of the agent's connection, kept open
        writer.close()

    kubelet = await asyncio.start_server(healthz, "127.0.0.1", 0)
    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    server_port = server.sockets[0].getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        api.url = f"https://127.0.0.1:{front_port}"
        kubeconfig = api.write_kubeconfig(Path(tmp) / "kubeconfig", agent)
        api.url = url
        clock = Clock()
        harness = context(f"""
[agent]
node_name = "{NODE}"
[kubernetes]
kubeconfig = "{kubeconfig}"
[control]
servers = ["127.0.0.1:{server_port}"]
kubelet_healthz = "127.0.0.1:{kubelet.sockets[0].getsockname()[1]}"
""", clock=clock)
        settings = harness.ctx.config.control
        check = ControlCheck(harness.ctx)
        held = socket.create_connection(("127.0.0.1", server_port))
        cpu: list[float] = []
        runs = int(DAY / (settings.interval or 10.0))
        for _ in range(runs):
            started = time.process_time()
            result = await check.run()
            cpu.append(time.process_time() - started)
            assert result.reason == "ok", result.message
            clock.advance(settings.interval or 10.0)
        healthy = (counter.bytes, counter.segments, counter.connections)
        held.close()
        api.kubelet_stop(NODE)
        reasons: dict[str, int] = {}
        for _ in range(360):
            result = await check.run()
            reasons[result.reason] = reasons.get(result.reason, 0) + 1
            clock.advance(settings.interval or 10.0)
        incident = (counter.bytes - healthy[0], counter.segments - healthy[1],
                    counter.connections - healthy[2])
        await check.close()
    front.close()
    kubelet.close()
    server.close()
    await api.close()

    def wire(sample: tuple[int, int, int]) -> int:
        return sample[0] + HEADERS * sample[1]

    print(json.dumps({
        "defaults": {"interval": settings.interval, "api_interval": settings.api_interval,
                     "api_spacing": settings.api_spacing},
        "healthy_day": {"runs": runs, "api_reads": healthy[2],
                        "tls_bytes": healthy[0], "wire_bytes": wire(healthy),
                        "mb_per_day": round(wire(healthy) / 1e6, 3),
                        "bytes_per_read": wire(healthy) // max(1, healthy[2])},
        "lost_heartbeat_hour": {"api_reads": incident[2], "wire_bytes": wire(incident),
                                "reasons": reasons},
        "cpu_per_run_ms_median": round(statistics.median(cpu) * 1000, 3),
        "cpu_per_day_s": round(sum(cpu), 1),
    }, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
