"""``edgeheal fleet receive``: Alertmanager's webhook in, the fleet hold out.

Why: the shipped ``EdgehealHubFaultFleetwide`` alert (monitoring/alerts.yaml) sees a hub
fault from the whole fleet's metrics; only the fleet hold (a retained MQTT message every
agent hears, :mod:`edgeheal.boundaries.mqtt.hold`) can stop the nodes' restarts. This is
the small bridge between them: Alertmanager's own ``webhook_config`` POSTs each
notification of the routed alert group here, and the receiver publishes the hold (reason:
the alert's name, ``until``: now + ``--for``) while the alert fires and releases it when
Alertmanager says it resolved. A firing group is notified again every ``repeat_interval``,
and each notification pushes ``until`` forward: keep ``repeat_interval`` well under
``--for``, so the hold outlives a lost notification but not the receiver (a receiver that
dies, or a resolve that never comes, leaves a hold that ends by itself at ``until``).

The body is Alertmanager's webhook message, version 4 (``notify/webhook/webhook.go``:
``Message`` = ``template.Data`` + ``version`` + ``groupKey`` + ``truncatedAlerts``; the
alerts' ``status`` is ``firing`` or ``resolved``, their ``labels`` carry ``alertname``).
What the receiver accepts is bounded and checked before anything is published:

- ``POST`` on :data:`PATH` only (405, 404 otherwise); at most :data:`MAX_BODY` bytes (413);
- with ``--token-file``, the ``Authorization: Bearer`` header must match (401; compared in
  constant time; the token is never logged, nor is any header or body);
- a JSON object of version ``"4"`` whose ``alerts`` is a list of objects with a ``status``
  of ``firing`` or ``resolved`` and ``labels`` of strings (400, the answer saying which
  field was wrong, never quoting the body);
- alerts of another name are ignored (200, nothing published): the route should send only
  the hub-fault alert, but a broader one does no harm.

A broker that cannot be reached answers 503, which Alertmanager retries (it retries 5xx,
not 4xx). Notifications are published one at a time, in the order they arrived.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from edgeheal.base.compat import UTC
from edgeheal.boundaries.mqtt import MqttError
from edgeheal.boundaries.mqtt import hold as wire

log = logging.getLogger(__name__)

PATH = "/alertmanager"
MAX_BODY = 64 * 1024
"""Bytes of a notification at most: one alert is ~1 KiB; the route groups by alertname."""
MAX_ALERTS = 1000
DEFAULT_ALERT = "EdgehealHubFaultFleetwide"
BY = "alertmanager"

Verdict = Literal["hold", "release"]
Publish = Callable[[bytes], Awaitable[None]]
"""Publish this payload retained on the hold topic (empty: release); raises MqttError."""


class WebhookRefused(ValueError):
    """The body is not a webhook message the receiver acts on (the text says why)."""


def verdict(body: bytes, alertname: str) -> Verdict | None:
    """What the notification in ``body`` asks of the hold: ``hold`` while any alert named
    ``alertname`` fires, ``release`` when every one of them is resolved, None when it
    holds none of them. :class:`WebhookRefused` for anything but a version-4 message."""
    if len(body) > MAX_BODY:
        raise WebhookRefused(f"{len(body)} bytes, more than {MAX_BODY}")
    try:
        doc = json.loads(body)
    except RecursionError:
        raise WebhookRefused("JSON nested too deeply") from None
    except ValueError:
        raise WebhookRefused("not JSON") from None
    if not isinstance(doc, dict):
        raise WebhookRefused(f"not a JSON object ({type(doc).__name__})")
    if doc.get("version") != "4":
        raise WebhookRefused('"version" is not "4" (Alertmanager\'s webhook message)')
    alerts = doc.get("alerts")
    if not isinstance(alerts, list):
        raise WebhookRefused('"alerts" is missing or not a list')
    if len(alerts) > MAX_ALERTS:
        raise WebhookRefused(f'"alerts" holds {len(alerts)} alerts, more than {MAX_ALERTS}')
    statuses = []
    for i, alert in enumerate(alerts):
        if not isinstance(alert, dict):
            raise WebhookRefused(f"alerts[{i}] is not an object")
        labels, status = alert.get("labels"), alert.get("status")
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise WebhookRefused(f'alerts[{i}]."labels" is not an object of strings')
        if status not in ("firing", "resolved"):
            raise WebhookRefused(f'alerts[{i}]."status" is not "firing" or "resolved"')
        if labels.get("alertname") == alertname:
            statuses.append(status)
    if not statuses:
        return None
    return "hold" if "firing" in statuses else "release"


@dataclass
class Receiver:
    """The webhook's logic, without a socket: :meth:`handle` is what one POST does."""

    publish: Publish
    alertname: str
    hold_for: float
    """Seconds from a firing notification to the hold's ``until``."""
    token: str = ""
    """The bearer token Alertmanager must send (empty: none asked)."""
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    published: int = 0
    refused: int = 0

    def __post_init__(self) -> None:
        self._order = asyncio.Lock()

    def authorized(self, header: str | None) -> bool:
        if not self.token:
            return True
        scheme, _, value = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), self.token.encode())

    async def handle(self, body: bytes) -> tuple[int, str]:
        """(HTTP status, one line of text) for one notification's body."""
        try:
            said = verdict(body, self.alertname)
        except WebhookRefused as err:
            self.refused += 1
            log.warning("fleet receive: notification refused: %s", err)
            return 400, f"refused: {err}"
        if said is None:
            return 200, f"ignored: no {self.alertname} alert in it"
        async with self._order:
            payload = b""
            if said == "hold":
                until = self.now() + timedelta(seconds=self.hold_for)
                payload = wire.encode(self.alertname, until, BY)
            try:
                await self.publish(payload)
            except MqttError as err:
                log.warning("fleet receive: %s not published: %s", said, err.message)
                return 503, f"broker: {err.message}"
        self.published += 1
        if said == "hold":
            log.info("fleet receive: fleet hold set until %s: %s",
                        f"{until:%Y-%m-%dT%H:%M:%SZ}", self.alertname)
            return 200, f"held until {until:%Y-%m-%dT%H:%M:%SZ}"
        log.info("fleet receive: fleet hold released: %s resolved", self.alertname)
        return 200, "released"


async def serve(receiver: Receiver, listen: str, stop: asyncio.Event,
                ready: Callable[[str], None] = lambda _name: None) -> None:
    """Answer webhooks on ``listen`` (host:port) until ``stop`` is set."""
    from edgeheal.boundaries.aiohttp_light import bind, web

    async def on_post(request: Any) -> Any:
        if not receiver.authorized(request.headers.get("Authorization")):
            log.warning("fleet receive: notification without the right bearer token "
                        "from %s", request.remote)
            return web.Response(status=401, text="unauthorized\n")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            receiver.refused += 1
            return web.Response(status=413, text=f"refused: more than {MAX_BODY} bytes\n")
        status, text = await receiver.handle(body)
        return web.Response(status=status, text=text + "\n")

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post(PATH, on_post)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        for sock in bind([listen]):
            site = web.SockSite(runner, sock)
            await site.start()
            ready(site.name)
        await stop.wait()
    finally:
        await runner.cleanup()
