"""The link-event reconciler against a real kernel: a re-created interface and a feature
turned back on by hand are both corrected on the link event, without any recheck, and
counted with cause ``link_event``. Runs in-process; the enforcer's ioctls and its
rtnetlink listener run inside the test's namespace."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from edgeheal.enforce import DRIFT_EVENT, Enforcer
from edgeheal.model import Event
from tests.offload.conftest import Lab
from tests.offload.helpers import CSUM, set_feature
from tests.support import until

pytestmark = pytest.mark.netns

DEADLINE = 10.0  # generous: the target is 2 s, typical is milliseconds


@contextlib.asynccontextmanager
async def serving(enforcer: Enforcer) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(enforcer.serve(), name="test.offload.serve")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await enforcer.close()


def corrections(reg: CollectorRegistry, iface: str, cause: str) -> float:
    return reg.get_sample_value("edgeheal_offload_corrections_total",
                                {"interface": iface, "cause": cause}) or 0.0


async def test_recreated_interface_and_manual_change_are_corrected_on_the_event(
        lab: Lab) -> None:
    lab.veth("wwan0", "peer0")
    reg, events = CollectorRegistry(), list[Event]()
    enforcer = Enforcer(("wwan*",), CSUM, registry=reg, emit=events.append, netns=lab.ns)

    def off() -> bool:
        return lab.checksums("wwan0")["tx-checksum-ip-generic"] == (False, False)

    async with serving(enforcer) as task:
        await until(lambda: corrections(reg, "wwan0", "boot") == 1, within=DEADLINE,
                    what="boot pass")
        assert off()

        # the modem re-enumerates: the interface comes back, offload on
        await asyncio.to_thread(lab.delete, "wwan0")
        await asyncio.to_thread(lab.veth, "wwan0", "peer0", expect_on=False)
        await until(lambda: corrections(reg, "wwan0", "link_event") == 1, within=DEADLINE,
                    what="re-created wwan0 corrected")
        assert off()

        # someone turns it back on by hand
        await asyncio.to_thread(set_feature, lab.ns, "wwan0", "tx-checksum-ip-generic", "on")
        await until(lambda: corrections(reg, "wwan0", "link_event") == 2, within=DEADLINE,
                    what="manual change corrected")
        assert off()
        assert not task.done()

    assert corrections(reg, "wwan0", "recheck") == 0
    assert [e.kind for e in events] == [DRIFT_EVENT, DRIFT_EVENT]
    assert all(isinstance(e, Event) and e.detail["cause"] == "link_event" for e in events)
    assert enforcer.drift_total == 2


async def test_an_interface_that_appears_later_is_fixed_at_once(lab: Lab) -> None:
    reg = CollectorRegistry()
    enforcer = Enforcer(("wwan*",), CSUM, registry=reg, netns=lab.ns)
    async with serving(enforcer):
        await until(lambda: enforcer._state.first_done, within=DEADLINE,
                    what="boot pass done")
        await asyncio.to_thread(lab.veth, "wwan3", "peer3", expect_on=False)
        await until(lambda: corrections(reg, "wwan3", "link_event") == 1, within=DEADLINE,
                    what="late interface corrected")
        assert lab.checksums("wwan3")["tx-checksum-ip-generic"] == (False, False)
        assert lab.checksums("peer3")["tx-checksum-ip-generic"] == (True, False)
