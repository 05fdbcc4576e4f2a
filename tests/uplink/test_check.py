"""The uplink check: its verdict table over fakes of the boundary readers, then its
link/address/route/probe evidence against a real kernel in a network namespace."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeheal.boundaries.kernel import interfaces as ifstate
from edgeheal.boundaries.kernel.interfaces import Interface
from edgeheal.boundaries.modemmanager.readings import Bearer, Modem, ModemError
from edgeheal.checks.uplink import UplinkCheck, pick_modem
from edgeheal.checks.uplink.interface_reader import REFRESH
from edgeheal.checks.uplink.verdict import Evidence, judge
from edgeheal.config import loads_generic
from edgeheal.lab.netns import Sandbox, run
from edgeheal.lab.nsutil import inside
from edgeheal.model import State
from tests.support import Clock, context

SECRET = "apn-pass-0xDEADBEEF"


def link(name: str = "wwan0", *, oper: str = "UP", carrier: bool = True,
         addresses: tuple[str, ...] = ("10.64.1.2",), default_route: bool = True) -> Interface:
    return Interface(name=name, index=3, oper=oper, admin_up=True, carrier=carrier,
                     addresses=addresses, default_route=default_route, rx_packets=10,
                     tx_packets=10)


def modem(*, state: str = "connected", registration: str = "home", signal: int = 60,
          connected: bool = True, interface: str = "wwan0", failed_reason: str = "none",
          unlock_required: str = "none", reject_cause: int = 0) -> Modem:
    bearer = Bearer(path="/org/freedesktop/ModemManager1/Bearer/0", connected=connected,
                    interface=interface, properties={"apn": "internet", "password": SECRET})
    return Modem(path="/org/freedesktop/ModemManager1/Modem/0", state=state,
                 registration=registration, signal_quality=signal, signal_recent=True,
                 device="/sys/devices/usb1/1-1", ports=(("cdc-wdm0", 1), (interface, 2)),
                 bearers=(bearer,), failed_reason=failed_reason,
                 unlock_required=unlock_required, reject_cause=reject_cause)


WINDOW = 60.0
DROP_FROM_EDGE = """
table inet stuck {
  chain in {
    type filter hook prerouting priority -300; policy accept;
    ip saddr 10.77.0.2 drop;
  }
}
"""
# (id, interfaces, modem, silent_for, probe, expected (state, reason))
CASES: list[tuple[str, tuple[Interface, ...], Modem | None, float, str,
                  tuple[State, str]]] = [
    ("healthy and traffic passes", (link(),), modem(), 0.0, "", (State.OK, "ok")),
    ("silent for less than the window is still ok", (link(),), modem(), 59.0, "",
     (State.OK, "ok")),
    ("no interface at all is link_down", (), modem(), 0.0, "", (State.FAILED, "link_down")),
    ("an interface down is link_down", (link(oper="DOWN", carrier=False),), modem(), 0.0,
     "", (State.FAILED, "link_down")),
    ("no carrier is link_down", (link(carrier=False),), modem(), 0.0, "",
     (State.FAILED, "link_down")),
    ("not registered is no_coverage", (link(),), modem(registration="searching"), 100.0, "",
     (State.FAILED, "no_coverage")),
    ("registration denied is its own verdict, not no_coverage", (link(),),
     modem(state="enabled", registration="denied", reject_cause=7), 0.0, "",
     (State.FAILED, "registration_denied")),
    ("a denial with the link down is still registration_denied (it can be acted on)",
     (link(oper="DOWN", carrier=False),), modem(state="enabled", registration="denied"),
     0.0, "", (State.FAILED, "registration_denied")),
    ("failed for no SIM reason is modem_failed, before link_down",
     (link(oper="DOWN", carrier=False),), modem(state="failed", failed_reason="unknown"),
     0.0, "", (State.FAILED, "modem_failed")),
    ("failed for a missing SIM is modem_not_ready: a person's fix", (link(),),
     modem(state="failed", failed_reason="sim-missing"), 100.0, "",
     (State.UNKNOWN, "modem_not_ready")),
    ("failed for an eSIM without profile is modem_not_ready", (),
     modem(state="failed", failed_reason="esim-without-profiles"), 0.0, "",
     (State.UNKNOWN, "modem_not_ready")),
    ("a PIN-locked SIM is modem_not_ready, even with the link down", (),
     modem(state="locked", unlock_required="sim-pin"), 0.0, "",
     (State.UNKNOWN, "modem_not_ready")),
    ("no signal is no_coverage", (link(),), modem(signal=0), 100.0, "",
     (State.FAILED, "no_coverage")),
    ("a searching modem without 3GPP is no_coverage", (link(),),
     modem(state="searching", registration=""), 100.0, "", (State.FAILED, "no_coverage")),
    ("a locked modem is unknown", (link(),), modem(state="locked"), 100.0, "",
     (State.UNKNOWN, "modem_not_ready")),
    ("up without an address is no_address", (link(addresses=()),), modem(), 100.0, "",
     (State.FAILED, "no_address")),
    ("addressed without a default route is no_route", (link(default_route=False),), modem(),
     100.0, "", (State.FAILED, "no_route")),
    ("silent for the window, registered, signal, bearer: stuck", (link(),), modem(), 60.0,
     "", (State.FAILED, "stuck")),
    ("roaming counts as registered", (link(),), modem(registration="roaming"), 60.0,
     "timeout", (State.FAILED, "stuck")),
    ("silent without the modem's state cannot be told: unknown", (link(),), None, 600.0,
     "timeout", (State.UNKNOWN, "silent")),
    ("silent with the bearer not connected: unknown", (link(),), modem(connected=False),
     600.0, "", (State.UNKNOWN, "silent")),
    ("one of two uplinks up and routed is enough", (link("eth1", oper="DOWN"), link()),
     modem(), 0.0, "", (State.OK, "ok")),
]


def test_the_modems_own_verdicts_name_the_cause_and_the_fix() -> None:
    denied = judge(Evidence((link(),), modem(state="enabled", registration="denied",
                                              reject_cause=7), "", 0.0, ""), WINDOW)
    assert "reject cause 7 gprs-not-allowed" in denied.message
    assert denied.detail["modem"]["reject_cause"] == 7
    missing = judge(Evidence((link(),), modem(state="failed", failed_reason="sim-missing"),
                             "", 0.0, ""), WINDOW)
    assert missing.detail["modem"]["not_ready"] == "sim_missing"
    assert "insert one" in missing.message
    locked = judge(Evidence((), modem(state="locked", unlock_required="sim-puk"), "", 0.0,
                            ""), WINDOW)
    assert locked.detail["modem"]["not_ready"] == "sim_locked"
    assert "sim-puk" in locked.message
    assert "unlock" in locked.message
    failed = judge(Evidence((), modem(state="failed", failed_reason="unknown"), "", 0.0, ""),
                   WINDOW)
    assert failed.detail["modem"]["failed_reason"] == "unknown"


@pytest.mark.parametrize(("absent_for", "expected"), [
    (0.0, "link_down"), (119.0, "link_down"), (120.0, "modem_absent"), (900.0, "modem_absent")])
def test_a_modem_gone_is_modem_absent_only_after_modem_absent_after(
        absent_for: float, expected: str) -> None:
    result = judge(Evidence((), None, "ModemManager knows no modem", 0.0, "",
                            absent_for=absent_for, absent_after=120.0), WINDOW)
    assert result.reason == expected
    if expected == "modem_absent":
        assert result.state is State.FAILED
        assert "ModemManager knows no modem" in result.message


@pytest.mark.parametrize(("links", "the_modem", "silent", "probe", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_uplink_verdict(links: tuple[Interface, ...], the_modem: Modem | None,
                            silent: float, probe: str, expected: tuple[State, str]) -> None:
    result = judge(Evidence(links, the_modem, "", silent, probe), WINDOW)
    assert (result.state, result.reason) == expected
    assert result.message
    assert SECRET not in repr(result)  # the bearer's properties never reach detail


def test_the_modem_on_the_uplink_interface_is_picked() -> None:
    other, ours = modem(interface="wwan1"), modem(interface="wwan0")
    assert pick_modem((other, ours), {"wwan0"}) is ours
    assert pick_modem((ours,), {"eth9"}) is ours  # the only modem
    assert pick_modem((other, modem(interface="wwan2")), {"wwan0"}) is None


class FakeManager:
    def __init__(self, modems: tuple[Modem, ...] | Exception = ()) -> None:
        self.answer = modems
        self.asked = 0

    async def modems(self) -> tuple[Modem, ...]:
        self.asked += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def close(self) -> None:
        return None


@pytest.fixture
def uplink_ns(sandbox: Sandbox) -> dict[str, Any]:
    """An edge namespace whose uplink (a veth) reaches a carrier namespace with a TCP
    listener (the second probe's target) on 10.77.0.1:7000."""
    edge, carrier = sandbox.netns("ue"), sandbox.netns("uc")
    a, _b = sandbox.veth(edge, carrier, addr_a="10.77.0.2/24", addr_b="10.77.0.1/24")
    run(["ip", "route", "add", "default", "via", "10.77.0.1", "dev", a], ns=edge)
    sandbox.spawn(["python3", "-c", "import socket,time\n"
                   "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                   "s.bind(('10.77.0.1',7000));s.listen(64)\n"
                   "while True:\n c,_=s.accept();c.close()"], ns=carrier)
    return {"edge": edge, "carrier": carrier, "a": a, "sandbox": sandbox}


async def _run(check: UplinkCheck, ns: str) -> Any:
    with inside(ns):  # the probe's socket and the rtnetlink socket both in the edge
        return await check.run()


@pytest.mark.netns
async def test_the_check_reads_link_address_route_and_probe_from_a_real_kernel(
        uplink_ns: dict[str, Any]) -> None:
    edge, a = uplink_ns["edge"], uplink_ns["a"]
    clock = Clock()
    h = context(f"""
[uplink]
interfaces = ["{a}"]
probe = "10.77.0.1:7000"
window = "20s"
timeout = "3s"
""", clock=clock)
    manager = FakeManager((modem(interface=a),))
    check = UplinkCheck(h.ctx, h.ctx.config.uplink, modem_manager=manager)
    for _ in range(50):  # the carrier's listener may take a moment to start
        result = await _run(check, edge)
        if result.detail.get("probe") == "ok":
            break
        await asyncio.sleep(0.1)
    assert (result.state, result.reason) == (State.OK, "ok"), result.message
    assert manager.asked == 0  # a plainly healthy uplink costs no D-Bus call
    assert result.detail["interfaces"][a] == {"oper": "up", "carrier": True, "addresses": 1,
                                              "default_route": True}

    # the carrier silently drops everything from the edge: link, address, route fine
    uplink_ns["sandbox"].nft(uplink_ns["carrier"], DROP_FROM_EDGE)
    clock.advance(5)
    result = await _run(check, edge)
    assert (result.state, result.reason) == (State.OK, "ok")  # silent < window
    assert result.detail["probe"] == "timeout"
    assert manager.asked == 0
    clock.advance(20)
    result = await _run(check, edge)
    assert (result.state, result.reason) == (State.FAILED, "stuck"), result.message
    assert manager.asked == 1  # silence: now the modem's word is needed
    run(["nft", "delete", "table", "inet", "stuck"], ns=uplink_ns["carrier"])
    result = await _run(check, edge)
    assert (result.state, result.reason) == (State.OK, "ok")

    run(["ip", "route", "del", "default"], ns=edge)
    result = await _run(check, edge)
    assert result.reason == "no_route", result.message
    run(["ip", "addr", "flush", "dev", a], ns=edge)
    result = await _run(check, edge)
    assert result.reason == "no_address", result.message
    run(["ip", "link", "set", a, "down"], ns=edge)
    result = await _run(check, edge)
    assert result.reason == "link_down", result.message


@pytest.mark.netns
async def test_without_modemmanager_silence_is_unknown_and_says_why(
        uplink_ns: dict[str, Any]) -> None:
    edge, a = uplink_ns["edge"], uplink_ns["a"]
    uplink_ns["sandbox"].nft(uplink_ns["carrier"], DROP_FROM_EDGE)
    clock = Clock()
    h = context(f'[uplink]\ninterfaces = ["{a}"]\nprobe = "10.77.0.1:7000"\n'
                'window = "20s"\ntimeout = "2s"\n', clock=clock)
    check = UplinkCheck(h.ctx, h.ctx.config.uplink, modem_manager=FakeManager(
        ModemError("ModemManager is not running (org.freedesktop.ModemManager1)")))
    await _run(check, edge)
    clock.advance(30)
    result = await _run(check, edge)
    assert (result.state, result.reason) == (State.UNKNOWN, "silent")
    assert "not running" in result.detail["modem"]["note"]


@pytest.mark.netns
async def test_link_bounce_takes_a_real_veth_down_and_up(uplink_ns: dict[str, Any]) -> None:
    from edgeheal.remedies.link_bounce import LinkBounce

    edge, a = uplink_ns["edge"], uplink_ns["a"]
    config = loads_generic(f'[uplink]\ninterfaces = ["{a}"]\n')
    seen: list[bool] = []
    remedy = LinkBounce(config, netns=edge, down_for=0.5)
    assert (await remedy.probe()).usable
    task = asyncio.create_task(remedy.restart())
    for _ in range(100):  # watch it go down while the bounce runs
        (link_now,) = await ifstate.read((a,), netns=edge)
        seen.append(link_now.admin_up)
        if not link_now.admin_up:
            break
        await asyncio.sleep(0.02)
    outcome = await asyncio.wait_for(task, 10)
    assert outcome.target == a
    assert False in seen
    (after,) = await ifstate.read((a,), netns=edge)
    assert after.admin_up
    missing = LinkBounce(loads_generic('[uplink]\ninterfaces = ["nope*"]\n'), netns=edge)
    availability = await missing.probe()
    assert not availability.usable
    assert "nope*" in availability.why


@pytest.fixture
def edge_sysfs(uplink_ns: dict[str, Any], tmp_path: Path) -> Iterator[Path]:
    """The edge namespace's own sysfs, mounted here (a thread that only switched its
    network namespace still sees the host's /sys/class/net); unmounted before the
    sandbox deletes the namespace."""
    mnt = tmp_path / "sys"
    mnt.mkdir()
    run(["nsenter", f"--net=/run/netns/{uplink_ns['edge']}", "mount", "-t", "sysfs",
         "sysfs", str(mnt)])
    try:
        yield mnt / "class" / "net"
    finally:
        run(["umount", "-l", str(mnt)], check=False)


def _traffic(carrier: str, packets: int = 3) -> None:
    """Broadcast datagrams from the carrier: they reach the edge's uplink (its rx counter
    grows) whether or not the edge still has an address."""
    with inside(carrier):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        for _ in range(packets):
            sock.sendto(b"x", ("10.77.0.255", 9))


def _counting_sockets(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    opened: list[str | None] = []
    real = ifstate._socket

    def counting(netns: str | None) -> Any:
        opened.append(netns)
        return real(netns)
    monkeypatch.setattr(ifstate, "_socket", counting)
    return opened


@pytest.mark.netns
async def test_while_traffic_flows_the_check_reads_sysfs_and_opens_no_netlink_socket(
        uplink_ns: dict[str, Any], edge_sysfs: Path, monkeypatch: pytest.MonkeyPatch,
        ) -> None:
    edge, a, carrier = uplink_ns["edge"], uplink_ns["a"], uplink_ns["carrier"]
    opened = _counting_sockets(monkeypatch)
    clock = Clock()
    h = context(f'[uplink]\ninterfaces = ["{a}"]\n', clock=clock)
    manager = FakeManager((modem(interface=a),))
    check = UplinkCheck(h.ctx, h.ctx.config.uplink, modem_manager=manager, sysfs=edge_sysfs)
    result = await _run(check, edge)
    assert (result.state, result.reason, len(opened)) == (State.OK, "ok", 1)
    for _ in range(5):  # 50 s of traffic: under the refresh bound, nothing moved
        _traffic(carrier)
        clock.advance(10)
        result = await _run(check, edge)
        assert (result.state, result.reason) == (State.OK, "ok"), result.message
        assert result.detail["interfaces"][a]["addresses"] == 1
    assert len(opened) == 1, "a netlink socket was opened while traffic flowed"
    assert check.reader.dumps == 1
    assert manager.asked == 0
    clock.advance(10)  # rx flat: silence may be starting, so netlink is read at once
    result = await _run(check, edge)
    assert (result.state, len(opened)) == (State.OK, 2)
    _traffic(carrier)
    clock.advance(1)
    await _run(check, edge)
    assert len(opened) == 2
    run(["ip", "link", "set", a, "down"], ns=edge)  # a link change is read at once
    run(["ip", "link", "set", a, "up"], ns=edge)  # ... even when undone in between
    _traffic(carrier)
    clock.advance(1)
    await _run(check, edge)
    assert len(opened) == 3


@pytest.mark.netns
async def test_an_address_removed_while_traffic_flows_is_seen_within_the_refresh_bound(
        uplink_ns: dict[str, Any], edge_sysfs: Path, monkeypatch: pytest.MonkeyPatch,
        ) -> None:
    edge, a, carrier = uplink_ns["edge"], uplink_ns["a"], uplink_ns["carrier"]
    opened = _counting_sockets(monkeypatch)
    clock = Clock()
    h = context(f'[uplink]\ninterfaces = ["{a}"]\n', clock=clock)
    check = UplinkCheck(h.ctx, h.ctx.config.uplink,
                        modem_manager=FakeManager((modem(interface=a),)), sysfs=edge_sysfs)
    assert (await _run(check, edge)).reason == "ok"
    run(["ip", "addr", "flush", "dev", a], ns=edge)
    removed = clock()
    seen = None
    for _ in range(10):  # broadcasts keep rx growing: only the refresh reads netlink
        _traffic(carrier)
        clock.advance(10)
        result = await _run(check, edge)
        if result.reason == "no_address":
            seen = clock() - removed
            break
    assert seen is not None, "the lost address was never seen"
    assert seen <= REFRESH + 10
    assert len(opened) == 2  # the start, and one refresh


@pytest.mark.netns
async def test_silence_during_no_coverage_does_not_count_towards_stuck(
        uplink_ns: dict[str, Any]) -> None:
    """Coverage returns: the modem is registered with a connected bearer again before the
    first packet is in. The outage's silence was explained (no_coverage); stuck needs a
    whole window of silence from there (the lab's no-coverage at the shipped defaults
    once saw `stuck` at once, and a rung)."""
    edge, a = uplink_ns["edge"], uplink_ns["a"]
    uplink_ns["sandbox"].nft(uplink_ns["carrier"], DROP_FROM_EDGE)
    clock = Clock()
    h = context(f'[uplink]\ninterfaces = ["{a}"]\nprobe = "10.77.0.1:7000"\n'
                'window = "20s"\ntimeout = "2s"\n', clock=clock)
    manager = FakeManager((modem(interface=a, state="searching", registration="searching",
                                 signal=0, connected=False),))
    check = UplinkCheck(h.ctx, h.ctx.config.uplink, modem_manager=manager)
    await _run(check, edge)
    for _ in range(4):  # 120 s without coverage
        clock.advance(30)
        result = await _run(check, edge)
        assert result.reason == "no_coverage", result.message
    manager.answer = (modem(interface=a),)  # registered, signal, bearer connected
    clock.advance(10)
    result = await _run(check, edge)
    assert (result.state, result.reason) == (State.OK, "ok"), result.message
    clock.advance(20)  # a whole window of silence with the modem fine: stuck
    result = await _run(check, edge)
    assert result.reason == "stuck", result.message


@pytest.mark.netns
async def test_a_modem_that_vanishes_with_its_link_is_modem_absent_after_the_bound(
        uplink_ns: dict[str, Any]) -> None:
    """The modem goes (its interface down, ModemManager knows no modem): ``link_down`` until
    ``modem_absent_after``, then ``modem_absent``; back to ``ok`` once it returns. A node
    whose ModemManager never knew a modem is never ``modem_absent``."""
    edge, a = uplink_ns["edge"], uplink_ns["a"]
    clock = Clock()
    h = context(f'[uplink]\ninterfaces = ["{a}"]\nwindow = "20s"\ntimeout = "2s"\n'
                'modem_absent_after = "60s"\n', clock=clock)
    manager = FakeManager((modem(interface=a),))
    check = UplinkCheck(h.ctx, h.ctx.config.uplink, modem_manager=manager)
    h2 = context(f'[uplink]\ninterfaces = ["{a}"]\nwindow = "20s"\ntimeout = "2s"\n'
                 'modem_absent_after = "60s"\n', clock=clock)  # its own registry: a 2nd agent
    never = UplinkCheck(h2.ctx, h2.ctx.config.uplink, modem_manager=FakeManager(()))
    run(["ip", "link", "set", a, "down"], ns=edge)  # the modem resets: its link goes
    assert (await _run(check, edge)).reason == "link_down"  # the modem still there: seen
    manager.answer = ()  # ...and it is gone from ModemManager
    assert (await _run(never, edge)).reason == "link_down"
    for _ in range(3):  # first seen missing, then 25 s, 50 s after
        assert (await _run(check, edge)).reason == "link_down"
        assert (await _run(never, edge)).reason == "link_down"
        clock.advance(25)
    # 75 s since the first run that missed it
    result = await _run(check, edge)
    assert (result.state, result.reason) == (State.FAILED, "modem_absent"), result.message
    assert (await _run(never, edge)).reason == "link_down"  # never seen: never lost
    manager.answer = (modem(interface=a),)
    run(["ip", "link", "set", a, "up"], ns=edge)
    run(["ip", "route", "replace", "default", "via", "10.77.0.1", "dev", a], ns=edge)
    _traffic(uplink_ns["carrier"])
    clock.advance(2)
    result = await _run(check, edge)
    assert result.reason != "modem_absent", result.message


@pytest.mark.netns
async def test_an_unplugged_uplink_is_evidence_of_a_modem_never_asked_about(
        uplink_ns: dict[str, Any]) -> None:
    """The agent never asked ModemManager while the uplink was fine; then the interface
    vanishes and comes back with a new index (a USB modem re-enumerating) and ModemManager
    knows no modem: ``modem_absent`` after the bound. A NIC that only goes down is not."""
    edge, carrier, a = uplink_ns["edge"], uplink_ns["carrier"], uplink_ns["a"]
    clock = Clock()
    h = context(f'[uplink]\ninterfaces = ["{a}"]\nwindow = "20s"\ntimeout = "2s"\n'
                'modem_absent_after = "60s"\n', clock=clock)
    manager = FakeManager(())
    check = UplinkCheck(h.ctx, h.ctx.config.uplink, modem_manager=manager)
    h2 = context(f'[uplink]\ninterfaces = ["{a}"]\nwindow = "20s"\ntimeout = "2s"\n'
                 'modem_absent_after = "60s"\n', clock=clock)  # its own registry: a 2nd agent
    nic = UplinkCheck(h2.ctx, h2.ctx.config.uplink, modem_manager=FakeManager(()))
    assert (await _run(check, edge)).reason == "ok"
    assert (await _run(nic, edge)).reason == "ok"
    assert manager.asked == 0
    run(["ip", "link", "set", a, "down"], ns=edge)
    for _ in range(4):  # only down, for longer than the bound: it stays a NIC
        assert (await _run(nic, edge)).reason == "link_down"
        clock.advance(25)
    run(["ip", "link", "del", a], ns=edge)  # unplugged: gone, then back, a new index
    assert (await _run(check, edge)).reason == "link_down"
    uplink_ns["sandbox"].veth(edge, carrier, addr_a="10.77.0.2/24", addr_b="10.77.0.1/24",
                              name_a=a)
    for _ in range(3):
        clock.advance(25)
        result = await _run(check, edge)
    assert (result.state, result.reason) == (State.FAILED, "modem_absent"), result.message
