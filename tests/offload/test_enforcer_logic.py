"""The reconciler's bookkeeping over a recorded feature set: the first pass is ``boot``,
every later correction is drift (counted by cause, logged, emitted once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from edgeheal.checks import Serving
from edgeheal.checks import offload as offload_check
from edgeheal.checks.offload.enforcer import DRIFT_EVENT, Enforcer
from edgeheal.model import Event, State
from tests.offload.helpers import CSUM, FixtureSource, fixture
from tests.support import context, until


def _corrections(reg: CollectorRegistry, iface: str, cause: str) -> float:
    return reg.get_sample_value("edgeheal_offload_corrections_total",
                                {"interface": iface, "cause": cause}) or 0.0


def _enabled(reg: CollectorRegistry, iface: str, feature: str) -> float | None:
    return reg.get_sample_value("edgeheal_offload_feature_enabled",
                                {"interface": iface, "feature": feature})


async def test_first_pass_is_boot_and_later_corrections_are_drift() -> None:
    source = FixtureSource({"wwan0": fixture("qeth"), "eth0": fixture("virtio_net")})
    reg, events = CollectorRegistry(), list[Event]()
    enforcer = Enforcer(("wwan*",), CSUM, registry=reg, emit=events.append,
                        source=lambda: source)
    try:
        await enforcer.reconcile("recheck")  # the first pass is boot whatever the caller
        assert _corrections(reg, "wwan0", "boot") == 1
        for cause in ("link_event", "recheck"):  # exist at 0: increase() sees the first
            assert reg.get_sample_value("edgeheal_offload_corrections_total",
                                        {"interface": "wwan0", "cause": cause}) == 0
        assert reg.get_sample_value("edgeheal_offload_corrections_total",
                                    {"interface": "eth0", "cause": "boot"}) is None
        assert _enabled(reg, "wwan0", "tx-checksum-ipv4") == 0
        assert _enabled(reg, "eth0", "tx-checksum-ip-generic") is None  # not configured
        assert events == []
        assert enforcer.take_drift() == []

        source.turn_on("wwan0", "tx-checksum-ipv4")
        await enforcer.reconcile("link_event", only="wwan0")
        assert _corrections(reg, "wwan0", "link_event") == 1
        (drift,) = enforcer.take_drift()
        assert (drift.interface, drift.features, drift.cause) == (
            "wwan0", ("tx-checksum-ipv4",), "link_event")
        assert enforcer.take_drift() == []  # reported once
        (event,) = events
        assert isinstance(event, Event)
        assert event.kind == DRIFT_EVENT
        assert event.detail["interface"] == "wwan0"

        source.turn_on("wwan0", "tx-checksum-ipv4")
        await enforcer.reconcile("recheck")
        assert _corrections(reg, "wwan0", "recheck") == 1
        assert enforcer.drift_total == 2
    finally:
        await enforcer.close()


async def test_observe_only_changes_nothing_and_exports_the_feature_as_on() -> None:
    source = FixtureSource({"wwan0": fixture("veth")})
    reg = CollectorRegistry()
    enforcer = Enforcer(("wwan0",), CSUM, enforce=False, registry=reg, source=lambda: source)
    try:
        await enforcer.reconcile("recheck")
        assert source.disabled == []
        assert _enabled(reg, "wwan0", "tx-checksum-ip-generic") == 1
    finally:
        await enforcer.close()


async def test_an_interface_that_goes_away_drops_its_series() -> None:
    source = FixtureSource({"wwan0": fixture("veth")})
    reg = CollectorRegistry()
    enforcer = Enforcer(("wwan0",), CSUM, registry=reg, source=lambda: source)
    try:
        await enforcer.reconcile("recheck")
        assert _enabled(reg, "wwan0", "tx-checksum-ip-generic") == 0
        del source.state["wwan0"]
        await enforcer.reconcile("recheck")
        assert _enabled(reg, "wwan0", "tx-checksum-ip-generic") is None
    finally:
        await enforcer.close()


def test_no_interfaces_configured_means_no_check() -> None:
    assert offload_check._factory(context("[offload]\ninterfaces = []\n").ctx) == []


async def test_the_check_serves_the_reconciler_and_reports_through_the_table() -> None:
    (check,) = offload_check._factory(context('[offload]\ninterfaces = ["wwan*"]\n').ctx)
    assert check.name == "offload"
    assert isinstance(check, Serving)
    assert isinstance(check, offload_check.OffloadCheck)
    source = FixtureSource({"wwan0": fixture("veth")})
    check.enforcer._make_source = lambda: source
    try:
        result = await check.run()
        assert (result.state, result.reason) == (State.OK, "ok")
        assert result.detail["interfaces"]["wwan0"]["tx-checksum-ip-generic"] == "changed"
        source.turn_on("wwan0", "tx-checksum-ip-generic")
        result = await check.run()
        assert (result.state, result.reason) == (State.OK, "drift_corrected")
        result = await check.run()
        assert result.reason == "ok"
    finally:
        await check.close()


class _Indexed(FixtureSource):
    """Recorded features, with ifindexes, and a rename as udev does it."""

    def __init__(self, interfaces: dict[str, int]) -> None:
        super().__init__({name: fixture("qeth") for name in interfaces})
        self.indexes = dict(interfaces)

    def index(self, ifname: str) -> int:
        return self.indexes.get(ifname, 0)

    def name(self, ifindex: int) -> str | None:
        return next((n for n, i in self.indexes.items() if i == ifindex), None)

    def rename(self, old: str, new: str) -> None:
        self.state[new], self.indexes[new] = self.state.pop(old), self.indexes.pop(old)


async def test_a_hot_plug_is_recorded_once_udev_has_renamed_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """udev busy with the link past ``settle`` (a loaded box): the record waits, then names
    the final interface; nothing is counted under the kernel's temporary name."""
    from edgeheal.checks.offload import enforcer as module

    busy = {7}
    monkeypatch.setattr(module, "udev_busy_with", lambda ifindex: ifindex in busy)
    source = _Indexed({"wwan0": 3})
    reg, events = CollectorRegistry(), list[Event]()
    enforcer = Enforcer(("wwan*", "eth*"), CSUM, registry=reg, emit=events.append,
                        source=lambda: source, settle=0.05)
    try:
        await enforcer.reconcile("boot")
        source.state["eth0"], source.indexes["eth0"] = fixture("qeth"), 7  # plugged in
        source.turn_on("eth0", "tx-checksum-ipv4")
        await enforcer.reconcile("link_event", only="eth0", defer=True)
        await asyncio.sleep(0.3)  # six settle periods: udev still busy, nothing recorded
        assert events == []
        source.rename("eth0", "wwan1")
        await enforcer.reconcile("link_event", only="wwan1", defer=True)  # the rename event
        busy.clear()  # then udev writes the link's database entry
        await until(lambda: len(events) == 1, within=5.0, what="the deferred record")
        assert events[0].detail["interface"] == "wwan1"
        assert _corrections(reg, "wwan1", "link_event") == 1
        assert _corrections(reg, "eth0", "link_event") == 0
    finally:
        await enforcer.close()


