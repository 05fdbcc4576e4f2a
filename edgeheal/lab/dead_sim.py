"""The lab's ``dead-sim`` scenario: a dual-SIM modem whose first SIM the network refuses.

The network denies slot 1's SIM (reject cause 33, "requested service option not
subscribed": a plan without data) and nothing passes; slot 2 holds a SIM that works. The
uplink ladder, with the opt-in ``sim-switch`` rung and ``sim_slots = [1, 2]``, cycles the
radio once (the denial's first rung: never a switch first), which does not cure, then
makes slot 2 primary: the stand-in ModemManager re-probes the modem as ModemManager does
(:mod:`edgeheal.lab.sim_slots`), the rung connects the new modem object with the old
bearer's settings, and the carrier carries the edge's traffic again (the stand-in's
``on_connect``). Without the agent the refusal stands until an operator switches the SIM
by hand, at the same moment the with-agent run has had its chance (bench/onoff.py compares
like for like).
"""

from __future__ import annotations

from edgeheal.lab.modems import (
    LAB_ACT_AFTER,
    LAB_WINDOW,
    _settle,
    _uplink,
    carrier_changes,
    silence,
    silenced,
)
from edgeheal.lab.runner import Expectation, Lab
from edgeheal.lab.sim_slots import set_primary_sim_slot

LADDER = """rungs = ["modem-reconnect", "radio-cycle", "link-bounce", "modemmanager-restart",
         "sim-switch"]
sim_slots = [1, 2]
"""
"""The scenario's ``[remediation.uplink]`` keys: the default rungs plus ``sim-switch``."""
DENIED = 33  # requested-service-option-not-subscribed


async def dead_sim(lab: Lab) -> list[Expectation]:
    out, edge = await _settle(lab)
    fake, unit = lab.world.modems[edge.name], lab.world.modem_units[edge.name]
    modem = fake.modems[0]
    modem.slots, modem.primary_slot, modem.slot_denied = 2, 1, {1: DENIED}
    before = carrier_changes(edge)
    fault = lab.mark("sim_refused")
    silence(edge, True)
    fake.deny_registration(modem, DENIED)
    lab.note("lab", "fault: the network denies slot 1's SIM (reject cause 33); slot 2's "
             "works", edge.name)
    act_after = LAB_ACT_AFTER if not lab.field else 300.0
    window = LAB_WINDOW if not lab.field else 60.0
    judged = await lab.until(lambda: _uplink(lab, edge) == ("failed", "registration_denied"),
                             lab.scaled(window + 30, window + 60),
                             "the uplink judged registration_denied")
    t_judged = lab.now() - fault
    bound = window + act_after
    slack = lab.scaled(40, 90)
    # radio-cycle, its verify_timeout, the cooldown, then the switch (lab: 30 s + 20 s)
    switch_by = bound + slack + lab.scaled(30 + 20 + 40, 90 + 120 + 240)
    if not lab.world.with_agent:
        await lab.hold(max(0.0, fault + switch_by - lab.now()))
        was = f"registration {modem.registration}, carrier silent: {silenced(edge)}"
        stood = (modem.registration, silenced(edge)) == ("denied", True)
        await _switch_by_hand(lab, modem)
        return [*out, Expectation("without the agent the refusal stands until an operator "
                                  "switches the SIM", stood, was)]
    switched = await lab.until(lambda: ("SetPrimarySimSlot", modem.path) in fake.calls,
                               switch_by + 30, "the SIM switched")
    t_switched = lab.mark("sim_switched") - fault
    back = await lab.until(lambda: not silenced(edge) and _uplink(lab, edge)[0] == "ok",
                           lab.scaled(60, 120), "the uplink ok again on slot 2")
    t_back = lab.now() - fault
    calls = [m for m, _ in fake.calls]
    bounces = max(0, carrier_changes(edge) - before) // 2
    now = fake.modems[0] if fake.modems else None
    return [*out,
            Expectation("the uplink was judged registration_denied", judged,
                        f"{t_judged:.1f}s after the fault" if judged
                        else f"uplink {_uplink(lab, edge)}"),
            Expectation("one radio off/on first, then the SIM switch, then the connect, and "
                        "nothing else (no ModemManager restart, no bounce)",
                        calls == ["Disable", "Enable", "SetPrimarySimSlot", "Connect"]
                        and not unit.restarts and bounces == 0,
                        f"calls {calls}, {len(unit.restarts)} restarts, {bounces} bounces"),
            Expectation("the switch came after window + act_after and the radio's "
                        "verify_timeout", switched and t_switched >= bound + 30,
                        f"{t_switched:.1f}s after the fault" if switched else "never"),
            Expectation("the re-probed modem is on slot 2, registered, connected",
                        now is not None and (now.primary_slot, now.registration, now.state)
                        == (2, "home", "connected"),
                        f"{now.primary_slot, now.registration, now.state}" if now else
                        "no modem"),
            Expectation("the uplink and the tunnel ok again", back,
                        f"{t_back:.1f}s after the fault" if back else "never"),
            Expectation("no Flannel restart", not lab.world.kube.deletions,
                        f"{len(lab.world.kube.deletions)} pod deletions")]


async def _switch_by_hand(lab: Lab, modem: object) -> None:
    """The operator's ``mmcli --set-primary-sim-slot=2``, then the connection manager
    connects the re-probed modem."""
    import asyncio

    from edgeheal.lab.modemmanager import FakeModem

    assert isinstance(modem, FakeModem)  # noqa: S101 - lab invariant
    fake = lab.world.modems[lab.world.edges[0].name]
    await set_primary_sim_slot(fake, modem, 2)
    for _ in range(100):
        if fake.modems and fake.modems[0].primary_slot == 2:
            break
        await asyncio.sleep(0.1)
    new = fake.modems[0]
    props = dict(modem.bearers[0].properties)
    await fake.simple_connect(new, props)
    lab.mark("sim_switched_by_hand")
    lab.note("lab", "an operator switched the SIM to slot 2 by hand", marker="fault_end")
