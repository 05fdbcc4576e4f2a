"""The lab's modems: a stand-in ModemManager per edge, and the scenarios about the uplink.

Why: the uplink ladder (:mod:`edgeheal.core.uplink_ladder`) acts on a *stuck* modem — registered,
with signal and a connected bearer, link and address fine, and still nothing passes — and must
never act when the network is simply gone. Both look the same from the edge's counters;
only the modem's own report (ModemManager over D-Bus) tells them apart. So in a world built
with ``modem=True`` each edge's uplink is "a modem": a :class:`FakeModemManager` on a
private ``dbus-daemon`` of its own reports it (registered, signal 75 %, one bearer on the
uplink interface), and the edge's agent is pointed at that bus (``[uplink] dbus_address``
and ``DBUS_SYSTEM_BUS_ADDRESS`` in its environment, so no D-Bus call of a lab agent can
reach the host's system bus).

The faults are made in the carrier namespace, as the field has them:

- ``stuck-modem``: the carrier silently drops everything to and from the edge while the
  modem still reports a healthy session. Only a new data session cures it: the stand-in's
  ``Simple.Connect`` lifts the drop (``on_connect``).
- ``no-coverage``: the modem loses the network (bearer down, searching, no signal) and the
  carrier drops everything; ``Simple.Connect`` would fail (no network). The agent must do
  nothing but alert; coverage returns later and the modem reconnects by itself, as its
  connection manager would.

- ``modem-vanishes``: the modem's firmware crashes: it leaves the USB bus (the uplink is
  deleted) and ModemManager with it; it re-enumerates seconds later (a new uplink, offload
  on, no address), but ModemManager, wedged on the old device, does not probe it (what
  LF EVE's mmagent restarts ModemManager for). Only a restart of ModemManager cures it: the
  stand-in systemd on the same bus (the ``ModemManager.service`` unit) restarts the
  stand-in ModemManager, which finds the modem again, and the connection manager brings
  the session (address, route) back.
- ``nm-stuck-modem``: ``stuck-modem`` on a node where NetworkManager owns the modem (a
  stand-in NetworkManager on the same bus manages the uplink, its profile active). The
  ladder's ``modem-reconnect`` must go through NetworkManager (its connection deactivated
  and activated again), never behind its back through ModemManager; NetworkManager's
  re-activation heals the carrier (``on_activate``).
- ``registration-denied``: the network refuses the SIM (reject cause 33, "requested
  service option not subscribed": a plan without data, or exhausted); the session drops and
  nothing passes. A radio off/on is tried once; the refusal stands, so the agent only
  alerts until the operator fixes the plan (at the end of the window).

Rung actions are counted from outside, whatever the agent reports: ``Simple`` and
``Enable`` calls the stand-in received, restarts of ``ModemManager.service`` the stand-in
systemd received, and the uplink's ``carrier_changes`` (a link bounce adds two).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from edgeheal.lab.modemmanager import BUS_POLICY, FakeModem, FakeModemManager
from edgeheal.lab.netns import run
from edgeheal.lab.networkmanager import BUS_POLICY as NM_POLICY
from edgeheal.lab.networkmanager import FakeNetworkManager
from edgeheal.lab.runner import Expectation, Lab
from edgeheal.lab.systemd_bus import FakeSystemd, start_system_bus

if TYPE_CHECKING:
    from edgeheal.lab.world import Edge, World

LAB_WINDOW = 10.0
"""[uplink] window in the lab: nothing passing this long is silence (2 keepalives)."""
LAB_ABSENT_AFTER = 30.0
"""[uplink] modem_absent_after in the lab (the shipped default is 120 s)."""
MM_UNIT = "ModemManager.service"
APN, USER = "lab.internet", "edge"
LAB_ACT_AFTER = 100.0
"""[remediation.uplink] act_after in the lab: longer than the 90 s ``uplink-outage``, so an
outage the modem cannot tell from a stuck session ends before the ladder may act."""
SILENT = "lab_silent"
"""The carrier's nftables table that drops everything of the edge."""


def uplink_config(edge: Edge, *, field: bool) -> str:
    """The agent's uplink sections: the lab's tuning, or (``field``) only what names this
    world, everything else the shipped defaults."""
    names = f"""
[uplink]
interfaces = ["{edge.uplink}"]
dbus_address = "{edge.modem_bus}"
"""
    if field:
        return names + "\n[remediation.uplink]\nenabled = true\n"
    return names + f"""interval = "2s"
window = "{LAB_WINDOW:g}s"
modem_absent_after = "{LAB_ABSENT_AFTER:g}s"

[remediation.uplink]
enabled = true
act_after = "{LAB_ACT_AFTER:g}s"
cooldown = "20s"
startup_grace = "10s"
verify_timeout = "30s"
"""


