"""The uplink's data accounting: the ledger's rules over readings, the plan's alerts, and
the counting against a real interface in a namespace, across a restart of the check and a
counter reset done by re-creating the link."""

from __future__ import annotations

import datetime as dt
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from edgeheal.checks.uplink import UplinkCheck
from edgeheal.checks.uplink.ledger import Ledger, period
from edgeheal.checks.uplink.usage import EXCEEDED, FILE, FORECAST, Meter, parse_size
from edgeheal.lab.netns import Sandbox, run
from edgeheal.lab.nsutil import inside
from tests.support import WALL0, Clock, context

DAY = 86400.0
T0 = WALL0.timestamp()


@pytest.mark.parametrize(("text", "size"), [
    ("1GB", 10**9), ("500MB", 500 * 10**6), ("1.5 GB", 1_500_000_000), ("2GiB", 2 * 2**30),
    ("100 kb", 100_000), ("1000000b", 10**6)])
def test_plan_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1", "GB", "1 XB", "-1GB", "0MB", "1.5b", "1e3MB"])
def test_a_bad_plan_size_says_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match="expected a"):
        parse_size(text)


def test_a_bad_plan_is_a_config_error_naming_the_key() -> None:
    from edgeheal.config import ConfigError
    from edgeheal.settings import loads

    with pytest.raises(ConfigError, match=r"uplink\.plan.*1 XB"):
        loads('[uplink]\ninterfaces = ["wwan0"]\nplan = "1 XB"\n')
    for day in (0, 29, 31):
        with pytest.raises(ConfigError, match=rf"uplink\.plan_start_day.*1 to 28.*got {day}"):
            loads(f'[uplink]\ninterfaces = ["wwan0"]\nplan_start_day = {day}\n')


@pytest.mark.parametrize(("today", "start_day", "expected"), [
    ("2026-12-04", 1, ("2026-12-01", "2027-01-01")),
    ("2026-12-04", 15, ("2026-11-15", "2026-12-15")),
    ("2026-12-15", 15, ("2026-12-15", "2027-01-15")),
    ("2027-01-03", 28, ("2026-12-28", "2027-01-28"))])
def test_the_billing_period(today: str, start_day: int, expected: tuple[str, str]) -> None:
    start, end = period(dt.date.fromisoformat(today), start_day)
    assert (start.isoformat(), end.isoformat()) == expected


def test_the_ledger_adds_growth_and_restarts_from_zero_on_a_reset() -> None:
    ledger = Ledger()
    # a fresh ledger's first reading is a baseline (bytes from before the install are not
    # today's); a link first seen later counts what it counted since it was created
    assert ledger.observe([("wwan0", 3, 10**9, 500)], "boot-a", T0) == {"wwan0": (0, 0)}
    assert ledger.observe([("wwan0", 3, 10**9 + 1000, 1000), ("wwan1", 4, 500, 0)],
                          "boot-a", T0 + 5) == {"wwan0": (1000, 500), "wwan1": (500, 0)}
    del ledger.totals["wwan1"], ledger.seen["wwan1"]
    ledger.days = {d: {"wwan0": per["wwan0"]} for d, per in ledger.days.items()}
    assert ledger.observe([("wwan0", 3, 10**9 + 1600, 1200)], "boot-a", T0 + 10) == {
        "wwan0": (600, 200)}
    # re-created (new ifindex), then a counter that went back, then a reboot: from zero
    assert ledger.observe([("wwan0", 9, 50, 40)], "boot-a", T0 + 20) == {"wwan0": (50, 40)}
    assert ledger.observe([("wwan0", 9, 10, 45)], "boot-a", T0 + 30) == {"wwan0": (10, 45)}
    assert ledger.observe([("wwan0", 9, 30, 60)], "boot-b", T0 + 40) == {"wwan0": (30, 60)}
    assert ledger.totals == {"wwan0": [1690, 845]}
    assert ledger.used(WALL0.date()) == 1690 + 845
    # the ledger's file round-trips, and a damaged one is refused
    again = Ledger.from_json(json.loads(json.dumps(ledger.to_json())))
    assert again.to_json() == ledger.to_json()
    for bad in ({**ledger.to_json(), "version": 2},
                {**ledger.to_json(), "totals": {"wwan0": [-1, 0]}},
                {**ledger.to_json(), "days": {"not a day": {}}}):
        with pytest.raises((ValueError, TypeError, KeyError)):
            Ledger.from_json(bad)


