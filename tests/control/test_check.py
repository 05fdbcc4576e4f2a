"""The control check end to end on loopback: the stand-in API server (its Lease renewed by
the stand-in kubelet) doubles as the K3s server the "agent" connects to, a tiny kubelet
``/healthz`` and a local "load balancer" listen on 127.0.0.1, and the check reads this
process's own TCP table. The check's clock is the fake one, the kubelet's is real (it
renews every 50 ms), so the tests step the check through its spacing and intervals."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edgeheal.checks.control import ControlCheck
from edgeheal.lab.kubeapi import Credentials, FakeKube
from edgeheal.model import State
from tests.support import Clock, context

NODE = "edge-1"


@dataclass
class World:
    api: FakeKube
    kubeconfig: Path
    healthz_status: list[int] = field(default_factory=lambda: [200])
    healthz_port: int = 0
    balancer_port: int = 0
    held: list[socket.socket] = field(default_factory=list)

    @property
    def server(self) -> str:
        return self.api.url.removeprefix("https://")

    @property
    def server_port(self) -> int:
        return int(self.server.rsplit(":", 1)[1])

    def connect(self, port: int) -> None:
        """An "agent" connection (kept until the test ends, or :meth:`drop`)."""
        sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
        self.held.append(sock)

    def drop(self) -> None:
        for sock in self.held:
            sock.close()
        self.held.clear()

    def lease_reads(self) -> int:
        return sum(1 for r in self.api.requests if "/leases/" in r.path)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    api = FakeKube()
    api.add_node(NODE)
    api.set_addresses(NODE, "127.0.0.1")
    agent: Credentials = api.add_user("system:serviceaccount:kube-flannel:edgeheal-edge-1")
    api.allow_agent(agent.user)
    await api.start()
    api.kubelet_start(NODE, renew=0.05, grace=3600.0)
    world = World(api, api.write_kubeconfig(tmp_path / "kubeconfig", agent))

    async def healthz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        code = world.healthz_status[0]
        writer.write(f"HTTP/1.1 {code} X\r\nContent-Length: 2\r\n\r\nok".encode())
        await writer.drain()
        writer.close()

    async def balancer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accepts, never forwards: the stuck balancer
        writer.close()

    kubelet = await asyncio.start_server(healthz, "127.0.0.1", 0)
    lb = await asyncio.start_server(balancer, "127.0.0.1", 0)
    world.healthz_port = kubelet.sockets[0].getsockname()[1]
    world.balancer_port = lb.sockets[0].getsockname()[1]
    try:
        yield world
    finally:
        world.drop()
        for server in (kubelet, lb):
            server.close()
        await api.close()


def check_for(world: World, clock: Clock, servers: str = "",
              exclude_uid: int | None = None) -> ControlCheck:
    servers = servers or world.server
    harness = context(f"""
