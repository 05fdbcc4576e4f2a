"""``alert.test``: the control command that proves the alert path end to end.

Why a command and not a log line: an operator wiring a new subscriber needs an alert that
goes through exactly what a real one does (the outbox, the ordered drain, the broker's
PUBACK), on demand. It raises ``count`` ``agent.test`` alerts through the engine and, with
``wait``, waits (bounded) for their acknowledgements, so the reply says how many the broker
has, not only how many were queued.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeheal.agent.alerts.engine import AlertEngine

MAX_TEST_ALERTS = 1000
MAX_TEST_WAIT = 30.0
"""Longest ``alert.test`` may wait for the broker's acknowledgements (seconds)."""


class AlertTest:
    """The handler of ``alert.test``; the engine's drain calls :meth:`delivered` on each
    PUBACK."""

    def __init__(self, engine: AlertEngine) -> None:
        self._engine = engine
        self._awaited: dict[str, asyncio.Future[None]] = {}
        """Alert ids a call waits on, resolved on their PUBACK."""

    def delivered(self, alert_id: str) -> None:
        awaited = self._awaited.get(alert_id)
        if awaited is not None and not awaited.done():
            awaited.set_result(None)

    async def __call__(self, args: Mapping[str, Any]) -> dict[str, Any]:
        engine = self._engine
        count = args.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) \
                or not 1 <= count <= MAX_TEST_ALERTS:
            raise ValueError(f"count must be an integer from 1 to {MAX_TEST_ALERTS}, "
                             f"got {count!r}")
        wait = args.get("wait", 0)
        if isinstance(wait, bool) or not isinstance(wait, int | float) \
                or not 0 <= wait <= MAX_TEST_WAIT:
            raise ValueError(f"wait must be a number of seconds from 0 to {MAX_TEST_WAIT:g}, "
                             f"got {wait!r}")
        loop = asyncio.get_running_loop()
        ids = []
        for i in range(1, count + 1):
            alert_id = engine.raise_alert("agent.test", f"test alert {i} of {count} from "
                                          f"{engine.node}", {"index": i, "count": count}).id
            ids.append(alert_id)
            if wait and engine.link is not None:
                self._awaited[alert_id] = loop.create_future()
        await engine.outbox.settled()  # "raised" means stored: the reply waits for the disk
        futures = [self._awaited[i] for i in ids if i in self._awaited]
        try:
            if futures:
                await asyncio.wait(futures, timeout=float(wait))
        finally:
            for alert_id in ids:
                self._awaited.pop(alert_id, None)
        published = sum(1 for f in futures if f.done())
        return {"raised": count, "ids": ids, "published": published,
                "queued": count - published, "waited_seconds": wait,
                "outbox_depth": await engine.outbox.run(engine.outbox.depth),
                "target": engine.settings.target, "topic": engine.alerts_topic}