def test_days_are_utc_and_the_rate_needs_an_hour() -> None:
    ledger = Ledger()
    ledger.observe([("wwan0", 3, 0, 0)], "b", T0)
    assert ledger.rate(T0 + 1800) is None
    ledger.observe([("wwan0", 3, 3_600_000, 0)], "b", T0 + 3600)
    assert ledger.rate(T0 + 3600) == pytest.approx(1000.0)  # bytes a second
    ledger.observe([("wwan0", 3, 3_600_000 + 5000, 0)], "b", T0 + DAY)
    assert len(ledger.days) == 2


def _meter(tmp_path: Path, clock: Clock, plan: int | None = 10**9,
           **kw: Any) -> tuple[Meter, Any]:
    h = context(f'[agent]\nstate_dir = "{tmp_path}"\n', clock=clock)
    args = {"start_day": 1, "warn": 80.0, "exceeded": 100.0, **kw}
    return Meter(h.ctx, plan=plan, boot="boot-a", **args), h


async def test_the_forecast_and_the_plan_alerts_are_raised_once_a_period(
        tmp_path: Path) -> None:
    clock = Clock()  # WALL0 is early in its month: a long rest of the period to forecast
    meter, h = _meter(tmp_path, clock)
    view = meter.observe([("wwan0", 3, 0, 0)])
    assert view["period"]["forecast_bytes"] is None
    assert not h.events
    # 20 MB in two hours: 240 MB a day, the rest of the month is over 1 GB
    for hour in (1, 2):
        clock.advance(3600)
        view = meter.observe([("wwan0", 3, hour * 10**7, 0)])
    assert view["period"]["used_bytes"] == 2 * 10**7
    assert view["rate_24h_bytes_per_day"] == pytest.approx(2.4e8, rel=1e-3)
    assert view["period"]["forecast_bytes"] > 10**9
    assert view["period"]["runs_out_on"] is not None
    assert [e.kind for e in h.events] == [FORECAST]
    assert h.events[0].detail["runs_out_on"] == view["period"]["runs_out_on"]
    # raised at the first hour: 10 MB used, and 240 MB a day passes the plan by the 7th
    assert h.events[0].message == (
        f"the uplink used 10 MB of its 1 GB plan (1 %); at the last 24 h's rate the period "
        f"ends at {view['period']['forecast_bytes'] / 1e9:.3g} GB, past the plan on "
        f"{view['period']['runs_out_on']}")
    meter.observe([("wwan0", 3, 3 * 10**7, 0)])
    assert [e.kind for e in h.events] == [FORECAST]  # once a period
    clock.advance(60)
    view = meter.observe([("wwan0", 3, 10**9 + 1, 0)])
    assert view["period"]["used_percent"] == 100.0
    assert [e.kind for e in h.events] == [FORECAST, EXCEEDED]
    await meter.written()
    # a restart (a new meter on the same state directory) does not raise them again
    again, h2 = _meter(tmp_path, clock)
    again.observe([("wwan0", 3, 10**9 + 2, 0)])
    assert not h2.events
    assert again.ledger.totals == {"wwan0": [10**9 + 2, 0]}


def test_without_a_plan_there_is_no_alert_and_no_plan_in_the_view(tmp_path: Path) -> None:
    clock = Clock()
    meter, h = _meter(tmp_path, clock, plan=None)
    meter.observe([("wwan0", 3, 10**12, 0)])  # the baseline
    clock.advance(7200)
    view = meter.observe([("wwan0", 3, 3 * 10**12, 0)])
    assert "plan_bytes" not in view
    assert not h.events
    assert view["today_bytes"] == 2 * 10**12
    assert h.ctx.registry.get_sample_value(
        "edgeheal_uplink_bytes_total", {"interface": "wwan0", "direction": "rx"}) == 2 * 10**12


