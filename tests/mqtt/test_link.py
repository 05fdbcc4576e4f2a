"""The kept-open connection: backoff, reconnect, keepalive loss, publish without a link."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from edgeheal.base import compat
from edgeheal.boundaries.mqtt import MqttError
from edgeheal.boundaries.mqtt.link import Link
from edgeheal.config import MqttTarget
from edgeheal.lab.mosquitto import Mosquitto
from tests.mqtt.conftest import target_for
from tests.support import until


@pytest.mark.parametrize(("attempt", "low", "high"), [
    (1, 0.5, 1.0), (2, 1.0, 2.0), (3, 2.0, 4.0), (6, 16.0, 32.0), (7, 30.0, 60.0),
    (30, 30.0, 60.0),
])
def test_the_backoff_doubles_is_jittered_in_its_upper_half_and_capped(
        attempt: int, low: float, high: float) -> None:
    link = Link(MqttTarget(name="x", host="h"), "n", min_delay=1.0, max_delay=60.0,
                rng=random.Random(7))  # noqa: S311 - seeded jitter, not crypto
    delays = [link.backoff(attempt) for _ in range(200)]
    assert all(low <= d <= high for d in delays)
    assert max(delays) - min(delays) > (high - low) / 4  # really jittered


async def test_publishing_without_a_connection_fails_at_once() -> None:
    link = Link(MqttTarget(name="x", host="h"), "n")
    with pytest.raises(MqttError, match="not connected") as err:
        await link.publish("t", b"x")
    assert err.value.reason == "unreachable"


@pytest.mark.netns
async def test_connected_reason_and_since_change_together_in_one_step(
        broker: Mosquitto) -> None:
    """Every loop iteration sees a consistent link: connected iff reason ``ok``, and a
    state object is never mutated, only replaced (the flake of issue 16: connected was
    already false while the reason still read ``ok``)."""
    link = Link(target_for(broker, keepalive=2.0, timeout=1.0), "edge-1", max_delay=0.3)
    seen: list[tuple[bool, str, float]] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            state = link.state
            seen.append((link.connected, state.reason, state.since))
            assert link.connected is state.up
            assert state.up == (state.reason == "ok"), (link.connected, state)
            await asyncio.sleep(0)

    task = asyncio.create_task(link.run(), name="test.link")
    watcher = asyncio.create_task(watch(), name="test.watch")
    ups: list[float] = []  # each connection's since, as the test itself saw it up
    try:
        for _ in range(2):
            await until(lambda: link.connected)
            ups.append(link.state.since)
            link.drop()  # ends the connection ourselves: the state goes down at once
            assert (link.connected, link.state.reason) == (False, "unreachable")
        await until(lambda: link.connected)
        ups.append(link.state.since)
        broker.kill()  # the broker vanishes: the end comes from the socket
        await until(lambda: not link.connected)
        assert watcher.done() is False  # no inconsistent view raised in the watcher
    finally:
        stop.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await link.close()
        await watcher  # re-raises what the watcher saw
    assert len(set(ups)) == 3  # three connections, each with its own since
    # the watcher, however seldom a busy machine let it run, saw no other up period
    assert {since for up, _, since in seen if up} <= set(ups)
    assert not link.connected


@pytest.mark.netns
async def test_the_link_reconnects_after_the_broker_comes_back(broker: Mosquitto) -> None:
    link = Link(target_for(broker, keepalive=2.0, timeout=1.0), "edge-1", max_delay=0.5)
    task = asyncio.create_task(link.run(), name="test.link")
    try:
        await until(lambda: link.connected)
        assert link.state.reason == "ok"
        assert link.generation == 1
        await link.publish("edgeheal/test", b"one")  # PUBACK arrives
        broker.stop()
        await until(lambda: not link.connected)
        assert link.state.reason == "unreachable"
        broker.start()
        await until(lambda: link.connected)
        assert link.generation == 2
        assert link.state.connects == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await link.close()


class Blackhole:
    """A TCP forwarder to the broker that can start swallowing bytes without closing."""

    def __init__(self, port: int) -> None:
        self.upstream, self.swallow, self.port = port, False, 0
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[object]] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.append(task)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self.writers += [writer, up_writer]
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer),
                             return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(4096):
            if not self.swallow:
                writer.write(data)
                await writer.drain()

    async def close(self) -> None:
        for w in self.writers:
            w.close()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.mark.netns
async def test_a_silently_dead_path_is_noticed_by_keepalive_within_two_periods(
        broker: Mosquitto) -> None:
    hole = Blackhole(broker.port)
    await hole.start()
    link = Link(target_for(broker, port=hole.port, keepalive=1.0, timeout=1.0), "edge-1",
                max_delay=0.5)
    task = asyncio.create_task(link.run(), name="test.link")
    try:
        await until(lambda: link.connected)
        await asyncio.sleep(0)
        hole.swallow = True  # packets vanish; nothing is closed
        began = time.monotonic()
        # wait on the condition asserted: the link's (one, immutable) state going down
        down = await until(lambda: link.state if not link.state.up else None, within=6,
                           what="the link's state going down")
        took = time.monotonic() - began
        assert not link.connected
        assert (down.reason, down.since) == ("timeout", link.state.since)
        assert "keepalive" in down.message
        assert took < 2 * 1.0 + 2 * 1.0 + 1.5  # 2 periods + ticks
        with pytest.raises(MqttError):
            await link.publish("edgeheal/test", b"x")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await link.close()
        await hole.close()


@pytest.mark.netns
async def test_a_confirmation_finds_a_silent_broker_long_before_the_keepalive(
        broker: Mosquitto) -> None:
    """confirm() asks at once: a broker that stopped answering is seen within ``timeout``,
    not within two keepalives (here 10 minutes)."""
    import os
    import signal

    link = Link(target_for(broker, keepalive=300.0, timeout=1.5), "edge-1", max_delay=0.3)
    task = asyncio.create_task(link.run(), name="test.link")
    assert broker.proc is not None
    try:
        async with compat.timeout(10):
            await link.wait_up()
        link.confirm()  # a healthy link answers: still up, once the answer came
        confirming = link._confirming
        assert confirming is not None
        await until(confirming.done, within=3.0, what="the confirmation")
        assert link.state.up
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            began = time.monotonic()
            link.confirm()
            link.confirm()  # one at a time
            await until(lambda: not link.state.up, within=5.0, what="link down")
            assert link.state.reason == "timeout"
            assert time.monotonic() - began < 1.5 + 1.0
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        await until(lambda: link.state.up, within=10.0, what="link up")  # re-made
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await link.close()
