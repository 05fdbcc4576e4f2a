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

Rung actions are counted from outside, whatever the agent reports: ``Simple`` calls the
stand-in received, and the uplink's ``carrier_changes`` (a link bounce adds two).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeheal.lab.modemmanager import BUS_POLICY, FakeModemManager
from edgeheal.lab.netns import run
from edgeheal.lab.runner import Expectation, Lab
from edgeheal.lab.systemd_bus import start_system_bus

if TYPE_CHECKING:
    from edgeheal.lab.world import Edge, World

LAB_WINDOW = 10.0
"""[uplink] window in the lab: nothing passing this long is silence (2 keepalives)."""
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

[remediation.uplink]
enabled = true
act_after = "{LAB_ACT_AFTER:g}s"
cooldown = "20s"
startup_grace = "10s"
verify_timeout = "30s"
"""


async def start_modem(world: World, edge: Edge) -> FakeModemManager:
    """The edge's modem on its own bus; its Simple.Connect heals a silent carrier."""
    bus = start_system_bus(world.sandbox, policy=BUS_POLICY)
    fake = FakeModemManager(bus.address, on_connect=lambda _m: silence(edge, False))
    fake.add_modem(f"/sys/devices/platform/edgeheal-lab/usb{edge.index + 1}/"
                   f"{edge.index + 1}-1", edge.uplink, apn="lab.internet", user="edge",
                   password=f"lab-{edge.index}-not-a-secret")
    await fake.start()
    edge.modem_bus = bus.address
    return fake


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
    """Rung actions seen from outside: Simple calls, link bounces (usb and reboot are not
    configured in the lab)."""
    fake = lab.world.modems.get(edge.name)
    calls = len(fake.calls) if fake is not None else 0
    bounces = max(0, carrier_changes(edge) - carrier_before) // 2
    return calls + bounces, f"{calls} ModemManager Simple call(s), {bounces} link bounce(s)"


def _uplink(lab: Lab, edge: Edge) -> tuple[str | None, str | None]:
    return lab.state(edge, "uplink"), lab.reason(edge, "uplink")


async def _settle(lab: Lab) -> tuple[list[Expectation], Edge]:
    from edgeheal.lab.scenarios import _settle as settle_tunnels

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
                            c.get("apn") == "lab.internet" and c.get("user") == "edge"
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


def zero_uplink_actions(lab: Lab, carrier_before: int) -> Expectation:
    """For the outage scenarios run with a modem: the ladder never acted."""
    edge = lab.world.edges[0]
    count, how = uplink_actions(lab, edge, carrier_before)
    return Expectation("zero uplink actions (an outage shorter than window + act_after)",
                       count == 0, how)
