"""The agent's rtnetlink reads cost the same on a node with hundreds of links as on a bare one.

Why: on a K3s node every pod adds a veth with an address and a route. A read that dumps
every link or address and picks one out parses all of them into pyroute2 objects; the
WireGuard check's egress lookup did so once a minute (after every tunnel probe's quiet) and
grew every agent by ~1 MB a minute, to 63-66 MB with 48 extra links (docs/footprint.md).
These tests measure what one read allocates at its peak (``tracemalloc``, in this process:
the reads are the agent's own code) in a namespace with one uplink, then again after 150
veth pairs with addresses and routes are added, and fail if the second is more than a
small margin above the first. A dump of 300 links costs about 1 MB more than that margin.
"""

from __future__ import annotations

import ipaddress
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

from edgeheal.boundaries.kernel import interfaces
from edgeheal.boundaries.wg.egress import Egress
from edgeheal.lab.netns import Sandbox, run

PAIRS = 150
SLACK = 96 * 1024
"""Bytes the peak may grow by: a margin for the allocator's noise, a tenth of what a dump of
the clutter costs."""


def _uplink(ns: str) -> None:
    run(["ip", "-batch", "-"], ns=ns, timeout=30, input="\n".join([
        "link set lo up", "link add ehup0 type veth peer name ehup1",
        "link set ehup0 up", "link set ehup1 up", "addr add 10.200.0.1/24 dev ehup0",
        "route add default via 10.200.0.2 dev ehup0"]) + "\n")


def _clutter(ns: str, pairs: int) -> None:
    lines = []
    for i in range(pairs):
        lines += [f"link add ehpod{i} type veth peer name ehcni{i}", f"link set ehpod{i} up",
                  f"link set ehcni{i} up", f"addr add 10.99.{i}.1/24 dev ehpod{i}",
                  f"route add 10.98.{i}.0/24 via 10.99.{i}.2 dev ehpod{i} onlink"]
    run(["ip", "-batch", "-"], ns=ns, timeout=120, input="\n".join(lines) + "\n")


async def _peak(call: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    """Bytes one call allocates at its peak above what was allocated before it (after one
    warm-up call, so the lazy imports and first-use caches are not counted)."""
    await call()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = await call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before, result


async def test_the_egress_diagnosis_does_not_grow_with_the_nodes_links(sandbox: Sandbox) -> None:
    ns = sandbox.netns("gr")
    _uplink(ns)
    egress = Egress(netns=ns)
    endpoint = ipaddress.ip_address("10.200.0.50")

    def diagnose() -> Awaitable[Any]:
        return egress.diagnose(endpoint, source="10.200.0.1")

    bare, first = await _peak(diagnose)
    _clutter(ns, PAIRS)
    cluttered, second = await _peak(diagnose)
    for found in (first, second):  # the same answer, from the same one link
        assert found.cause == "local", found
        assert found.detail["link"] == {"name": "ehup0", "oper_state": "UP", "addresses": 1}
    assert cluttered <= bare + SLACK, (
        f"one diagnosis allocates {cluttered} B at its peak with {2 * PAIRS} more links, "
        f"{bare} B without: it reads every link or address")


async def test_the_uplink_read_does_not_grow_with_the_nodes_links(sandbox: Sandbox) -> None:
    ns = sandbox.netns("gr")
    _uplink(ns)

    def read() -> Awaitable[Any]:
        return interfaces.read(("ehup*",), netns=ns, names=("ehup0", "ehup1"))

    bare, first = await _peak(read)
    _clutter(ns, PAIRS)
    cluttered, second = await _peak(read)
    assert [i.name for i in first] == [i.name for i in second]
    up = {i.name: i for i in second}
    assert set(up) == {"ehup0", "ehup1"}
    assert up["ehup0"].addresses == ("10.200.0.1",)
    assert up["ehup0"].default_route
    assert not up["ehup1"].addresses
    assert not up["ehup1"].default_route
    assert cluttered <= bare + SLACK, (
        f"one uplink read allocates {cluttered} B at its peak with {2 * PAIRS} more links, "
        f"{bare} B without: it reads every link, address or route")


async def test_the_uplink_read_without_names_still_finds_the_interfaces(
        sandbox: Sandbox) -> None:
    """Without sysfs's names (another namespace), or with names that do not exist here, the
    read falls back to listing every link: the answer is the same."""
    ns = sandbox.netns("gr")
    _uplink(ns)
    for names in (None, ("ehgone0",)):
        found = {i.name: i for i in await interfaces.read(("ehup*",), netns=ns, names=names)}
        assert sorted(found) == ["ehup0", "ehup1"]
        assert found["ehup0"].default_route
        assert found["ehup0"].addresses == ("10.200.0.1",)