def _add_modem(fake: FakeModemManager, edge: Edge) -> None:
    fake.add_modem(f"/sys/devices/platform/edgeheal-lab/usb{edge.index + 1}/"
                   f"{edge.index + 1}-1", edge.uplink, apn=APN, user=USER,
                   password=f"lab-{edge.index}-not-a-secret")


async def start_modem(world: World, edge: Edge) -> FakeModemManager:
    """The edge's modem on its own bus; its Simple.Connect heals a silent carrier. The
    bus also has the stand-in systemd with ``ModemManager.service``, whose restart
    restarts the stand-in ModemManager (:func:`_restart_modemmanager`)."""
    bus = start_system_bus(world.sandbox, policy=BUS_POLICY + NM_POLICY)
    fake = FakeModemManager(bus.address, on_connect=lambda _m: silence(edge, False))
    _add_modem(fake, edge)
    await fake.start()
    edge.modem_bus = bus.address
    systemd = FakeSystemd.with_units(bus.address, {MM_UNIT: "active"})
    systemd.on_restart = lambda _unit: _restart_modemmanager(world, edge, fake)
    await systemd.start()
    world.modem_units[edge.name] = systemd
    return fake


async def _restart_modemmanager(world: World, edge: Edge, fake: FakeModemManager) -> None:
    """What a restart of ModemManager does here: it leaves the bus, comes back, probes the
    modem afresh — a modem it had lost (``modem-vanishes``) is found again — and the
    connection manager re-establishes the data session (link, address, route)."""
    await fake.close()
    await asyncio.sleep(0.5)  # probing the ports
    lost = not fake.modems
    if lost:
        _add_modem(fake, edge)
    await fake.start()
    if lost:  # the connection manager connects the modem found again
        world.give_address(edge, edge.host)


def silence(edge: Edge, on: bool) -> None:
    """The carrier drops everything to and from the edge (link and address untouched).

    ARP too: a modem's data interface is raw IP and has no neighbour traffic, while the
    lab's veth does; left alone, the carrier's ARP replies would count as received."""
    if on:
        chains = "".join(
            f" chain {hook} {{ type filter hook {hook} priority -10; policy drop; }}\n"
            for hook in ("forward", "input", "output"))
        arp = "".join(f" chain {hook} {{ type filter hook {hook} priority -10; policy drop; "
                      "}\n" for hook in ("input", "output"))
        run(["nft", "-f", "-"], ns=edge.carrier,
            input=f"table inet {SILENT} {{\n{chains}}}\ntable arp {SILENT} {{\n{arp}}}\n")
    else:
        for family in ("inet", "arp"):
            run(["nft", "delete", "table", family, SILENT], ns=edge.carrier, check=False)


def silenced(edge: Edge) -> bool:
    return run(["nft", "list", "table", "inet", SILENT], ns=edge.carrier,
               check=False).returncode == 0


def carrier_changes(edge: Edge) -> int:
    out = run(["cat", f"/sys/class/net/{edge.uplink}/carrier_changes"], ns=edge.ns,
              check=False).stdout.strip()
    return int(out) if out.isdigit() else 0


def uplink_actions(lab: Lab, edge: Edge, carrier_before: int) -> tuple[int, str]:
    """Rung actions seen from outside: Simple and Enable calls, ModemManager restarts,
    link bounces (usb and reboot are not configured in the lab)."""
    fake = lab.world.modems.get(edge.name)
    calls = len(fake.calls) if fake is not None else 0
    unit = lab.world.modem_units.get(edge.name)
    restarts = len(unit.restarts) if unit is not None else 0
    bounces = max(0, carrier_changes(edge) - carrier_before) // 2
    return calls + restarts + bounces, (
        f"{calls} ModemManager Simple/Enable call(s), {restarts} ModemManager restart(s), "
        f"{bounces} link bounce(s)")


def _uplink(lab: Lab, edge: Edge) -> tuple[str | None, str | None]:
    return lab.state(edge, "uplink"), lab.reason(edge, "uplink")


