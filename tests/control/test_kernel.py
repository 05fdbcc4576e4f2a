"""The control check's kernel evidence against a real kernel: two namespaces joined by a
veth, a K3s "server" listener in one, the "agent's" connection from the other; then the
server's side drops everything (nftables), and the kernel's own TCP table shows the
connection stall — unacknowledged bytes, retransmits in a row — and the direct handshake
times out."""

from __future__ import annotations

import asyncio
import socket
import time

from edgeheal.boundaries.kernel import tcp_sockets
from edgeheal.checks.control.verdict import Local, suspicious
from edgeheal.lab.netns import Sandbox
from edgeheal.lab.nsutil import inside
from tests.support import until

SERVER = ("10.79.1.1", 6443)
DROP = """table inet ehctlfault {
  chain input { type filter hook input priority 0; tcp dport 6443 drop; }
}"""


def table_in(ns: str) -> list[tcp_sockets.Socket]:
    with inside(ns):
        return tcp_sockets.table("/proc/thread-self/net")


async def test_a_stalled_connection_shows_in_the_kernel_table(sandbox: Sandbox) -> None:
    edge, cloud = sandbox.netns("e"), sandbox.netns("s")
    sandbox.veth(edge, cloud, addr_a="10.79.1.2/24", addr_b="10.79.1.1/24")
    with inside(cloud):
        listener = socket.socket()
    listener.bind(SERVER)
    listener.listen(8)
    with inside(edge):
        agent = socket.socket()
    agent.settimeout(5.0)
    served: socket.socket | None = None
    try:
        agent.connect(SERVER)
        served, _ = listener.accept()
        mine = agent.getsockname()
        rows = tcp_sockets.to(table_in(edge), [SERVER])
        (row,) = [r for r in rows if r.local == mine]
        assert (row.state, row.unacked, row.retransmits) == ("established", 0, 0)
        assert tcp_sockets.to(table_in(cloud), [SERVER]) == []  # the other end's view
        local = Local(tuple(rows), False, 0, "ok", 3)
        assert suspicious(local) == ""
        assert "10.79.1.2" in await asyncio.to_thread(
            lambda: _addresses_in(edge))

        sandbox.nft(cloud, DROP)
        agent.send(b"x" * 2000)
        stalled = await until(
            lambda: [r for r in tcp_sockets.to(table_in(edge), [SERVER]) if r.local == mine],
            holds=lambda found: found and found[0].retransmits >= 3, within=30.0,
            every=0.2, what="three retransmits in a row")
        assert stalled[0].unacked == 2000
        local = Local(tuple(stalled), False, 0, "ok", 3)
        assert "stalled" in suspicious(local)

        with inside(edge):
            started = time.monotonic()
            said = await tcp_sockets.handshake(*SERVER, timeout=1.0)
        assert said == "timeout"
        assert time.monotonic() - started < 10.0  # 1 s, with a busy machine's slack
    finally:
        if served is not None:
            served.close()
        agent.close()
        listener.close()


def _addresses_in(ns: str) -> frozenset[str]:
    with inside(ns):
        return tcp_sockets.local_addresses("/proc/thread-self/net")


async def test_a_refused_handshake_names_its_errno(sandbox: Sandbox) -> None:
    edge, cloud = sandbox.netns("e"), sandbox.netns("s")
    sandbox.veth(edge, cloud, addr_a="10.79.2.2/24", addr_b="10.79.2.1/24")
    with inside(edge):
        said = await tcp_sockets.handshake("10.79.2.1", 6443, timeout=3.0)
    assert said == "ECONNREFUSED"
