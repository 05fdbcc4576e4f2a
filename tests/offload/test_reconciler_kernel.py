"""The link-event reconciler against a real kernel: a re-created interface and a feature
turned back on by hand are both corrected on the link event, without any recheck, and
counted with cause ``link_event``. Runs in-process; the enforcer's ioctls and its
rtnetlink listener run inside the test's namespace."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from edgeheal.boundaries.kernel.ethtool import Feature
from edgeheal.checks.offload.enforcer import DRIFT_EVENT, Enforcer
from edgeheal.lab import netns
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


# --- the rename race (issue 18) ---------------------------------------------------------------
# A hot-plugged NIC appears as eth0 and udev renames it (ens4) some 76 ms later. Here the
# rename is made by the feature source itself, at the exact point of the race, on real veths:
# deterministic, no udev needed. The QEMU bed (tests/qemu) replays it with a real PCI replug.

class RenamingSource:
    """The enforcer's real ethtool source, which renames ``old`` to ``new`` once: right after
    turning features off (``when="set"``: the read-back finds no ``old``) or right after the
    read-back (``when="read"``: the correction is made under the temporary name)."""

    def __init__(self, ns: str, old: str, new: str, when: str) -> None:
        from edgeheal.checks.offload.enforcer import _real_source  # the code under test

        self.real: Any = _real_source()
        self.ns, self.old, self.new, self.when = ns, old, new, when
        self.renamed = False
        self._armed = False

    def _rename(self) -> None:
        for argv in (["ip", "link", "set", self.old, "down"],
                     ["ip", "link", "set", self.old, "name", self.new],
                     ["ip", "link", "set", self.new, "up"]):
            netns.run(argv, ns=self.ns)
        self.renamed = True

    def interfaces(self) -> list[str]:
        return list(self.real.interfaces())

    def index(self, ifname: str) -> int:
        return int(self.real.index(ifname))

    def name(self, ifindex: int) -> str | None:
        return cast("str | None", self.real.name(ifindex))

    def features(self, ifname: str) -> Mapping[str, Feature]:
        out = cast("Mapping[str, Feature]", self.real.features(ifname))
        if self._armed and self.when == "read":
            self._armed = False
            self._rename()
        return out

    def disable(self, ifname: str, names: Iterable[str]) -> None:
        self.real.disable(ifname, names)
        if ifname == self.old and not self.renamed:
            if self.when == "set":
                self._rename()
            else:
                self._armed = True

    def close(self) -> None:
        self.real.close()


def _series(reg: CollectorRegistry, iface: str) -> list[str]:
    return [f"{s.name}{s.labels}" for m in reg.collect() for s in m.samples
            if s.labels.get("interface") == iface]


@pytest.mark.parametrize("when", ["set", "read"])
async def test_a_rename_during_the_correction_is_recorded_under_the_final_name(
        lab: Lab, when: str) -> None:
    reg, events = CollectorRegistry(), list[Event]()
    source = RenamingSource(lab.ns, "eth0", "ens4", when)
    enforcer = Enforcer(("eth*", "ens*"), CSUM, registry=reg, emit=events.append,
                        source=lambda: source, netns=lab.ns, settle=0.3)
    async with serving(enforcer):
        await until(lambda: enforcer._state.first_done, within=DEADLINE, what="boot pass")
        await asyncio.to_thread(lab.veth, "eth0", "p0", expect_on=False)  # the hot-plug
        await until(lambda: corrections(reg, "ens4", "link_event") == 1, within=DEADLINE,
                    what="the correction, recorded under ens4")
        assert source.renamed
        assert lab.checksums("ens4")["tx-checksum-ip-generic"] == (False, False)
        # the rename's own link event has been handled: nothing left under eth0
        await until(lambda: "eth0" not in enforcer._state.interfaces
                    and "ens4" in enforcer._state.interfaces, within=DEADLINE,
                    what="state under ens4 only")
        await asyncio.sleep(0.5)  # more than settle: a late record would show now
    assert _series(reg, "eth0") == []
    assert reg.get_sample_value("edgeheal_offload_feature_enabled",
                                {"interface": "ens4", "feature": "tx-checksum-ip-generic"}) == 0
    assert [(e.kind, e.detail["interface"]) for e in events] == [(DRIFT_EVENT, "ens4")]
    assert [d.interface for d in enforcer.take_drift()] == ["ens4"]
    assert enforcer.drift_total == 1


async def test_a_rename_to_an_unmanaged_name_drops_the_temporary_name(lab: Lab) -> None:
    """eth0 matched, its final name does not: its gauges and state go, the correction made
    on it is still counted (under the name it has now)."""
    reg = CollectorRegistry()
    enforcer = Enforcer(("eth*",), CSUM, registry=reg, netns=lab.ns, settle=0.3)
    async with serving(enforcer):
        await until(lambda: enforcer._state.first_done, within=DEADLINE, what="boot pass")
        await asyncio.to_thread(lab.veth, "eth0", "p0", expect_on=False)
        await until(lambda: "eth0" in enforcer._state.interfaces, within=DEADLINE,
                    what="eth0 corrected")
        for argv in (["ip", "link", "set", "eth0", "down"],
                     ["ip", "link", "set", "eth0", "name", "wan7"]):
            await asyncio.to_thread(netns.run, argv, ns=lab.ns)
        await until(lambda: not enforcer._state.interfaces, within=DEADLINE,
                    what="eth0 forgotten")
        await asyncio.sleep(0.5)
    assert reg.get_sample_value("edgeheal_offload_feature_enabled",
                                {"interface": "eth0", "feature": "tx-checksum-ip-generic"}) is None
    assert corrections(reg, "eth0", "link_event") == 0
    assert corrections(reg, "wan7", "link_event") == 1