async def _settle(lab: Lab) -> tuple[list[Expectation], Edge]:
    from edgeheal.lab.observe import settle as settle_tunnels

    out = await settle_tunnels(lab)
    edge = lab.world.edges[0]
    ok = await lab.until(lambda: _uplink(lab, edge)[0] == "ok", 30, "the uplink check ok")
    return [*out, Expectation("the uplink check ok before the fault", ok,
                              f"uplink {_uplink(lab, edge)}")], edge


async def stuck_modem(lab: Lab) -> list[Expectation]:
    """The carrier silently drops the edge's traffic while the modem reports a healthy
    session; only reconnecting the data session (Simple.Connect) cures it."""
    out, edge = await _settle(lab)
    fake = lab.world.modems[edge.name]
    before = carrier_changes(edge)
    fault = lab.mark("modem_stuck")
    silence(edge, True)
    lab.note("lab", "fault: the carrier drops everything of the edge; link, address, "
             "registration, signal and bearer all still fine (a stale data session)",
             edge.name)
    bound = LAB_WINDOW + LAB_ACT_AFTER if not lab.field else 60.0 + 300.0
    slack = lab.scaled(40, 90)  # detection (interval), the ladder's own cadence, Connect
    judged = await lab.until(lambda: _uplink(lab, edge) == ("failed", "stuck"),
                             lab.scaled(LAB_WINDOW + 30, 60 + 60), "the uplink judged stuck")
    t_judged = lab.now() - fault
    if not lab.world.with_agent:  # bench/onoff.py: nothing will heal it
        return [*out, Expectation("without the agent the carrier stays silent",
                                  silenced(edge))]
    healed = await lab.until(lambda: not silenced(edge), bound + slack + 30,
                             "the modem reconnected")
    t_healed = lab.mark("modem_reconnected") - fault
    back = await lab.until(lambda: _uplink(lab, edge)[0] == "ok"
                           and lab.state(edge, "wireguard") == "ok", lab.scaled(60, 150),
                           "the uplink and the tunnel ok again")
    t_back = lab.mark("recovered") - fault
    actions, how = uplink_actions(lab, edge, before)
    return [*out,
            Expectation("the uplink was judged stuck (not no_coverage, not unknown)", judged,
                        f"{t_judged:.1f}s after the fault" if judged
                        else f"uplink {_uplink(lab, edge)}"),
            Expectation(f"the data session was reconnected through ModemManager after "
                        f"window + act_after ({bound:g}s) and within {slack:g}s of it",
                        healed and bound <= t_healed <= bound + slack,
                        f"{t_healed:.1f}s after the fault" if healed else "never"),
            Expectation("reconnected with the bearer's own settings (APN, user, password)",
                        bool(fake.connects) and all(
                            c.get("apn") == APN and c.get("user") == USER
                            for c in fake.connects),
                        f"{len(fake.connects)} Connect(s)"),
            Expectation("the uplink and the tunnel ok again after the reconnect", back,
                        f"{t_back:.1f}s after the fault" if back else "never"),
            Expectation("one rung was enough: exactly one Disconnect + Connect, no bounce",
                        actions == 2 and [m for m, _ in fake.calls] == ["Disconnect",
                                                                       "Connect"], how),
            Expectation("no Flannel restart", not lab.world.kube.deletions,
                        f"{len(lab.world.kube.deletions)} pod deletions")]


