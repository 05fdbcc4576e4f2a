"""The ordered drain: the outbox to the broker, one alert in flight at a time.

Why apart from the engine: raising an alert and delivering it are separate jobs that meet
only at the outbox. The drain publishes the oldest row at QoS 1, waits for its PUBACK,
deletes it and takes the next, so the order holds across reconnects and restarts; a lost
PUBACK sends the same row (same ``id``) again: at-least-once, duplicates only there. A
broker that refuses a publish pauses the drain for :data:`RETRY_AFTER_REJECT`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from edgeheal.base import compat
from edgeheal.boundaries.mqtt import MqttError

if TYPE_CHECKING:
    from edgeheal.agent.alerts.engine import AlertEngine
    from edgeheal.boundaries.mqtt.link import Link

log = logging.getLogger("edgeheal.alerts.engine")  # the name operators grep for

RETRY_AFTER_REJECT = 5.0
"""Seconds the drain waits after the broker refused a publish on a live connection."""


async def drain(engine: AlertEngine, link: Link) -> None:
    """Publish the outbox's oldest row, wait for its PUBACK, delete it, take the next: one in
    flight, so order holds across reconnects; the retained status first when it changed."""
    while True:
        await link.wait_up()
        generation = link.generation
        try:
            engine._status_sent = None  # the will may have replaced it: say it again
            while link.connected and link.generation == generation:
                # cleared before looking, never after: a wake-up (an alert raised, a status
                # changed) that comes while we look is kept for the wait below, not lost
                engine._wake.clear()
                await engine.outbox.run(engine._prune)
                if engine._status_doc is not None and engine._status_doc != engine._status_sent:
                    doc = engine._status_doc
                    await link.publish(engine.status_topic, engine._status_payload(
                        doc["state"], doc["checks"]), retain=True)
                    engine._status_sent = doc
                    continue
                entry = await engine.outbox.run(engine.outbox.oldest)
                if entry is None:
                    with contextlib.suppress(*compat.TimeoutErrors):
                        async with compat.timeout(engine.pause()):  # never swallows a cancel
                            await engine._wake.wait()
                    continue
                await link.publish(engine.alerts_topic, entry.payload)
                await engine.outbox.run(engine.outbox.delete, entry.seq)
                engine.metrics.published.inc()
                engine._alert_test.delivered(entry.id)
                await engine.outbox.run(engine._gauges)
                log.debug("alert %s delivered (PUBACK)", entry.id,
                          extra={"alert_id": entry.id, "kind": entry.kind})
        except MqttError as err:
            log.info("alert delivery paused (%s): %s; %d alert(s) wait in the outbox",
                     err.reason, err, engine._depth)
            if link.connected and link.generation == generation:
                await asyncio.sleep(RETRY_AFTER_REJECT)  # rejected, not disconnected
