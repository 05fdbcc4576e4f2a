"""The capture's kernel filter against a real veth: only UDP on the listen ports passes."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterator

import pytest

from edgeheal.lab.netns import Sandbox, run
from edgeheal.lab.nsutil import inside
from edgeheal.tools.diagnose import attach_filter, link_down

pytestmark = pytest.mark.netns

ETH_P_ALL = 0x0003
PORT = 51820


@pytest.fixture
def pair() -> Iterator[tuple[str, str, str]]:
    sandbox = Sandbox()
    try:
        a, b = sandbox.netns("fa"), sandbox.netns("fb")
        va, vb = sandbox.veth(a, b, addr_a="10.77.0.1/24", addr_b="10.77.0.2/24")
        run(["ip", "-6", "addr", "add", "fd77::1/64", "dev", va, "nodad"], ns=a)
        run(["ip", "-6", "addr", "add", "fd77::2/64", "dev", vb, "nodad"], ns=b)
        yield a, b, va
    finally:
        sandbox.close()


def test_the_filter_passes_udp_on_the_listen_port_either_way_and_nothing_else(
        pair: tuple[str, str, str]) -> None:
    ns, _, uplink = pair
    with inside(ns):
        # protocol 0: nothing is queued until bind(), so no frame slips in unfiltered
        tap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        udp4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        from_port = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    socks = [tap, udp4, from_port, udp6, tcp]
    try:
        attach_filter(tap, [PORT, PORT + 7])
        tap.bind((uplink, ETH_P_ALL))  # CPython applies htons() itself
        from_port.bind(("10.77.0.1", PORT))
        sends = [  # (tag, socket, destination, should pass)
            (b"drop-v4-other-port", udp4, ("10.77.0.2", PORT + 1), False),
            (b"pass-v4-dport", udp4, ("10.77.0.2", PORT), True),
            (b"pass-v4-second-port", udp4, ("10.77.0.2", PORT + 7), True),
            (b"pass-v4-sport", from_port, ("10.77.0.2", 9999), True),
            (b"drop-v6-other-port", udp6, ("fd77::2", PORT + 1), False),
            (b"pass-v6-dport", udp6, ("fd77::2", PORT), True),
        ]
        for tag, sock, dest, _ in sends:
            sock.sendto(tag, dest)
        tcp.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            tcp.connect(("10.77.0.2", PORT))  # a TCP SYN to the port: not UDP, dropped
        udp4.sendto(b"pass-marker", ("10.77.0.2", PORT))  # sent last: once seen, all is
        seen: list[bytes] = []
        deadline = time.monotonic() + 10
        while not any(b"pass-marker" in f for f in seen) and time.monotonic() < deadline:
            ready, _, _ = select.select([tap], [], [], 0.5)
            if ready:
                seen.append(tap.recv(65535))
        tags = {tag for tag, *_ in sends if any(tag in frame for frame in seen)}
        assert tags == {tag for tag, _, _, passes in sends if passes}
        assert len(seen) == 5, "no ARP, ND or TCP frame passed the filter"
    finally:
        for sock in socks:
            sock.close()


def test_the_link_state_reads_up_down_and_no_carrier(pair: tuple[str, str, str]) -> None:
    ns, peer_ns, uplink = pair
    peer_if = run(["ip", "-o", "link", "show", "type", "veth"], ns=peer_ns).stdout
    peer_if = peer_if.split(":")[1].strip().split("@")[0]

    def state() -> str | None:
        with inside(ns):
            return link_down(uplink)

    assert state() is None
    with inside(ns):
        assert link_down("ehnosuchif0") is None  # absent: not for this function to judge
    run(["ip", "link", "set", peer_if, "down"], ns=peer_ns)
    deadline = time.monotonic() + 5  # the kernel's link watch reports carrier lazily
    while state() != "no carrier" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state() == "no carrier"
    run(["ip", "link", "set", uplink, "down"], ns=ns)
    assert state() == "down"