async def test_a_rename_whose_event_is_not_read_yet_is_recorded_under_the_final_name() -> None:
    """A busy box: the rename's link event is still unread when the record is due. The
    record asks the kernel for the ifindex's name now, so it names the final interface."""
    source = _Indexed({"wwan0": 3})
    reg, events = CollectorRegistry(), list[Event]()
    enforcer = Enforcer(("wwan*", "eth*"), CSUM, registry=reg, emit=events.append,
                        source=lambda: source, settle=0.05)
    try:
        await enforcer.reconcile("boot")
        source.state["eth0"], source.indexes["eth0"] = fixture("qeth"), 7  # plugged in
        source.turn_on("eth0", "tx-checksum-ipv4")
        await enforcer.reconcile("link_event", only="eth0", defer=True)
        source.rename("eth0", "wwan1")  # udev renamed it; no event handled
        await until(lambda: len(events) == 1, within=5.0, what="the deferred record")
        assert events[0].detail["interface"] == "wwan1"
        assert _corrections(reg, "wwan1", "link_event") == 1
        assert _corrections(reg, "eth0", "link_event") == 0
        assert _enabled(reg, "eth0", "tx-checksum-ipv4") is None
    finally:
        await enforcer.close()


def test_udev_is_busy_only_where_it_runs_and_has_not_written_the_link(tmp_path: Path) -> None:
    from edgeheal.boundaries.kernel.link_events import udev_busy_with

    assert udev_busy_with(5, tmp_path) is False  # no udevd here (a container)
    (tmp_path / "control").touch()
    assert udev_busy_with(5, tmp_path) is True  # udevd runs, no entry for link 5 yet
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "n5").touch()
    assert udev_busy_with(5, tmp_path) is False
    assert udev_busy_with(6, tmp_path) is True