[agent]
node_name = "{NODE}"
[kubernetes]
kubeconfig = "{world.kubeconfig}"
request_timeout = "5s"
[control]
servers = ["{servers}"]
balancer = "127.0.0.1:{world.balancer_port}"
kubelet_healthz = "127.0.0.1:{world.healthz_port}"
""", clock=clock)
    return ControlCheck(harness.ctx, exclude_uid=exclude_uid)


async def test_a_healthy_agent_costs_one_api_read_in_three_hours(world: World) -> None:
    clock = Clock()
    check = check_for(world, clock)
    world.connect(world.server_port)
    try:
        first = await check.run()
        assert (first.state, first.reason) == (State.OK, "ok"), first.message
        assert world.lease_reads() == 1
        for _ in range(30):  # five minutes of runs: the local evidence only
            clock.advance(10.0)
            result = await check.run()
            assert result.reason == "ok", result.message
        assert world.lease_reads() == 1
        assert result.detail["server_connections"]["established"] >= 1
        clock.advance(3600.0)
        assert (await check.run()).reason == "ok"
        assert world.lease_reads() == 1
        clock.advance(2 * 3600.0)
        assert (await check.run()).reason == "ok"
        assert world.lease_reads() == 2
    finally:
        await check.close()


async def test_a_lease_not_renewed_while_the_server_answers_is_heartbeat_stale(
        world: World) -> None:
    clock = Clock()
    check = check_for(world, clock)
    try:
        world.api.kubelet_stop(NODE)
        first = await check.run()  # no agent connection: suspicious, one read, no verdict
        assert (first.state, first.reason) == (State.UNKNOWN, "confirming"), first.message
        reasons = []
        for _ in range(2):  # no agent connection at all: suspicious at every run
            clock.advance(20.0)
            result = await check.run()
            reasons.append(result.reason)
        assert reasons[-1] == "heartbeat_stale", result.message
        assert reasons[0] == "confirming"
        assert result.state is State.FAILED
        assert result.detail["direct"] == "ok"
        assert result.detail["api"]["lease"]["unchanged_seconds"] >= 40
        world.api.kubelet_start(NODE, renew=0.05)
        world.connect(world.server_port)
        clock.advance(20.0)
        await asyncio.sleep(0.2)  # a real renewal by the stand-in kubelet
        healed = await check.run()
        assert healed.reason == "ok", healed.message
        # a fault that persists is read again less and less often
        world.drop()
        world.api.kubelet_stop(NODE)
        reads = world.lease_reads()
        for _ in range(360):  # an hour at the 10 s interval
            clock.advance(10.0)
            await check.run()
        assert 5 <= world.lease_reads() - reads <= 12
    finally:
        await check.close()


async def test_balancer_clients_without_a_server_connection_is_balancer_stuck(
        world: World) -> None:
    clock = Clock()
    check = check_for(world, clock)
    world.connect(world.balancer_port)  # the kubelet's connection, accepted by the LB
    try:
        world.api.kubelet_stop(NODE)
        for _ in range(5):
            clock.advance(20.0)
            result = await check.run()
        assert result.reason == "balancer_stuck", result.message
        assert result.detail["balancer"] == {"listening": True, "clients": 1}
    finally:
        await check.close()


async def test_no_server_answering_is_server_unreachable_and_reads_nothing(
        world: World) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: the handshake is refused
    port = closed.getsockname()[1]
    clock = Clock()
    check = check_for(world, clock, servers=f"127.0.0.1:{port}")
    try:
        result = await check.run()
        assert (result.state, result.reason) == (State.FAILED, "server_unreachable")
        assert result.detail["direct"] == "ECONNREFUSED"
        assert world.lease_reads() == 0
    finally:
        closed.close()
        await check.close()


async def test_a_node_the_kubelet_reports_not_ready_is_not_ready(world: World) -> None:
    world.api.kubelet_not_ready(NODE, "container runtime network not ready")
    world.connect(world.server_port)
    check = check_for(world, Clock())
    try:
        result = await check.run()
        assert (result.state, result.reason) == (State.FAILED, "not_ready"), result.message
        assert result.detail["api"]["node"]["reason"] == "KubeletNotReady"
    finally:
        await check.close()


async def test_an_internal_ip_no_longer_on_the_node_is_node_ip_changed(
        world: World) -> None:
    world.api.set_addresses(NODE, "192.0.2.77")
    world.connect(world.server_port)
    check = check_for(world, Clock())
    try:
        result = await check.run()
        assert (result.state, result.reason) == (State.FAILED, "node_ip_changed")
        assert "192.0.2.77" in result.message
    finally:
        await check.close()


async def test_a_kubelet_unhealthy_with_a_renewed_lease_is_not_a_fault(
        world: World) -> None:
    world.connect(world.server_port)
    world.healthz_status[0] = 500
    clock = Clock()
    check = check_for(world, clock)
    try:
        first = await check.run()
        assert (first.state, first.reason) == (State.UNKNOWN, "confirming")
        assert first.detail["kubelet_healthz"] == "http 500"
        clock.advance(20.0)
        await asyncio.sleep(0.2)
        second = await check.run()
        assert second.reason == "ok", second.message
        assert "although" in second.message
        reads = world.lease_reads()
        clock.advance(20.0)  # the spacing doubled: no read at 20 s
        await check.run()
        assert world.lease_reads() == reads
    finally:
        await check.close()


async def test_an_account_without_the_grants_is_forbidden(world: World,
                                                          tmp_path: Path) -> None:
    other = world.api.add_user("system:serviceaccount:kube-flannel:nobody")
    world.kubeconfig = world.api.write_kubeconfig(tmp_path / "nobody", other)
    check = check_for(world, Clock())
    try:
        result = await check.run()
        assert (result.state, result.reason) == (State.UNKNOWN, "forbidden")
        assert "leases" in result.message
        assert other.token not in result.message
    finally:
        await check.close()


async def test_edgeheals_own_connections_never_pass_for_the_agents(world: World) -> None:
    """The agent runs as its own user, K3s as root: sockets of the agent's uid are its
    own API connections, not the K3s agent's (here: this test's, as the excluded uid)."""
    world.connect(world.server_port)
    check = check_for(world, Clock(), exclude_uid=os.getuid())
    try:
        result = await check.run()
        assert result.detail["server_connections"]["established"] == 0
        assert result.detail["suspicion"] == ("the agent holds no established connection "
                                              "to a server")
    finally:
        await check.close()


async def test_without_kubernetes_the_check_has_its_local_evidence_only(
        world: World) -> None:
    harness = context(f"""
[agent]
node_name = "{NODE}"
[control]
servers = ["{world.server}"]
kubelet_healthz = ""
""", clock=Clock())
    check = ControlCheck(harness.ctx, exclude_uid=None)
    try:
        lost = await check.run()  # no agent connection: suspicious; the server answers
        assert (lost.state, lost.reason) == (State.UNKNOWN, "no_evidence")
        assert "[kubernetes]" in lost.message
        world.connect(world.server_port)
        healthy = await check.run()
        assert (healthy.state, healthy.reason) == (State.OK, "ok"), healthy.message
        assert world.lease_reads() == 0
    finally:
        await check.close()