async def no_coverage(lab: Lab) -> list[Expectation]:
    """The modem loses the network (bearer down, searching, no signal) for longer than
    the ladder would wait on a stuck modem; the agent only alerts."""
    out, edge = await _settle(lab)
    fake = lab.world.modems[edge.name]
    modem = fake.modems[0]
    before = carrier_changes(edge)
    seen = len(lab.world.alerts())
    lab.mark("coverage_lost")
    silence(edge, True)
    fake.lose_coverage(modem)
    lab.note("lab", "fault: no coverage: the modem searches with no signal, its bearer is "
             "down, nothing passes", edge.name)
    span = lab.scaled(LAB_WINDOW + LAB_ACT_AFTER + 30, 60 + 300 + 60)
    # the modem is asked once the uplink is not plainly fine: here, when silence reaches
    # [uplink] window (the address survives the lost cell), plus one interval
    judged = await lab.until(lambda: _uplink(lab, edge) == ("failed", "no_coverage"),
                             lab.scaled(30, 60 + 10 + 30), "the uplink judged no_coverage")
    await lab.hold(max(0.0, lab.marks["coverage_lost"] + span - lab.now()))
    reasons = {str(s.get("checks", {}).get("uplink")) for s in lab.views[edge.name].samples}
    during, how = uplink_actions(lab, edge, before)
    # coverage returns; the modem's connection manager reconnects on its own
    fake.set_signal(modem, 70)
    fake.set_registration(modem, "home")
    fake.set_state(modem, "registered")
    for bearer in modem.bearers:
        fake.set_bearer(bearer, True)
    fake.set_state(modem, "connected")
    silence(edge, False)
    lab.mark("coverage_back")
    lab.note("lab", "coverage is back; the modem reconnected by itself", edge.name,
             marker="fault_end")
    back = await lab.until(lambda: _uplink(lab, edge)[0] == "ok", lab.scaled(60, 120),
                           "the uplink ok again")
    await lab.until(lambda: any(a.get("kind") == "uplink.no_coverage"
                                for a in lab.world.alerts()[seen:]), lab.scaled(60, 120),
                    "the no_coverage alert")
    kinds = sorted({str(a.get("kind")) for a in lab.world.alerts()[seen:]})
    return [*out,
            Expectation("the uplink was judged no_coverage", judged,
                        f"uplink states seen: {sorted(reasons)}"),
            Expectation(f"zero uplink actions over {span:g}s without coverage "
                        "(longer than window + act_after)", during == 0, how),
            Expectation("the no_coverage alert reached the subscriber",
                        "uplink.no_coverage" in kinds, f"kinds: {kinds}"),
            Expectation("the uplink ok again once coverage returned", back),
            Expectation("no Flannel restart", not lab.world.kube.deletions,
                        f"{len(lab.world.kube.deletions)} pod deletions")]


async def modem_vanishes(lab: Lab) -> list[Expectation]:
    """ModemManager loses the modem and the session with it; only restarting ModemManager
    finds it again."""
    out, edge = await _settle(lab)
    fake, unit = lab.world.modems[edge.name], lab.world.modem_units[edge.name]
    before = carrier_changes(edge)
    seen = len(lab.world.alerts())
    fault = lab.mark("modem_vanished")
    fake.remove_modem(fake.modems[0])
    run(["ip", "link", "del", edge.uplink], ns=edge.ns)
    lab.note("lab", "fault: the modem's firmware crashed: it left the USB bus and "
             "ModemManager with it (`mmcli -L`: no modem), the uplink is gone", edge.name)
    await lab.hold(3.0)
    lab.world.recreate_uplink(edge)
    lab.world.drop_address(edge)
    lab.note("lab", "the modem re-enumerated (a new uplink, offload on), but ModemManager, "
             "wedged on the old device, does not probe it: no modem, no data session",
             edge.name)
    absent_after = LAB_ABSENT_AFTER if not lab.field else 120.0
    # the first look at ModemManager comes with the first run that sees the link down
    judged = await lab.until(lambda: _uplink(lab, edge) == ("failed", "modem_absent"),
                             lab.scaled(absent_after + 30, absent_after + 60),
                             "the uplink judged modem_absent")
    t_judged = lab.now() - fault
    if not lab.world.with_agent:  # bench/onoff.py: nothing will bring it back
        return [*out, Expectation("without the agent the modem stays lost",
                                  not fake.modems)]
    grace = 0.0 if not lab.field else max(0.0, 300.0 - (fault - lab.marks.get(
        "agent_started", 0.0)))
    bound = max(absent_after, grace)
    slack = lab.scaled(40, 90)
    restarted = await lab.until(lambda: bool(unit.restarts), bound + slack + 30,
                                "ModemManager restarted")
    t_restart = lab.mark("modemmanager_restarted") - fault
    back = await lab.until(lambda: _uplink(lab, edge)[0] == "ok"
                           and lab.state(edge, "wireguard") == "ok", lab.scaled(60, 150),
                           "the uplink and the tunnel ok again")
    t_back = lab.mark("recovered") - fault
    await lab.until(lambda: any(a.get("kind") == "uplink.modem_absent"
                                for a in lab.world.alerts()[seen:]), lab.scaled(30, 60),
                    "the modem_absent alert")
    kinds = sorted({str(a.get("kind")) for a in lab.world.alerts()[seen:]})
    actions, how = uplink_actions(lab, edge, before)
    return [*out,
            Expectation(f"the uplink was judged modem_absent after modem_absent_after "
                        f"({absent_after:g}s), not link_down for ever", judged
                        and t_judged >= absent_after,
                        f"{t_judged:.1f}s after the fault" if judged
                        else f"uplink {_uplink(lab, edge)}"),
            Expectation(f"ModemManager restarted (modemmanager-restart) within {slack:g}s "
                        "of the verdict's bound", restarted
                        and bound <= t_restart <= bound + slack,
                        f"{t_restart:.1f}s after the fault" if restarted else "never"),
            Expectation("the uplink and the tunnel ok again after the restart (verified)",
                        back, f"{t_back:.1f}s after the fault" if back else "never"),
            Expectation("the modem_absent alert reached the subscriber",
                        "uplink.modem_absent" in kinds, f"kinds: {kinds}"),
            Expectation("one rung was enough: one ModemManager restart, no session or "
                        "radio call, no bounce", actions == 1 and unit.restarts == [MM_UNIT]
                        and not fake.calls, how),
            Expectation("no Flannel restart", not lab.world.kube.deletions,
                        f"{len(lab.world.kube.deletions)} pod deletions")]


