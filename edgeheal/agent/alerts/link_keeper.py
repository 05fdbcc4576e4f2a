"""The engine's keeper of the alert link: its task kept running, its session takeovers said.

Why apart from the engine: the engine raises alerts and the drain
(:mod:`~edgeheal.agent.alerts.delivery`) sends them; the link
(:class:`edgeheal.boundaries.mqtt.link.Link`) is the connection they travel over, and two
things about it need watching that neither the drain nor the link can do for itself:

- its task must not die unseen: the drain waits for the link, so a dead link task would
  silence every alert. :meth:`LinkKeeper.run` logs a crash and restarts the task with a
  doubling pause capped at :data:`LINK_RESTART_MAX` (back to 1 s after a long run);
- another client with our client id (two agents with one ``node_name`` on one broker) ends
  our session again and again: every takeover is counted
  (``edgeheal_alerts_session_taken_over_total``), ``edgeheal_alerts_duplicate_client_id``
  is 1 while it lasts, and one ``alerts.duplicate_client_id`` alert per run names the
  client id. ``/status`` shows the count (:meth:`LinkKeeper.view`).

It logs on the engine's logger, ``edgeheal.alerts.engine``, the name operators grep for.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeheal.agent.alerts.engine import AlertEngine
    from edgeheal.boundaries.mqtt.link import Link

log = logging.getLogger("edgeheal.alerts.engine")  # the name operators grep for

LINK_RESTART_MAX = 60.0
"""Longest pause before the link's task is restarted after a crash."""


class LinkKeeper:
    """Runs the engine's link and watches its sessions (see the module docstring)."""

    def __init__(self, engine: AlertEngine, link: Link) -> None:
        self._engine = engine
        self.link = link
        self._takeovers_seen = 0
        self._duplicate_said = False
        """``alerts.duplicate_client_id`` is raised once per run."""
        # read at scrape time: it ends when the takeovers stop
        engine.metrics.duplicate.set_function(lambda: 1.0 if link.duplicate else 0.0)

    async def run(self) -> None:
        """Run the link; if its task ever dies, log it and restart it with capped backoff
        (the drain waits for the link, so a dead link task would silence every alert)."""
        link, clock = self.link, self._engine.ctx.clock
        delay = 1.0
        while not link.closing:
            began = clock()
            try:
                await link.run(will=self._engine.will, on_state=lambda _state: self.changed())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("alert link task crashed; restarting it in %.0fs", delay)
            if clock() - began > 5 * LINK_RESTART_MAX:
                delay = 1.0
            await asyncio.sleep(delay)
            delay = min(delay * 2, LINK_RESTART_MAX)

    def changed(self) -> None:
        """Every change of the link's state: wake the drain; count session takeovers and
        say once that another client uses our client id (``alerts.duplicate_client_id``)."""
        engine, link = self._engine, self.link
        engine._wake.set()
        takeovers = link.takeovers
        if takeovers.total > self._takeovers_seen:
            engine.metrics.taken_over.inc(takeovers.total - self._takeovers_seen)
            self._takeovers_seen = takeovers.total
        if link.duplicate and not self._duplicate_said:
            self._duplicate_said = True
            engine.raise_alert(
                "alerts.duplicate_client_id",
                f"the alert broker ended this agent's session {takeovers.total} times "
                f"because another client connected with its client id "
                f"{takeovers.client_id}: two agents with node_name {engine.node} on one "
                "broker? Give each node its own node_name",
                {"client_id": takeovers.client_id, "takeovers": takeovers.total,
                 "evidence": takeovers.how, "target": link.target.name})

    def view(self) -> dict[str, Any]:
        """For /status: the session takeovers seen on the link."""
        takeovers = self.link.takeovers
        return {"session_taken_over": {
            "client_id": takeovers.client_id, "total": takeovers.total,
            "duplicate_client_id": self.link.duplicate, "evidence": takeovers.how or None}}
