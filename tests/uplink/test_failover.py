"""Uplink failover: which interface carries the default route, a switch and its cause,
the event, ``detail.active``, the metrics, the tunnel check re-learning its source
address, the settings' rules; then the same against a real kernel, woken by rtnetlink."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edgeheal import settings
from edgeheal.base import compat
from edgeheal.boundaries.kernel import interfaces as ifstate
from edgeheal.boundaries.kernel.interfaces import Interface
from edgeheal.boundaries.kernel.route_events import RouteEvent, RouteListener
from edgeheal.checks import uplink_failover as fo
from edgeheal.checks import wireguard as wgcheck
from edgeheal.checks.uplink import KINDS, UplinkCheck
from edgeheal.config import ConfigError, UplinkCost
from edgeheal.lab.netns import Sandbox, run
from edgeheal.model import CheckStatus, Snapshot, State
from tests.support import Clock, context, until
from tests.wireguard.test_check import CLOUD, EDGE2, FakeEgress, FakeReader, counters, untranslated
from tests.wireguard.test_check import TOML as WG_TOML


def nic(name: str, index: int, *, metric: int | None = 100, carrier: bool = True,
        admin: bool = True, addresses: tuple[str, ...] = ("192.0.2.2",)) -> Interface:
    return Interface(name=name, index=index, oper="UP" if carrier and admin else "DOWN",
                     admin_up=admin, carrier=carrier, addresses=addresses,
                     default_route=metric is not None, rx_packets=1, tx_packets=1,
                     route_metric=metric)


ETH, LTE = nic("eth0", 2, metric=100), nic("wwan0", 3, metric=700)
COSTS = (UplinkCost("wwan*", 200),)


@pytest.mark.parametrize(("seen", "expected"), [
    ((ETH, LTE), ("eth0", 0)),
    ((replace(ETH, route_metric=900), LTE), ("wwan0", 200)),  # the kernel's choice wins
    ((replace(ETH, carrier=False), LTE), ("wwan0", 200)),     # a linkdown route is skipped
    ((replace(ETH, addresses=()), LTE), ("wwan0", 200)),
    ((nic("eth0", 2, metric=None), LTE), ("wwan0", 200)),
    ((replace(ETH, route_metric=700), LTE), ("eth0", 0)),     # a tie: the cheaper one
    ((replace(LTE, route_metric=100), ETH), ("eth0", 0)),
    ((nic("wwan1", 4, metric=5), nic("wwan2", 5, metric=5)), ("wwan1", 200)),  # then order
    ((replace(ETH, carrier=False), replace(LTE, default_route=False)), None),
    ((), None),
])
def test_the_active_uplink_is_the_kernels_default_route_among_usable_links(
        seen: tuple[Interface, ...], expected: tuple[str, int] | None) -> None:
    active = fo.choose(seen, COSTS)
    assert (None if active is None else (active.interface, active.cost)) == expected


@pytest.mark.parametrize(("after", "cause"), [
    (replace(ETH, carrier=False), "carrier_lost"),
    (replace(ETH, admin_up=False, carrier=False), "operator"),  # admin down beats no carrier
    (replace(ETH, addresses=()), "address_lost"),
    (replace(ETH, default_route=False, route_metric=None), "route_withdrawn"),
    (replace(ETH, index=9, carrier=False), "link_gone"),  # re-created, not up yet
    (replace(ETH, route_metric=800), "preferred"),
])
def test_a_switch_names_why_the_previous_uplink_stopped_being_active(
        after: Interface, cause: str) -> None:
    track = fo.Failover(COSTS)
    assert track.observe((ETH, LTE), 0.0) is None  # the first observation is no switch
    switch = track.observe((after, LTE), 5.0)
    assert switch is not None
    assert (switch.previous.interface, switch.active.interface, switch.cause) == (
        "eth0", "wwan0", cause)
    assert switch.cause in fo.CAUSES
    assert track.switches[cause] == 1
    assert track.count == 1


def test_a_link_that_vanished_and_the_lte_that_came_later_is_one_switch() -> None:
    track = fo.Failover(COSTS)
    track.observe((ETH, replace(LTE, default_route=False)), 0.0)
    gone = (replace(ETH, carrier=False), replace(LTE, default_route=False))
    assert track.observe(gone, 1.0) is None
    assert track.active is None
    assert track.observe(gone, 2.0) is None
    switch = track.observe((replace(ETH, carrier=False), LTE), 3.0)  # the manager's route
    assert switch is not None
    assert switch.cause == "carrier_lost"
    back = track.observe((ETH, LTE), 9.0)
    assert back is not None
    assert (back.active.interface, back.cause) == ("eth0", "preferred")
    assert track.count == 2
    # the same uplink losing and regaining its route is no switch at all
    assert track.observe((nic("eth0", 2, metric=None), replace(LTE, carrier=False)),
                         10.0) is None
    assert track.observe((ETH, LTE), 11.0) is None
    assert track.count == 2
    assert track.to_json(12.0)["since_seconds"] == 1.0


UPLINK_TOML = WG_TOML + """
[uplink]
interfaces = ["eth0", "wwan0"]
costs = [{interface = "wwan0", cost = 200}]
"""


async def test_the_check_reports_the_switch_as_an_event_and_wakes_the_tunnel_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = [(ETH, LTE)]

    async def read(patterns: tuple[str, ...], *, netns: str | None = None,
                   ) -> tuple[Interface, ...]:
        return seen[-1]

    monkeypatch.setattr(ifstate, "read", read)
    clock, hastened, registry = Clock(), [], CollectorRegistry()
    h = context(UPLINK_TOML, clock=clock)
    ctx = replace(h.ctx, hasten=hastened.append, registry=registry)
    check = UplinkCheck(ctx, ctx.config.uplink, sysfs=None)
    registry.register(check)
    result = await check.run()
    assert result.state is State.OK
    assert result.detail["active"] == {"interface": "eth0", "cost": 0, "route_metric": 100,
                                       "since_seconds": 0.0, "switches": 0,
                                       "last_switch": None}
    assert not h.events
    assert not hastened
    text = generate_latest(registry).decode()
    assert 'edgeheal_uplink_active{interface="eth0"} 1.0' in text
    assert 'edgeheal_uplink_active_cost{interface="eth0"} 0.0' in text

    seen.append((replace(ETH, carrier=False), LTE))
    clock.advance(10)
    result = await check.run()
    assert result.state is State.OK, result.message  # the LTE carries: still serving
    assert result.detail["active"]["interface"] == "wwan0"
    assert result.detail["active"]["last_switch"] == {
        "from": "eth0", "to": "wwan0", "cause": "carrier_lost", "from_cost": 0,
        "to_cost": 200}
    (event,) = h.events
    assert event.kind == "uplink.failover"
    assert event.kind in KINDS
    assert "eth0 (cost 0) -> wwan0 (cost 200): carrier_lost" in event.message
    assert hastened == ["wireguard"]  # the tunnel re-learns at once
    text = generate_latest(registry).decode()
    assert 'edgeheal_uplink_active_cost{interface="wwan0"} 200.0' in text
    assert 'edgeheal_uplink_failovers_total{cause="carrier_lost"} 1.0' in text
    assert 'edgeheal_uplink_failovers_total{cause="preferred"} 0.0' in text
    assert 'interface="eth0"' not in text


def uplink_status(clock: Clock, interface: str, switches: int) -> CheckStatus:
    return CheckStatus(name="uplink", state=State.OK, reason="ok", message="",
                       since=clock.wall(), since_mono=clock.now, required=False,
                       detail={"active": {"interface": interface, "switches": switches}})


async def test_the_tunnel_check_re_learns_its_source_address_after_a_switch() -> None:
    clock, reader, egress = Clock(), FakeReader(), FakeEgress()
    status = {"uplink": uplink_status(clock, "eth0", 0)}

    def snapshot() -> Snapshot:
        return Snapshot(node="n", checks=status, started_mono=0.0, taken_mono=clock.now)

    ctx = context(UPLINK_TOML, clock=clock, snapshot=snapshot).ctx
    check = wgcheck.WireguardCheck(ctx, reader=reader, egress=egress,  # type: ignore[arg-type]
                                   conntrack=untranslated)
    for i in range(6):
        reader.devices["flannel-wg"] = counters(clock, rx=1000 + 32 * i, tx=1000 + 32 * i)
        await check.run()
        clock.advance(5)
    learned = len(egress.learned)
    assert learned == 2  # once per endpoint, nothing more in the steady state
    status["uplink"] = uplink_status(clock, "wwan0", 1)
    reader.devices["flannel-wg"] = counters(clock, rx=2000, tx=2000)
    await check.run()
    assert len(egress.learned) == learned + 2  # both endpoints asked again at once
    await check.run()
    assert len(egress.learned) == learned + 2


@pytest.mark.parametrize(("costs", "key", "words"), [
    ('[{interface = "wwan0", cost = 256}]', "uplink.costs[0].cost", "0 to 255, got 256"),
    ('[{interface = "wwan0", cost = -1}]', "uplink.costs[0].cost", "0 to 255"),
    ('[{interface = "eth9", cost = 1}]', "uplink.costs[0].interface", "not one of"),
    ('[{interface = "wwan0"}, {interface = "wwan0", cost = 3}]',
     "uplink.costs[1].interface", "listed twice"),
    ('[{cost = 3}]', "uplink.costs[0].interface", "expected an interface"),
    ('[{interface = "wwan0", cost = "high"}]', "uplink.costs[0].cost", "expected an integer"),
])
def test_a_bad_cost_is_refused_with_its_key(costs: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings.loads(f'[uplink]\ninterfaces = ["eth0", "wwan*"]\ncosts = {costs}\n')
    assert key in str(err.value)
    assert words in str(err.value)


def test_a_glob_cost_matches_the_interfaces_it_names() -> None:
    config = settings.loads('[uplink]\ninterfaces = ["eth0", "wwan*"]\n'
                            'costs = [{interface = "wwan*", cost = 200}]\n')
    assert fo.cost_of("wwan3", config.uplink.costs) == 200
    assert fo.cost_of("eth0", config.uplink.costs) == 0


def test_route_events_pass_default_routes_of_the_main_table_only() -> None:
    class Msg(dict[str, Any]):
        def __init__(self, attrs: dict[str, Any], **fields: Any) -> None:
            super().__init__(fields)
            self.attrs = attrs

        def get_attr(self, name: str) -> Any:
            return self.attrs.get(name)

    from edgeheal.boundaries.kernel.route_events import parse

    default = Msg({"RTA_TABLE": 254, "RTA_OIF": 3}, event="RTM_DELROUTE", dst_len=0)
    assert parse(default) == RouteEvent("RTM_DELROUTE", 3)
    assert parse(Msg({"RTA_TABLE": 254, "RTA_OIF": 3}, event="RTM_NEWROUTE",
                     dst_len=24)) is None  # a pod's route
    assert parse(Msg({"RTA_TABLE": 255, "RTA_OIF": 3}, event="RTM_NEWROUTE",
                     dst_len=0)) is None  # the local table
    assert parse(Msg({"IFLA_IFNAME": "eth0"}, event="RTM_NEWLINK", index=2)) == \
        RouteEvent("RTM_NEWLINK", 2, "eth0")
    assert parse(Msg({}, event="RTM_NEWADDR", index=2)) is None


# --- against a real kernel ----------------------------------------------------------------

async def test_a_real_failover_and_fail_back_wake_the_check_and_name_their_causes(
        sandbox: Sandbox) -> None:
    """Two veth uplinks to a carrier namespace, default routes at metrics 100 and 700 (as
    NetworkManager sets Ethernet's and a modem's): the carrier side of the first goes
    down (the edge side loses carrier), comes back, then its route is withdrawn."""
    edge, carrier = sandbox.netns("fe"), sandbox.netns("fc")
    eth, eth_peer = sandbox.veth(edge, carrier, addr_a="10.78.0.2/24", addr_b="10.78.0.1/24")
    lte, _ = sandbox.veth(edge, carrier, addr_a="10.78.1.2/24", addr_b="10.78.1.1/24")
    run(["ip", "route", "add", "default", "via", "10.78.0.1", "dev", eth, "metric", "100"],
        ns=edge)
    run(["ip", "route", "add", "default", "via", "10.78.1.1", "dev", lte, "metric", "700"],
        ns=edge)
    clock, hastened = Clock(), []
    h = context(f'[uplink]\ninterfaces = ["{eth}", "{lte}"]\n'
                f'costs = [{{interface = "{lte}", cost = 200}}]\n', clock=clock)
    ctx = replace(h.ctx, hasten=hastened.append)
    check = UplinkCheck(ctx, ctx.config.uplink, netns=edge)
    result = await check.run()
    assert result.detail["active"]["interface"] == eth, result.detail
    assert result.detail["interfaces"][eth]["default_route"]
    serving = asyncio.create_task(check.serve())
    try:
        await until(lambda: hastened, within=10, every=0.05, what="the listener's first run")
        hastened.clear()

        async def switched_to(name: str, what: str) -> dict[str, Any]:
            await until(lambda: "uplink" in hastened, within=10, every=0.05,
                        what=f"an rtnetlink event: {what}")
            hastened.clear()
            found = await check.run()
            assert found.detail["active"]["interface"] == name, found.detail
            assert hastened == ["wireguard"]  # the tunnel check, at once
            hastened.clear()
            return dict(found.detail["active"])

        run(["ip", "link", "set", eth_peer, "down"], ns=carrier)
        active = await switched_to(lte, "carrier lost")
        assert active["last_switch"]["cause"] == "carrier_lost"
        assert active["cost"] == 200
        run(["ip", "link", "set", eth_peer, "up"], ns=carrier)
        active = await switched_to(eth, "carrier back")
        assert active["last_switch"]["cause"] == "preferred"
        run(["ip", "route", "del", "default", "dev", eth], ns=edge)
        active = await switched_to(lte, "route withdrawn")
        assert active["last_switch"]["cause"] == "route_withdrawn"
        assert active["switches"] == 3
        assert [e.kind for e in h.events] == ["uplink.failover"] * 3
        # a pod's route coming and going wakes nothing
        run(["ip", "route", "add", "10.42.9.0/24", "dev", lte], ns=edge)
        run(["ip", "route", "del", "10.42.9.0/24", "dev", lte], ns=edge)
        await asyncio.sleep(0.5)
        assert hastened == []
    finally:
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving


async def test_the_route_listener_reports_a_default_route_in_its_namespace(
        sandbox: Sandbox) -> None:
    edge, carrier = sandbox.netns("rl"), sandbox.netns("rc")
    a, _ = sandbox.veth(edge, carrier, addr_a="10.79.0.2/24", addr_b="10.79.0.1/24")
    async with RouteListener(netns=edge) as events:
        run(["ip", "route", "add", "default", "via", "10.79.0.1", "dev", a], ns=edge)
        got: list[RouteEvent] = []

        async def first() -> None:
            async for ev in events:
                if ev.route:
                    got.append(ev)
                    return

        async with compat.timeout(10):
            await first()
    assert got[0].event == "RTM_NEWROUTE"
    assert got[0].ifindex > 0


@pytest.mark.parametrize(("reader", "toml", "forgotten"), [
    ("uapi", "", 2),                                  # both watched peers re-set
    ("netlink", "", 0),                               # the kernel drops a stale source
    ("uapi", "forget_source = false\n", 0),
])
async def test_after_a_switch_a_userspace_device_is_told_to_forget_its_source(
        reader: str, toml: str, forgotten: int) -> None:
    clock, devices, egress = Clock(), FakeReader(), FakeEgress()
    status = {"uplink": uplink_status(clock, "eth0", 0)}
    calls: list[tuple[str, str, str]] = []

    async def forget(ifname: str, key: str, endpoint: str) -> None:
        calls.append((ifname, key, endpoint))

    def snapshot() -> Snapshot:
        return Snapshot(node="n", checks=status, started_mono=0.0, taken_mono=clock.now)

    conf = UPLINK_TOML.replace('interfaces = ["flannel-wg", "flannel-wg-v6"]',
                               'interfaces = ["flannel-wg", "flannel-wg-v6"]\n'
                               f'watch_peers = ["{CLOUD}", "{EDGE2}"]\n' + toml, 1)
    ctx = context(conf, clock=clock, snapshot=snapshot).ctx
    check = wgcheck.WireguardCheck(ctx, reader=devices, egress=egress,  # type: ignore[arg-type]
                                   conntrack=untranslated, forget=forget)

    def read(i: int) -> None:
        devices.devices["flannel-wg"] = replace(
            counters(clock, rx=1000 + 32 * i, tx=1000 + 32 * i), reader=reader)

    for i in range(3):
        read(i)
        await check.run()
        clock.advance(2)
    assert calls == []  # no switch, nothing written
    status["uplink"] = uplink_status(clock, "wwan0", 1)
    read(4)
    await check.run()
    assert len(calls) == forgotten
    assert all(c[0] == "flannel-wg" and c[2].endswith(":51820") for c in calls)
    read(5)
    await check.run()
    assert len(calls) == forgotten  # once per switch
