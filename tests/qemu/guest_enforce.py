"""Runs inside the QEMU guest (tests/qemu): the offload enforcer serving link events on the
guest's real NICs, its state written to a JSON file every 100 ms for the host test to read.
Usage: ``python3 guest_enforce.py OUT PATTERN...`` (runs until killed)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from typing import Any

from prometheus_client import CollectorRegistry

from edgeheal.checks.offload.enforcer import Enforcer
from edgeheal.model import Event

CSUM = ("tx-checksum-ipv4", "tx-checksum-ip-generic", "tx-checksum-ipv6")


def samples(reg: CollectorRegistry) -> list[list[Any]]:
    return [[s.name, s.labels, s.value] for m in reg.collect() for s in m.samples
            if s.name.startswith("edgeheal_offload")]


def write(out: str, state: dict[str, Any]) -> None:
    with open(out + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(out + ".tmp", out)


async def main(out: str, patterns: tuple[str, ...]) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    reg, events = CollectorRegistry(), list[Event]()
    enforcer = Enforcer(patterns, CSUM, registry=reg, emit=events.append)
    task = asyncio.create_task(enforcer.serve())
    while not task.done():
        state = {
            "samples": samples(reg),
            "events": [e.detail for e in events],
            "interfaces": {n: {r.feature: r.outcome.value for r in i.results} | (
                {"error": i.message} if i.error else {})
                for n, i in enforcer._state.interfaces.items()},
            "ifindex": {n: i.ifindex for n, i in enforcer._state.interfaces.items()},
            "drift_total": enforcer.drift_total,
        }
        write(out, state)
        await asyncio.sleep(0.1)
    await task


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], tuple(sys.argv[2:])))
