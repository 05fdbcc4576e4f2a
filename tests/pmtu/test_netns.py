"""The pmtu check and its MSS clamp against a real kernel: three namespaces (edge, carrier,
cloud), the edge's "tunnel" device at 1420 bytes, a carrier whose link silently drops
packets over 1300 bytes and every ICMP "fragmentation needed" (nftables), and a plain TCP
listener in the cloud (the kernel's ACK is what the probe waits for). The lab's
``pmtu-blackhole`` scenario runs the same fault under real WireGuard."""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from edgeheal.boundaries.kernel import nftables
from edgeheal.boundaries.kernel.segment_probe import SIOCOUTQ, device_mtu
from edgeheal.checks.pmtu import PmtuCheck
from edgeheal.lab.netns import Sandbox, run
from edgeheal.lab.nsutil import inside
from edgeheal.model import CheckResult, State
from tests.support import context

T = TypeVar("T")
FAULT = "table inet ehpmtufault"


@pytest.fixture
def world(sandbox: Sandbox) -> Iterator[dict[str, Any]]:
    edge, carrier, cloud = sandbox.netns("e"), sandbox.netns("c"), sandbox.netns("k")
    tun, _ = sandbox.veth(edge, carrier, addr_a="10.77.1.2/24", addr_b="10.77.1.1/24")
    sandbox.veth(carrier, cloud, addr_a="10.77.2.1/24", addr_b="10.77.2.2/24")
    run(["ip", "link", "set", tun, "mtu", "1420"], ns=edge)
    run(["ip", "route", "add", "default", "via", "10.77.1.1"], ns=edge)
    run(["ip", "route", "add", "default", "via", "10.77.2.1"], ns=cloud)
    run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns=carrier)
    with inside(cloud):
        listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("10.77.2.2", 1883))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # keep the connections open, never read: the kernel ACKs
        listener.settimeout(0.2)
        for _ in range(3000):
            if stop.is_set():
                return
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield {"edge": edge, "carrier": carrier, "tun": tun}
    finally:
        stop.set()
        thread.join(2)
        for conn in accepted:
            conn.close()
        listener.close()


def fault(sandbox: Sandbox, carrier: str, on: bool) -> None:
    if on:
        sandbox.nft(carrier, FAULT + " {\n chain small { type filter hook forward priority 0;\n"
                    "  ip length > 1300 drop\n"
                    "  icmp type destination-unreachable icmp code frag-needed drop\n }\n}\n")
    else:
        run(["nft", "delete", FAULT], ns=carrier)


def in_ns(ns: str, make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a loop of its own in a thread inside ``ns`` (sockets made there
    stay there)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def body() -> None:
        with inside(ns):
            try:
                out.append(asyncio.run(make()))  # type: ignore[arg-type]
            except BaseException as err:
                errors.append(err)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(60)
    if errors:
        raise errors[0]
    assert out, "the coroutine in the namespace did not finish"
    return out[0]


def bulk_passes(ns: str, size: int = 20000, within: float = 3.0) -> bool:
    """A fresh TCP connection from ``ns`` writes ``size`` bytes: all acknowledged in time?"""
    with inside(ns):
        sock = socket.create_connection(("10.77.2.2", 1883), timeout=3)
    with sock:
        sock.sendall(b"\x00" * size)
        deadline = time.monotonic() + within
        for _ in range(int(within / 0.05) + 2):
            left = struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0" * 4))[0]
            if left == 0:
                return True
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False


def clamp_table(ns: str) -> dict[str, Any] | None:
    with inside(ns):
        return nftables.installed()


def make_check(tun: str, clamp: bool) -> PmtuCheck:
    harness = context(f'[pmtu]\ntarget = "10.77.2.2:1883"\ninterface = "{tun}"\n'
                      f'wait = "1s"\nclamp = {"true" if clamp else "false"}\n')
    return PmtuCheck(harness.ctx)


def test_a_black_hole_is_found_bounded_and_the_opt_in_clamp_cures_new_connections(
        sandbox: Sandbox, world: dict[str, Any]) -> None:
    edge, carrier, tun = world["edge"], world["carrier"], world["tun"]
    with inside(edge):
        assert device_mtu(tun) == 1420
        assert device_mtu("nosuchdev0") is None
    check = make_check(tun, clamp=True)

    healthy: CheckResult = in_ns(edge, check.run)
    assert (healthy.state, healthy.reason) == (State.OK, "ok"), healthy.message
    assert healthy.detail["probes"] == [{"size": 1420, "passed": True}]
    assert clamp_table(edge) is None  # health costs no nftables at all

    fault(sandbox, carrier, True)
    assert not bulk_passes(edge)  # the black hole: a large write hangs
    started = time.monotonic()
    found: CheckResult = in_ns(edge, check.run)
    took = time.monotonic() - started
    assert (found.state, found.reason) == (State.DEGRADED, "clamped"), found.message
    assert found.detail["largest_passed"] == 1296
    assert found.detail["smallest_lost"] == 1304
    assert found.detail["clamp"] == 1296
    assert len(found.detail["probes"]) <= 9
    assert took < 9 * 1.0 + 3, took  # bounded: a lost size costs `wait`
    assert clamp_table(edge) is not None
    assert bulk_passes(edge)  # new connections fit under the clamp

    # the doubt's second run: the probe's own connection is exempt, so it still sees the
    # black hole at full size, and confirms the hint in two more probes
    again: CheckResult = in_ns(edge, check.run)
    assert again.reason == "clamped", again.detail
    assert len(again.detail["probes"]) == 3, again.detail

    fault(sandbox, carrier, False)
    healed: CheckResult = in_ns(edge, check.run)
    assert (healed.state, healed.reason) == (State.OK, "ok"), healed.message
    assert clamp_table(edge) is None  # removed when the full size passes again

    fault(sandbox, carrier, True)
    assert in_ns(edge, check.run).reason == "clamped"

    async def stop() -> None:
        await check.close()
    in_ns(edge, stop)
    assert clamp_table(edge) is None  # the agent's stop takes the clamp with it


def test_without_the_clamp_the_black_hole_fails_and_nothing_is_installed(
        sandbox: Sandbox, world: dict[str, Any]) -> None:
    fault(sandbox, world["carrier"], True)
    result: CheckResult = in_ns(world["edge"], make_check(world["tun"], clamp=False).run)
    assert (result.state, result.reason) == (State.FAILED, "pmtu_blackhole"), result.message
    assert result.detail["largest_passed"] == 1296
    assert clamp_table(world["edge"]) is None
    missing = make_check("nosuchdev0", clamp=False)
    assert in_ns(world["edge"], missing.run).reason == "interface_missing"
    refused = in_ns(world["edge"], PmtuCheck(context(
        f'[pmtu]\ntarget = "10.77.2.2:9"\ninterface = "{world["tun"]}"\nwait = "1s"\n').ctx).run)
    assert refused.reason == "unreachable"
    assert refused.state is State.UNKNOWN