async def nm_stuck_modem(lab: Lab) -> list[Expectation]:
    """The stuck modem where NetworkManager owns it: cured through NetworkManager."""
    out, edge = await _settle(lab)
    fake = lab.world.modems[edge.name]
    nm = FakeNetworkManager(fake.address, devices={edge.uplink: True},
                            on_activate=lambda _iface: silence(edge, False))
    await nm.start()
    lab.world.modem_units[f"{edge.name}/nm"] = nm
    before = carrier_changes(edge)
    profile = nm.by_iface[edge.uplink].connection
    fault = lab.mark("nm_modem_stuck")
    silence(edge, True)
    lab.note("lab", "fault: the carrier drops everything of the edge; NetworkManager owns "
             "the modem; link, address, registration, signal and bearer all still fine",
             edge.name)
    bound = LAB_WINDOW + LAB_ACT_AFTER if not lab.field else 60.0 + 300.0
    slack = lab.scaled(40, 90)
    judged = await lab.until(lambda: _uplink(lab, edge) == ("failed", "stuck"),
                             lab.scaled(LAB_WINDOW + 30, 60 + 60), "the uplink judged stuck")
    t_judged = lab.now() - fault
    if not lab.world.with_agent:
        return [*out, Expectation("without the agent the carrier stays silent",
                                  silenced(edge))]
    healed = await lab.until(lambda: not silenced(edge), bound + slack + 30,
                             "the connection re-activated through NetworkManager")
    t_healed = lab.mark("nm_reactivated") - fault
    back = await lab.until(lambda: _uplink(lab, edge)[0] == "ok"
                           and lab.state(edge, "wireguard") == "ok", lab.scaled(60, 150),
                           "the uplink and the tunnel ok again")
    t_back = lab.mark("recovered") - fault
    actions, how = uplink_actions(lab, edge, before)
    nm_calls = [m for m, _ in nm.calls]
    return [*out,
            Expectation("the uplink was judged stuck", judged,
                        f"{t_judged:.1f}s after the fault" if judged
                        else f"uplink {_uplink(lab, edge)}"),
            Expectation(f"the modem's connection re-activated through NetworkManager after "
                        f"window + act_after ({bound:g}s) and within {slack:g}s of it",
                        healed and bound <= t_healed <= bound + slack,
                        f"{t_healed:.1f}s after the fault" if healed else "never"),
            Expectation("through NetworkManager only: one Deactivate + Activate of its own "
                        "profile, no ModemManager call behind its back, no bounce",
                        nm_calls == ["Deactivate", "Activate"]
                        and nm.calls[-1] == ("Activate", profile) and actions == 0,
                        f"NetworkManager: {nm_calls}; {how}"),
            Expectation("the uplink and the tunnel ok again after the re-activation", back,
                        f"{t_back:.1f}s after the fault" if back else "never"),
            Expectation("no Flannel restart", not lab.world.kube.deletions,
                        f"{len(lab.world.kube.deletions)} pod deletions")]


