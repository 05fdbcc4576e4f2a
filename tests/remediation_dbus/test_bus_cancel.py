"""A cancel that meets a D-Bus connect or call just as it fails is never swallowed.

``asyncio.wait_for`` before Python 3.12 returns the inner result (or raises its error) when
the cancel arrives after the inner awaitable finished but before the waiter resumed
(python/cpython#86296). The remediation actor probes the k3s-service remedy at start; an
agent told to stop at that moment converted the cancel into "cannot connect", went on, and
left its ``edgeheal.remediation`` task running after the stop (seen as a leaked task in
tests/agent/test_snapshot_feed.py on a loaded machine). No bus is needed: the socket is
absent, so the connect fails at once, which is the race's window."""

from __future__ import annotations

import asyncio
from pathlib import Path

from edgeheal.boundaries import bus


async def test_a_cancel_during_a_failing_connect_always_cancels(tmp_path: Path) -> None:
    address = f"unix:path={tmp_path}/no-bus-here"
    outcomes: dict[int, list[str]] = {}
    for spins in range(8):  # cancel after 0..7 loop turns: before, during and after the failure
        for _ in range(5):
            task = asyncio.create_task(bus.open_bus(address, limit=5.0))
            for _ in range(spins):
                await asyncio.sleep(0)
            if task.done():  # failed before the cancel: nothing to swallow
                task.exception()
                continue
            task.cancel()
            try:
                await task
                outcome = "connected"
            except asyncio.CancelledError:
                outcome = "cancelled"
            except bus.BusError as err:
                outcome = f"BusError: {err}"
            outcomes.setdefault(spins, []).append(outcome)
    swallowed = {s: o for s, o in outcomes.items() if set(o) != {"cancelled"}}
    assert not swallowed, swallowed
