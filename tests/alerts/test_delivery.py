"""Delivery through a real Mosquitto: order, outage, retained status, will, clean close."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from edgeheal.agent.alerts.engine import AlertEngine
from edgeheal.checks import mqtt as mqtt_check
from edgeheal.lab.mosquitto import Mosquitto
from edgeheal.lab.netns import Sandbox
from edgeheal.model import State
from tests.alerts.support import Harness, harness, snapshot, status, validate
from tests.support import until

pytestmark = pytest.mark.netns

USER, PASSWORD = "edge", "pw-delivery-Kx9"


@pytest.fixture
def broker(sandbox: Sandbox, tmp_path: Path) -> Mosquitto:
    b = Mosquitto(sandbox, tmp_path, users={USER: PASSWORD})
    b.start()
    return b


def _toml(broker: Mosquitto, protocol: str = "3.1.1", **alerts: str) -> str:
    extra = "".join(f"{k} = {v}\n" for k, v in alerts.items())
    return (f'[[mqtt.targets]]\nname = "broker-direct"\nhost = "{broker.host}"\n'
            f'port = {broker.port}\nusername = "{USER}"\nprotocol = "{protocol}"\n'
            f'password_file = "{broker.password_file_for(USER)}"\nkeepalive = "2s"\n'
            f'timeout = "2s"\n[alerts]\ntarget = "broker-direct"\nreconnect_max = "1s"\n'
            f"{extra}")


def messages(path: Path, topic_suffix: str) -> list[dict[str, Any]]:
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        topic, _, payload = line.partition(" ")
        if topic.endswith(topic_suffix) and payload.startswith("{"):
            out.append(json.loads(payload))
    return out


class Running:
    def __init__(self, h: Harness, engine: AlertEngine, task: asyncio.Task[None]) -> None:
        self.h, self.engine, self.task = h, engine, task
        self.stopped = False

    async def stop(self, *, clean: bool = True) -> None:
        self.stopped = True
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        if clean:
            await self.engine.close()
        else:
            assert self.engine.link is not None
            self.engine.link.abort()
            self.engine.outbox.close()


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Callable[[str], Running]]:
    running: list[Running] = []

    def _start(toml: str) -> Running:
        h = harness(tmp_path, toml)
        engine = AlertEngine(h.ctx, link=h.link)
        task = asyncio.create_task(engine.serve(), name="edgeheal.alerts")
        running.append(Running(h, engine, task))
        return running[-1]

    yield _start
    for r in running:
        if not r.stopped:
            await r.stop()


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
async def test_alerts_arrive_in_order_and_leave_the_outbox_on_puback(
        broker: Mosquitto, tmp_path: Path, start: Callable[[str], Running],
        protocol: str) -> None:
    out = tmp_path / "sub.out"
    broker.subscribe("edgeheal/edge-7/alerts", out, user=USER)
    run = start(_toml(broker, protocol))
    ids = (await run.h.handlers["alert.test"]({"count": 20}))["ids"]
    await until(lambda: len(messages(out, "/alerts")) >= 21)
    got = messages(out, "/alerts")
    assert got[0]["kind"] == "agent.started"
    assert [m["id"] for m in got[1:]] == ids
    for m in got:
        validate(m, "alert.schema.json")
    reg = run.h.ctx.registry
    # the row leaves the outbox on the writer thread before the drain counts it: wait for
    # the count, then nothing may be left
    await until(lambda: reg.get_sample_value("edgeheal_alerts_published_total"),
                holds=lambda n: n == 21)
    assert run.engine.outbox.depth() == 0
    await until(lambda: reg.get_sample_value("edgeheal_alerts_outbox_depth"),
                holds=lambda n: n == 0)


async def test_alerts_raised_while_the_broker_is_down_arrive_in_order_after_it_returns(
        sandbox: Sandbox, tmp_path: Path, start: Callable[[str], Running]) -> None:
    broker = Mosquitto(sandbox, tmp_path, users={USER: PASSWORD}, persistence=True)
    broker.start()
    out = tmp_path / "sub.out"
    broker.subscribe("edgeheal/edge-7/alerts", out, user=USER, client_id="keeper",
                     clean=False)
    broker.stop()
    run = start(_toml(broker))
    ids = (await run.h.handlers["alert.test"]({"count": 30}))["ids"]
    await asyncio.sleep(0)  # let the link try (and fail) at least once
    assert run.engine.outbox.depth() == 31
    link = run.engine.link
    assert link is not None
    await until(lambda: link.state.reason == "unreachable", within=5)
    broker.start()  # the persistent subscriber reconnects by itself
    await until(lambda: len(messages(out, "/alerts")) >= 31, within=20)
    got = [m["id"] for m in messages(out, "/alerts") if m["kind"] == "agent.test"]
    assert list(dict.fromkeys(got)) == ids  # all, in order (duplicates only on lost PUBACK)
    await until(lambda: run.engine.outbox.depth() == 0)


async def test_the_retained_status_follows_the_checks_and_says_offline_on_shutdown(
        broker: Mosquitto, tmp_path: Path, start: Callable[[str], Running]) -> None:
    run = start(_toml(broker))
    link = run.engine.link
    assert link is not None
    await until(lambda: link.connected)
    run.engine.observe(snapshot(status("wireguard", State.OK),
                                status("broker-direct", State.FAILED, "timeout")))
    late = tmp_path / "late.out"  # a subscriber that comes later gets the retained doc
    await until(lambda: run.engine._status_sent is not None)
    broker.subscribe("edgeheal/edge-7/status", late, user=USER)
    await until(lambda: bool(messages(late, "/status")))
    doc = messages(late, "/status")[0]
    validate(doc, "mqtt-status.schema.json")
    assert doc["state"] == "failed"
    assert doc["checks"] == {"wireguard": "ok", "broker-direct": "failed"}
    await run.stop(clean=True)
    after = tmp_path / "after.out"
    broker.subscribe("edgeheal/edge-7/status", after, user=USER)
    await until(lambda: bool(messages(after, "/status")))
    doc = messages(after, "/status")[0]
    validate(doc, "mqtt-status.schema.json")
    assert (doc["state"], doc["reason"], doc["checks"]) == ("offline", "shutdown", {})


async def test_the_will_says_offline_when_the_agent_vanishes(
        broker: Mosquitto, tmp_path: Path, start: Callable[[str], Running]) -> None:
    run = start(_toml(broker))
    run.engine.observe(snapshot(status("wireguard", State.OK)))
    await until(lambda: run.engine._status_sent is not None)
    await run.stop(clean=False)  # socket closed without DISCONNECT, like kill -9
    after = tmp_path / "after.out"
    broker.subscribe("edgeheal/edge-7/status", after, user=USER)
    await until(lambda: bool(messages(after, "/status")))
    doc = messages(after, "/status")[0]
    validate(doc, "mqtt-status.schema.json")
    assert (doc["state"], doc["reason"]) == ("offline", "connection_lost")


async def test_the_alert_targets_check_reads_the_kept_open_connection(
        broker: Mosquitto, tmp_path: Path, start: Callable[[str], Running]) -> None:
    run = start(_toml(broker))
    checks = mqtt_check._factory(run.h.ctx)
    assert [type(c).__name__ for c in checks] == ["MqttLinkCheck"]
    check = checks[0]
    await until(lambda: run.engine.link is not None and run.engine.link.connected)
    connects = broker.log().count("New client connected")
    for _ in range(3):
        result = await check.run()
        assert (result.state, result.reason) == (State.OK, "ok")
    assert broker.log().count("New client connected") == connects  # no extra CONNECTs
    assert run.h.ctx.registry.get_sample_value(
        "edgeheal_mqtt_up", {"target": "broker-direct", "path": "direct"}) == 1
    broker.kill()
    await until(lambda: not run.engine.link.connected, within=10)  # type: ignore[union-attr]
    result = await check.run()
    assert result.state is State.FAILED
    assert result.reason in ("unreachable", "timeout")
    assert run.h.ctx.registry.get_sample_value(
        "edgeheal_mqtt_up", {"target": "broker-direct", "path": "direct"}) == 0


async def test_a_crashed_drain_drops_its_connection_before_the_supervisor_restarts_it(
        broker: Mosquitto, start: Callable[[str], Running]) -> None:
    run = start(_toml(broker))
    link = run.engine.link
    assert link is not None
    await until(lambda: link.connected)

    def broken() -> None:
        raise RuntimeError("simulated bug in the drain")

    run.engine.outbox.oldest = broken  # type: ignore[method-assign]
    run.engine._wake.set()
    with pytest.raises(RuntimeError, match="simulated"):
        await asyncio.wait_for(run.task, 5)
    assert not link.connected
    await until(lambda: broker.log().count("disconnected") + broker.log().count(
        "closed its connection") >= 1, within=5)
