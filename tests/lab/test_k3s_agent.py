"""The lab's stand-in K3s agent on loopback, without a lab world: its load balancer writes
K3s's state file and forwards the kubelet's renewals to the server; stuck, it accepts and
forwards nothing, and the renewals stop; a fresh agent (what a restart starts) renews
again. The lab scenarios (test_scenario_agent_stuck.py, ...) run it in namespaces."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from pathlib import Path

from edgeheal.lab.k3s_agent import Agent, serve_server
from tests.support import until

RENEW = 0.1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def renewed_age(status: Path) -> float:
    try:
        return time.time() - float(json.loads(status.read_text())["renewed"])
    except (OSError, ValueError, KeyError):
        return float("inf")


async def test_stuck_balancer_stops_the_renewals_and_a_fresh_agent_renews_again(
        tmp_path: Path) -> None:
    server = ("127.0.0.1", free_port())
    balancer = ("127.0.0.1", free_port())
    state, status = tmp_path / "etc" / "k3s-agent-load-balancer.json", tmp_path / "st.json"
    tasks = [asyncio.create_task(serve_server(*server))]
    await asyncio.sleep(0.1)
    agent = Agent(server, balancer, state, status, RENEW)
    tasks.append(asyncio.create_task(agent.run()))
    try:
        await until(lambda: renewed_age(status) < 2 * RENEW, within=10, what="renewals")
        assert json.loads(state.read_text())["ServerAddresses"] == [f"{server[0]}:{server[1]}"]
        assert agent.upstreams  # one server connection, for the kubelet's client

        agent.stick()
        await until(lambda: renewed_age(status) > 8 * RENEW, within=10,
                    what="the renewals to stop")
        assert not agent.upstreams
        reader, writer = await asyncio.open_connection(*balancer)  # it still accepts ...
        writer.write(b"renew\n")
        await writer.drain()
        try:
            answer = await asyncio.wait_for(reader.readline(), 5 * RENEW)
        except asyncio.TimeoutError:
            answer = b""
        assert answer == b""  # ... and forwards nothing
        writer.close()

        tasks.pop().cancel()  # the restart: the process ends, a fresh one starts
        state.unlink()
        fresh = Agent(server, balancer, state, status, RENEW)
        tasks.append(asyncio.create_task(fresh.run()))
        await until(lambda: renewed_age(status) < 2 * RENEW, within=10,
                    what="renewals after the restart")
        assert state.exists()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        asyncio.get_running_loop().remove_signal_handler(__import__("signal").SIGUSR1)
