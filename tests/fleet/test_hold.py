"""The fleet hold (issue 33): the message's bounds, the framer that lets exactly its topic
through, the Flannel ladder's ``fleet_hold`` skip and the actor that reads the link's last
message (refused ones alerted once, expired ones ignored). The real broker path is
tests/mqtt/test_fleet_hold.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from edgeheal.agent.remediation import Remediator
from edgeheal.base.compat import UTC
from edgeheal.boundaries.mqtt import hold
from edgeheal.boundaries.mqtt.transport import Framer, FramingError
from edgeheal.config import RemediationSettings
from edgeheal.core.flannel_ladder import History, TunnelView, decide
from edgeheal.model import FleetHold, State
from tests.remediation.support import NO_KUBE_SIDE, Clock, ScriptedRemedy, World, make_config
from tests.support import WALL0

NOW = datetime(2026, 12, 4, 19, 0, tzinfo=UTC)
TOPIC = b"edgeheal/fleet/hold"


def _until(minutes: float) -> str:
    return (NOW + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_hold_round_trips_and_an_empty_message_is_a_release() -> None:
    payload = hold.encode("hub wg0 down, INC-1", NOW + timedelta(minutes=30), "ops")
    assert json.loads(payload) == {"reason": "hub wg0 down, INC-1", "until": _until(30),
                                   "by": "ops"}
    got = hold.parse(payload, NOW, 3600)
    assert (got.reason, got.until, got.by) == ("hub wg0 down, INC-1",
                                               NOW + timedelta(minutes=30), "ops")
    assert hold.parse(b"", NOW, 3600).until is None


@pytest.mark.parametrize(("payload", "said"), [
    (b"hold!", "not JSON"),
    (b"[1]", "not a JSON object (list)"),
    (b"[" * 100_000, "bytes, more than 1024"),
    (json.dumps({"reason": "x", "until": _until(5), "why": 1}).encode(), "unknown key(s) 'why'"),
    (json.dumps({"reason": "x"}).encode(), '"until" is missing'),
    (json.dumps({"reason": "x", "until": "tomorrow"}).encode(), "not an RFC 3339 time"),
    (json.dumps({"reason": "x", "until": "2026-12-04T20:00:00"}).encode(), "no time zone"),
    (json.dumps({"reason": "", "until": _until(5)}).encode(), '"reason" is empty'),
    (json.dumps({"reason": "a\x1b[2J", "until": _until(5)}).encode(), '"reason" must be'),
    (json.dumps({"reason": 5, "until": _until(5)}).encode(), '"reason" must be'),
    (json.dumps({"reason": "x", "until": _until(61)}).encode(),
     "it would hold for 3660s, more than [fleet] max_hold (3600s)"),
])
def test_a_message_that_is_not_a_bounded_hold_is_refused_saying_why(payload: bytes,
                                                                     said: str) -> None:
    with pytest.raises(hold.HoldRefused) as err:
        hold.parse(payload, NOW, 3600)
    assert said in str(err.value)


def _publish(topic: bytes, payload: bytes = b"{}", qos: int = 1) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + (b"\x00\x01" if qos else b"") + payload
    assert len(body) < 128
    return bytes([0x30 | qos << 1, len(body)]) + body


CONNACK = b"\x20\x02\x00\x00"


def test_the_framer_lets_exactly_the_hold_topic_through_in_any_split() -> None:
    stream = CONNACK + _publish(TOPIC) + _publish(TOPIC, qos=0) + b"\xd0\x00"
    for cut in range(1, len(stream)):
        framer = Framer(accept=TOPIC)
        framer.feed(stream[:cut])
        framer.feed(stream[cut:])
        assert (framer.accepted, framer.packets) == (2, 4)


@pytest.mark.parametrize(("accept", "packet", "said"), [
    (None, _publish(TOPIC), "subscribes to nothing"),
    (TOPIC, _publish(b"edgeheal/fleet/holdX"), "never subscribed to"),
    (TOPIC, _publish(b"edgeheal/fleet/hol"), "never subscribed to"),
    (TOPIC, _publish(b"other/topic/x/y/z/w"), "never subscribed to"),
    (TOPIC, _publish(TOPIC, qos=2), "QoS 2"),
    (TOPIC, b"\x32\x91\x10", "PUBLISH; a fleet hold is at most 2048 bytes"),
])
def test_the_framer_refuses_every_other_publish(accept: bytes | None, packet: bytes,
                                                said: str) -> None:
    framer = Framer(accept=accept)
    with pytest.raises(FramingError, match=said.replace("(", r"\(")):
        framer.feed(CONNACK + packet)


SETTINGS = RemediationSettings(cooldown=120.0, max_per_hour=3, startup_grace=60.0,
                               give_up_after=3)
FAILED = TunnelView(mode="pod", wireguard=State.FAILED, wireguard_reason="stalled",
                    tunnel_mqtt={"broker-tunnel": State.OK},
                    direct_mqtt={"broker-direct": State.OK}, booted_mono=-10_000.0)


def test_the_ladder_skips_while_the_fleet_holds_and_the_operator_pause_comes_first() -> None:
    held = replace(FAILED, fleet_hold="hub down, until 2026-12-04T20:00:00Z")
    (action,) = decide(held, History(), 1000.0, SETTINGS)
    assert (action.kind, action.reason) == ("skip", "fleet_hold")
    assert "hub down" in action.message
    (paused,) = decide(held, History(paused_until=2000.0), 1000.0, SETTINGS)
    assert paused.reason == "paused"
    (go,) = decide(FAILED, History(), 1000.0, SETTINGS)
    assert go.kind == "restart"


@dataclass
class FakeLink:
    """The alert link as the actor reads it (its broker side: tests/mqtt)."""

    fleet_hold: FleetHold | None = None


def _actor(tmp_path: Path, link: FakeLink, hold_on: bool = True) -> tuple[World, Remediator,
                                                                          ScriptedRemedy]:
    world = World(make_config(tmp_path, 'mode = "pod"', kube=(
        NO_KUBE_SIDE + '[alerts]\ntarget = "broker-direct"\n' + ("[fleet]\nhold = true\n" if hold_on
                                                 else ""))), Clock(step=0.001))
    world.ctx = replace(world.ctx, alert_link=link)  # type: ignore[arg-type]
    remedy = ScriptedRemedy("pod")
    remedy.on_restart = world.recover_after_restart
    rem = Remediator(world.ctx, remedy_factory={"pod": remedy}.get,
                     boot_clock=lambda: world.clock.now + 4000.0, boot="boot-a", tick=0.001)
    return world, rem, remedy


async def test_the_actor_obeys_a_hold_says_it_once_and_restarts_when_it_expires(
        tmp_path: Path) -> None:
    wall = WALL0  # the fake clock's wall time at its start
    link = FakeLink(FleetHold("hub down", wall + timedelta(seconds=30), "ops"))
    world, rem, remedy = _actor(tmp_path, link)
    await rem.resolve()
    for _ in range(3):
        (action,) = await rem.evaluate(world.snap)
        assert (action.kind, action.reason) == ("skip", "fleet_hold")
    assert remedy.calls == 0
    assert world.kinds().count("remediation.skipped") == 1  # once per node and episode
    assert world.metric("skip", "fleet_hold") == 1.0
    assert rem.view()["fleet_hold"].startswith("hub down by ops, until ")
    world.clock.now += 31  # the hold expires on its own: no release needed
    (action,) = await rem.evaluate(world.snap)
    assert action.kind == "restart"
    assert remedy.calls == 1
    assert rem.view()["fleet_hold"] is None


async def test_a_refused_message_is_alerted_once_and_not_obeyed(tmp_path: Path) -> None:
    link = FakeLink(FleetHold("", None, refused="not JSON", received=WALL0))
    world, rem, _remedy = _actor(tmp_path, link)
    await rem.resolve()
    (action,) = await rem.evaluate(world.snap)
    assert action.kind == "restart"
    await rem.evaluate(world.snap)
    refused = [e for e in world.events if e.kind == "fleet.hold_refused"]
    assert len(refused) == 1
    assert refused[0].detail["why"] == "not JSON"


async def test_without_fleet_hold_on_a_held_link_changes_nothing(tmp_path: Path) -> None:
    link = FakeLink(FleetHold("hub down", WALL0 + timedelta(hours=1)))
    world, rem, _remedy = _actor(tmp_path, link, hold_on=False)
    await rem.resolve()
    (action,) = await rem.evaluate(world.snap)
    assert action.kind == "restart"
    assert "fleet_hold" not in rem.view()