def test_edgeheals_own_bytes_are_a_counter_of_their_own(tmp_path: Path) -> None:
    from edgeheal.boundaries.mqtt.transport import OwnBytes

    meter, h = _meter(tmp_path, Clock(), plan=None)
    meter.observe([("wwan0", 3, 0, 0)])

    def own(direction: str) -> float | None:
        return h.ctx.registry.get_sample_value("edgeheal_own_bytes_total",
                                               {"direction": direction})

    before = own("tx")
    OwnBytes.tx += 340  # what a tunnel probe's sockets would count
    view = meter.observe([("wwan0", 3, 0, 0)])
    assert own("tx") == (before or 0) + 340
    assert view["edgeheal_bytes"]["tx_bytes"] == OwnBytes.tx


def test_a_damaged_ledger_is_moved_aside_and_counting_starts_afresh(tmp_path: Path) -> None:
    (tmp_path / FILE).write_text('{"version": 1, "boot_id": "x"')
    meter, _ = _meter(tmp_path, Clock())
    assert meter.ledger.totals == {}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(FILE + ".corrupt")]


def _send(ns: str, dst: str, count: int, size: int = 1000) -> None:
    with inside(ns), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(count):
            s.sendto(b"x" * size, (dst, 9))


def _interface(check_result: Any, name: str) -> dict[str, int]:
    return check_result.detail["data"]["interfaces"][name]


@pytest.mark.netns
async def test_a_real_interface_is_counted_across_a_restart_and_a_reset(
        sandbox: Sandbox, tmp_path: Path) -> None:
    edge, carrier = sandbox.netns("ue"), sandbox.netns("uc")
    a, b = sandbox.veth(edge, carrier, addr_a="10.78.0.2/24", addr_b="10.78.0.1/24")
    run(["ip", "route", "add", "default", "via", "10.78.0.1", "dev", a], ns=edge)
    clock = Clock()
    toml = (f'[agent]\nstate_dir = "{tmp_path}"\n'
            f'[uplink]\ninterfaces = ["{a}"]\nplan = "500kB"\nmodem_manager = false\n')

    def check() -> tuple[UplinkCheck, Any]:
        h = context(toml, clock=clock)
        return UplinkCheck(h.ctx, h.ctx.config.uplink), h

    first, h = check()
    with inside(edge):
        base = _interface(await first.run(), a)["tx_bytes"]  # the link's own (IPv6 ND...)
    _send(edge, "10.78.0.1", 200)  # 200 x (1000 + 28 + 14) bytes on the wire
    clock.advance(10)
    with inside(edge):
        counted = _interface(await first.run(), a)
    sent = counted["tx_bytes"] - base
    assert 200 * 1042 <= sent < 200 * 1042 + 20_000, counted
    # the agent stops (the ledger is written at close) and starts again
    await first.close()
    await first.meter.written()
    second, h2 = check()
    _send(edge, "10.78.0.1", 100)
    clock.advance(10)
    with inside(edge):
        after_restart = _interface(await second.run(), a)
    grown = after_restart["tx_bytes"] - counted["tx_bytes"]
    assert 100 * 1042 <= grown < 100 * 1042 + 20_000, after_restart

    # the counter reset: the link is re-created (new ifindex, counters from zero)
    run(["ip", "link", "del", a], ns=edge)
    a2, _ = sandbox.veth(edge, carrier, addr_a="10.78.0.2/24", addr_b="10.78.0.1/24",
                         name_a=a, name_b=b)
    run(["ip", "route", "add", "default", "via", "10.78.0.1", "dev", a2], ns=edge)
    _send(edge, "10.78.0.1", 300)
    clock.advance(10)
    with inside(edge):
        result = await second.run()
    after_reset = _interface(result, a)
    grown = after_reset["tx_bytes"] - after_restart["tx_bytes"]
    assert 300 * 1042 <= grown < 300 * 1042 + 20_000, after_reset  # nothing lost, none twice
    # a 500 kB plan: the 600 datagrams passed it, after the restart (so the second check
    # raised both alerts, once each)
    assert result.detail["data"]["period"]["used_bytes"] >= 600 * 1042
    assert not h.events
    assert sorted(e.kind for e in h2.events) == sorted([EXCEEDED, FORECAST])
    await second.close()
    await second.meter.written()
    saved = json.loads((tmp_path / FILE).read_text())
    assert saved["totals"][a][1] == after_reset["tx_bytes"]