async def registration_denied(lab: Lab) -> list[Expectation]:
    """The network refuses the SIM (a plan without data) for longer than the ladder waits;
    one radio off/on, then only the alert, until the operator fixes the plan."""
    out, edge = await _settle(lab)
    fake, unit = lab.world.modems[edge.name], lab.world.modem_units[edge.name]
    modem = fake.modems[0]
    before = carrier_changes(edge)
    seen = len(lab.world.alerts())
    fault = lab.mark("registration_denied")
    silence(edge, True)
    fake.deny_registration(modem, 33)  # requested-service-option-not-subscribed
    lab.note("lab", "fault: the network denies registration (reject cause 33: no data in "
             "the subscription); the session drops, nothing passes", edge.name)
    act_after = LAB_ACT_AFTER if not lab.field else 300.0
    window = LAB_WINDOW if not lab.field else 60.0
    judged = await lab.until(lambda: _uplink(lab, edge) == ("failed", "registration_denied"),
                             lab.scaled(window + 30, window + 60),
                             "the uplink judged registration_denied")
    t_judged = lab.now() - fault
    slack = lab.scaled(40, 90)
    bound = window + act_after
    # when the operator fixes the plan: the same moment with and without the agent (the
    # agent cannot cure a refused plan; bench/onoff.py compares like for like)
    fixed_at = fault + bound + slack + lab.scaled(30 + 40, 90 + 240)
    if not lab.world.with_agent:
        await lab.hold(max(0.0, fixed_at - lab.now()))
        was = f"registration {modem.registration}, carrier silent: {silenced(edge)}"
        stood = (modem.registration, silenced(edge)) == ("denied", True)
        _fix_plan(lab, edge, fake, modem)
        return [*out, Expectation("without the agent the refusal stands until the plan is "
                                  "fixed", stood, was)]
    cycled = await lab.until(lambda: ("Enable", modem.path) in fake.calls,
                             bound + slack + 30, "the radio cycled")
    t_cycled = lab.mark("radio_cycled") - fault
    # then: the rung does not cure (verify_timeout), the circuit opens, nothing more is
    # tried for a long hold; the alerts wait in the outbox (the uplink carries them)
    await lab.hold(max(0.0, fixed_at - lab.now()))
    during, how = uplink_actions(lab, edge, before)
    calls = [m for m, _ in fake.calls]
    _fix_plan(lab, edge, fake, modem)
    back = await lab.until(lambda: _uplink(lab, edge)[0] == "ok", lab.scaled(60, 120),
                           "the uplink ok again")
    wanted = {"uplink.registration_denied", "uplink_ladder.circuit_open"}
    await lab.until(lambda: wanted <= {a.get("kind") for a in lab.world.alerts()[seen:]},
                    lab.scaled(60, 120), "the alerts, once the uplink carries them")
    kinds = sorted({str(a.get("kind")) for a in lab.world.alerts()[seen:]})
    opened = "uplink_ladder.circuit_open" in kinds
    return [*out,
            Expectation("the uplink was judged registration_denied (not no_coverage)",
                        judged, f"{t_judged:.1f}s after the fault" if judged
                        else f"uplink {_uplink(lab, edge)}"),
            Expectation(f"one radio-cycle after window + act_after ({bound:g}s), within "
                        f"{slack:g}s of it", cycled and bound <= t_cycled <= bound + slack,
                        f"{t_cycled:.1f}s after the fault" if cycled else "never"),
            Expectation("then the circuit opened: a person is needed (its alert delivered "
                        "once the uplink was back)", opened, f"kinds: {kinds}"),
            Expectation("exactly one radio off/on and nothing else: no session call, no "
                        "ModemManager restart, no bounce, no reboot",
                        calls == ["Disable", "Enable"] and not unit.restarts
                        and during == 2, how),
            Expectation("the registration_denied alert reached the subscriber",
                        "uplink.registration_denied" in kinds, f"kinds: {kinds}"),
            Expectation("the uplink ok again once the plan was fixed", back),
            Expectation("no Flannel restart", not lab.world.kube.deletions,
                        f"{len(lab.world.kube.deletions)} pod deletions")]


def _fix_plan(lab: Lab, edge: Edge, fake: FakeModemManager, modem: FakeModem) -> None:
    """The operator tops the plan up; the modem registers, its connection manager
    connects."""
    fake.deny_registration(modem, 0)
    fake.set_state(modem, "searching")
    fake.register(modem)  # the modem retries; the network accepts it now
    for bearer in modem.bearers:
        fake.set_bearer(bearer, True)
    fake.set_state(modem, "connected")
    silence(edge, False)
    lab.mark("plan_fixed")
    lab.note("lab", "the operator fixed the plan: the modem registers and reconnects",
             edge.name, marker="fault_end")


def zero_uplink_actions(lab: Lab, carrier_before: int) -> Expectation:
    """For the outage scenarios run with a modem: the ladder never acted."""
    edge = lab.world.edges[0]
    count, how = uplink_actions(lab, edge, carrier_before)
    return Expectation("zero uplink actions (an outage shorter than window + act_after)",
                       count == 0, how)
