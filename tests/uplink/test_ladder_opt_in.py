"""The uplink ladder's two opt-in rungs, ``driver-rebind`` and ``sim-switch``: where each
sits for each verdict, that a SIM switch is never an episode's first rung, and that a
denial climbs from the one radio off/on to the other SIM and never further."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from edgeheal.core import uplink_ladder as uplink
from edgeheal.core.safeguards import History, Record
from edgeheal.core.uplink_ladder import decide, episode_rungs
from tests.support import Clock
from tests.uplink.test_ladder import NOW, SETTINGS, kinds, view

EIGHT = ("modem-reconnect", "radio-cycle", "link-bounce", "modemmanager-restart",
         "driver-rebind", "usb-reauthorize", "sim-switch", "reboot")
"""Every rung, in the order docs/remediation-uplink.md recommends."""


def tried(rung: str, reason: str, mono: float, result: str = "not_recovered") -> Record:
    return Record(mono=mono, wall="2026-01-01T00:00:00.000Z", mode=rung, reason=reason,
                  result=result, duration=5.0)


def walk(reason: str, rungs: tuple[str, ...], give_up_after: int = 8) -> list[str]:
    """The rungs an episode of ``reason`` tries, none curing, until the circuit opens."""
    settings = replace(SETTINGS, give_up_after=give_up_after, max_per_hour=60)
    clock = Clock(now=NOW)
    hist, used = History(), []
    for _ in range(20):
        (action,) = decide(view(reason=reason, rungs=rungs), hist, clock.now, settings)
        if action.kind == "restart":
            used.append(action.rung)
            hist = hist.with_record(tried(action.rung, action.reason, clock.now))
        elif action.kind == "open_circuit":
            return used
        else:
            assert action.kind == "skip", action
        clock.advance(130.0)
    raise AssertionError(f"the circuit never opened: {used}")


@pytest.mark.parametrize(("reason", "want"), [
    ("stuck", ["modem-reconnect", "radio-cycle", "link-bounce", "driver-rebind",
               "usb-reauthorize", "sim-switch", "reboot"]),
    ("modem_absent", ["modemmanager-restart", "driver-rebind", "usb-reauthorize", "reboot"]),
    ("modem_failed", ["modemmanager-restart", "driver-rebind", "usb-reauthorize", "reboot"]),
    ("registration_denied", ["radio-cycle", "sim-switch"]),
])
def test_every_rung_configured_each_verdict_walks_its_own_then_opens_the_circuit(
        reason: str, want: list[str]) -> None:
    assert walk(reason, EIGHT) == want


def test_the_driver_rebind_comes_before_the_usb_device_and_never_for_a_denial() -> None:
    for reason in ("stuck", "modem_absent", "modem_failed"):
        table = uplink.RUNGS_FOR[reason]
        assert table.index("driver-rebind") < table.index("usb-reauthorize")
    assert "driver-rebind" not in uplink.RUNGS_FOR["registration_denied"]
    assert "sim-switch" not in uplink.RUNGS_FOR["modem_absent"]
    assert "sim-switch" not in uplink.RUNGS_FOR["modem_failed"]


# (id, usable rungs, verdict, expected episode)
EPISODES: list[tuple[str, tuple[str, ...], str, tuple[str, ...]]] = [
    ("configured first, the switch goes second", ("sim-switch", "radio-cycle"),
     "registration_denied", ("radio-cycle", "sim-switch")),
    ("configured first for stuck, it goes second", ("sim-switch", "modem-reconnect", "reboot"),
     "stuck", ("modem-reconnect", "sim-switch", "reboot")),
    ("alone, it stays alone (decide refuses it)", ("sim-switch",), "registration_denied",
     ("sim-switch",)),
    ("not the verdict's rung, it is left out", ("sim-switch", "modemmanager-restart"),
     "modem_absent", ("modemmanager-restart",)),
    ("later in the order, the order holds", ("radio-cycle", "link-bounce", "sim-switch"),
     "stuck", ("radio-cycle", "link-bounce", "sim-switch")),
]


@pytest.mark.parametrize(("usable", "reason", "want"), [c[1:] for c in EPISODES],
                         ids=[c[0] for c in EPISODES])
def test_a_sim_switch_is_never_an_episodes_first_rung(
        usable: tuple[str, ...], reason: str, want: tuple[str, ...]) -> None:
    assert episode_rungs(usable, reason) == want


# (id, view overrides, history, expected)
CASES: list[tuple[str, dict[str, Any], History, list[tuple[str, str, str]]]] = [
    ("a denial with only sim-switch usable: no rung, said (never a switch first)",
     {"reason": "registration_denied", "rungs": ("sim-switch",)}, History(),
     [("skip", "no_rung", "")]),
    ("stuck with only sim-switch usable: no rung either",
     {"rungs": ("sim-switch",)}, History(), [("skip", "no_rung", "")]),
    ("a denial the radio-cycle did not cure: the other SIM, within the hour (the hourly "
     "gate is the radio's)", {"reason": "registration_denied", "rungs": EIGHT},
     History((tried("radio-cycle", "registration_denied", NOW - 200),), failures_in_row=1),
     [("restart", "registration_denied", "sim-switch")]),
    ("a denial the switch did not cure either: the circuit opens, never a reboot",
     {"reason": "registration_denied", "rungs": EIGHT},
     History((tried("radio-cycle", "registration_denied", NOW - 400),
              tried("sim-switch", "registration_denied", NOW - 200)), failures_in_row=2),
     [("open_circuit", "registration_denied", "")]),
    ("a denial again within the hour after a cure by the switch: the radio's gate holds",
     {"reason": "registration_denied", "rungs": EIGHT},
     History((tried("radio-cycle", "registration_denied", NOW - 1800),
              tried("sim-switch", "registration_denied", NOW - 1600, "recovered"))),
     [("skip", "denied_once_an_hour", "")]),
    ("a vanished modem after ModemManager's restart: the driver before the USB device",
     {"reason": "modem_absent", "rungs": EIGHT},
     History((tried("modemmanager-restart", "modem_absent", NOW - 500),), failures_in_row=1),
     [("restart", "modem_absent", "driver-rebind")]),
    ("stuck after the link bounce: the driver", {"rungs": EIGHT},
     History(tuple(tried(r, "uplink_stuck", NOW - 900 + 130 * i) for i, r in
                   enumerate(("modem-reconnect", "radio-cycle", "link-bounce"))),
             failures_in_row=3), [("restart", "uplink_stuck", "driver-rebind")]),
]


@pytest.mark.parametrize(("overrides", "hist", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_the_opt_in_rungs_decide(overrides: dict[str, Any], hist: History,
                                 expected: list[tuple[str, str, str]]) -> None:
    settings = replace(SETTINGS, give_up_after=8)
    actions = decide(view(**overrides), hist, NOW, settings)
    assert kinds(actions) == expected
    assert all(a.message for a in actions)
    if expected[0][1] == "no_rung" and overrides.get("rungs") == ("sim-switch",):
        assert "never a SIM switch" in actions[0].message
