"""The kept-open connection to the alert broker: will, keepalive, backoff, QoS 1 publish.

Why kept open: edge boxes pay for 4G bytes, and a connection that is already up both
carries alerts at once and *is* the reachability signal of its target — MQTT keepalive
(PINGREQ/PINGRESP every ``keepalive`` seconds of silence) notices a dead path within about
two keepalive periods, with no extra CONNECTs. The mqtt check of the alert target reads
:attr:`Link.state` instead of probing.

- The will message (retained ``offline`` status) is registered with every CONNECT, so the
  broker announces the agent's disappearance; a clean :meth:`Link.close` publishes its
  own ``offline`` first (a clean DISCONNECT suppresses the will).
- Reconnects back off exponentially from ``min_delay`` to ``max_delay`` with full jitter
  in the upper half (``delay * U(0.5, 1)``), so a fleet does not reconnect in lockstep
  after a broker outage; the attempt counter resets once a connection has stayed up.
- :meth:`Link.confirm` asks the broker at once (one PINGREQ) instead of waiting for the
  next keepalive: the tunnel-path check calls it when its own probe fails, so the direct
  path's verdict is fresh, within ``timeout``, exactly when the two paths are compared
  (which path is at fault). That lets ``keepalive`` be sized for the carrier's NAT and the
  bytes (60 s: 0.23 MB a day) rather than for detection.
- With ``hold_topic`` (``[fleet] hold``), each connection subscribes to that one topic
  (QoS 1; the retained hold arrives at once, so a reconnecting agent hears it too) and
  :attr:`Link.fleet_hold` is the last message heard, parsed and bounded
  (:mod:`edgeheal.boundaries.mqtt.hold`); the framer lets through a PUBLISH of exactly that
  topic and refuses every other, as without it. One subscription per agent: its cost does
  not grow with the fleet (a hold is ~200 bytes when set or released, nothing else).
- :meth:`Link.publish` is QoS 1 and returns when the PUBACK arrives; paho's in-memory
  queue is never relied on (each connection is a fresh clean session), durability is the
  caller's outbox.

**Two clients with one id.** Two agents with the same ``node_name`` send the same client
id; the broker lets one in by throwing the other out (MQTT's session takeover), and their
reconnects knock each other off forever. Each connection the broker ends that way is
counted (:attr:`Link.takeovers`, from :attr:`Connection.ended_by`: MQTT 5's DISCONNECT
reason 0x8E, or a connection the broker closed in order after CONNACK without one); at
:data:`TAKEOVER_COUNT` within :data:`TAKEOVER_WINDOW` the link says so once
(:attr:`Link.duplicate`, a log line at error; the engine alerts). The client id is not
changed: an operator's ACLs may name it.

The link's state is one immutable :class:`LinkState` replaced in one step: ``connected``,
``reason``, ``message`` and ``since`` always describe the same moment (``connected`` *is*
``state.up``). A connection that ends changes the state from the callback of its
``closed`` future (or at once, when we end it ourselves), not later when :meth:`run` gets
round to it, so no reader ever sees "not connected" with reason ``ok``.

One link per agent, built once: the agent makes it with :func:`for_alerts` before it
builds the checks and hands the same object to the mqtt check (``Context.alert_link``,
which only reads :attr:`Link.state`) and to the alert engine (which runs, uses and closes
it). Nothing here is global, so two agents in one process (the tests) never share one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from edgeheal.base import compat
from edgeheal.base.compat import UTC
from edgeheal.boundaries.mqtt import MqttError, client_id, hold
from edgeheal.model import FleetHold

if TYPE_CHECKING:
    from edgeheal.boundaries.mqtt.client import Connection
    from edgeheal.config import Config, MqttTarget

log = logging.getLogger("edgeheal.mqtt.link")  # the name operators grep for

STABLE_AFTER = 30.0
"""A connection that stayed up this long resets the backoff."""
TAKEOVER_COUNT = 3
"""Connections ended by a session takeover within :data:`TAKEOVER_WINDOW` that mean another
client uses our client id (one clean close can be a broker restart; two agents with one id
do it at every reconnect, at least once a ``reconnect_max``)."""
TAKEOVER_WINDOW = 600.0
"""Seconds over which takeovers are counted (ten times the default ``reconnect_max``)."""


@dataclass(frozen=True, slots=True)
class Takeovers:
    """Connections the broker ended because another client connected with our id."""

    client_id: str
    total: int = 0
    """Since start."""
    recent: tuple[float, ...] = ()
    """Monotonic times of the last :data:`TAKEOVER_COUNT`."""
    how: str = ""
    """The last one's evidence: ``session_taken_over`` or ``closed_by_broker``."""

    def duplicate(self, now: float) -> bool:
        """Another client uses our id: :data:`TAKEOVER_COUNT` takeovers in the window."""
        inside = [t for t in self.recent if now - t < TAKEOVER_WINDOW]
        return len(inside) >= TAKEOVER_COUNT


@dataclass(frozen=True, slots=True)
class LinkState:
    """What the mqtt check reports for the alert target."""

    up: bool
    reason: str
    """``ok`` when up; otherwise the last failure's reason, or ``connecting``."""
    message: str
    since: float
    """Monotonic time of the last change between up and down."""
    rtt_seconds: float | None = None
    connects: int = 0
    attempts: int = 0


class Link:
    """One broker connection, kept open and re-made with backoff by :meth:`run`."""

    def __init__(self, target: MqttTarget, node: str, *, min_delay: float = 1.0,
                 max_delay: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None, hold_topic: str = "",
                 max_hold: float = 43200.0,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.target, self.node = target, node
        self.hold_topic, self.max_hold, self.wall = hold_topic, max_hold, wall
        self.fleet_hold: FleetHold | None = None
        """The last fleet-hold message heard on :attr:`hold_topic` (None before any)."""
        self.min_delay, self.max_delay = min_delay, max_delay
        self.clock = clock
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self.state = LinkState(False, "connecting", "not connected yet", clock())
        self.generation = 0
        """Increments on every successful connect (the engine re-publishes status)."""
        self._conn: Connection | None = None
        self._changed = asyncio.Event()
        self._closing = False
        self._on_state: Callable[[LinkState], None] | None = None
        self._confirming: asyncio.Task[None] | None = None
        self.takeovers = Takeovers(client_id(target, node))
        """Connections the broker ended for another client with our id (module docstring)."""
        self._said_duplicate = False

    @property
    def duplicate(self) -> bool:
        """Another client uses this link's client id (a session takeover, repeatedly)."""
        return self.takeovers.duplicate(self.clock())

    def _count_takeover(self, conn: Connection, _closed: object = None) -> None:
        """A done-callback of ``conn.closed``, before the state goes down: count it."""
        if conn.ended_by is None or self._closing:
            return
        old = self.takeovers
        self.takeovers = Takeovers(old.client_id, old.total + 1,
                                   (*old.recent, self.clock())[-TAKEOVER_COUNT:],
                                   conn.ended_by)
        if self.duplicate and not self._said_duplicate:
            self._said_duplicate = True
            log.error("mqtt link %s: the broker ended our session %d times in %gs because "
                      "another client connected with our client id %s (%s): two agents "
                      "with the same node_name on one broker? Give each node its own "
                      "node_name (or the target its own client_id)", self.target.name,
                      TAKEOVER_COUNT, TAKEOVER_WINDOW, old.client_id, conn.ended_by,
                      extra={"check": self.target.name})

    @property
    def connected(self) -> bool:
        """``state.up``: one source of truth, changed in one step with the reason."""
        return self.state.up

    @property
    def closing(self) -> bool:
        return self._closing

    def backoff(self, attempt: int) -> float:
        """Seconds before reconnect attempt ``attempt`` (1-based): capped, jittered."""
        base = min(self.max_delay, self.min_delay * 2.0 ** max(0, attempt - 1))
        return float(base * self.rng.uniform(0.5, 1.0))

    def _set(self, state: LinkState) -> None:
        old = self.state
        self.state = state
        if old.up != state.up or old.reason != state.reason:
            level = logging.INFO if state.up else logging.WARNING
            log.log(level, "mqtt link %s: %s: %s", self.target.name, state.reason,
                    state.message, extra={"check": self.target.name})
        if self._on_state is not None:
            self._on_state(state)
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self) -> None:
        await self._changed.wait()

    async def wait_up(self) -> None:
        while not self.connected:
            await self.wait_change()

    async def run(self, *, will: Callable[[], tuple[str, bytes]] | None = None,
                  on_state: Callable[[LinkState], None] | None = None) -> None:
        """Connect, stay connected, reconnect with backoff; runs until cancelled.

        ``will()`` gives the (topic, payload) registered with each CONNECT (retained, QoS 1);
        ``on_state`` is called on every state change from now on. Cancelling leaves the
        current connection open so :meth:`close` can still say ``offline`` on it;
        :meth:`close` (or :meth:`abort`) always ends it.
        """
        from edgeheal.boundaries.mqtt.client import Connection  # paho on demand

        self._on_state = on_state
        attempt = 0
        while not self._closing:
            attempt += 1
            conn = Connection(self.target, self.node, keepalive=self.target.keepalive,
                              accept=self.hold_topic, on_message=self._heard)
            try:
                conn.will = will() if will else None
                async with compat.timeout(self.target.timeout):
                    rtt = await conn.connect()
            except MqttError as err:
                conn.abort()
                self._down(err.reason, err.message, attempt)
            except compat.TimeoutErrors:
                stage = conn.stage[0]
                conn.abort()
                self._down("timeout", f"no progress within {self.target.timeout:g}s "
                           f"({stage})", attempt)
            except Exception as err:  # supervised here: never a silent "connecting" forever
                conn.abort()
                if self.state.reason != "internal_error":
                    log.exception("mqtt link %s: unexpected %s while connecting; retrying "
                                  "with backoff", self.target.name, type(err).__name__,
                                  extra={"check": self.target.name})
                self._down("internal_error", f"unexpected {type(err).__name__} while "
                           "connecting (a bug; see the log)", attempt)
            except BaseException:
                conn.abort()
                raise
            else:
                self._conn = conn
                self.generation += 1
                generation = self.generation
                up_at = self.clock()
                self._set(LinkState(True, "ok", f"connected, CONNACK in {rtt * 1000:.1f} ms",
                                    up_at, rtt, self.state.connects + 1, attempt))
                conn.closed.add_done_callback(functools.partial(self._count_takeover, conn))
                conn.closed.add_done_callback(functools.partial(self._ended, generation))
                if self.hold_topic:
                    with contextlib.suppress(MqttError):  # a lost connection says so itself
                        conn.subscribe()
                await asyncio.shield(conn.closed)
                self._ended(generation, conn.closed)  # no-op: the callback came first
                if self.closing:
                    return
                if self.clock() - up_at >= STABLE_AFTER:
                    attempt = 0
                if attempt == 0:
                    continue  # a long-lived connection dropped: try again at once
            await asyncio.sleep(self.backoff(attempt))

    def _ended(self, generation: int, closed: asyncio.Future[MqttError | None]) -> None:
        """Connection ``generation`` has ended: the state goes down in one step (once)."""
        if generation != self.generation or not self.state.up:
            return
        if self._closing:
            failure = MqttError("unreachable", f"{self.target.name}: closed by the agent")
        else:
            error = None if closed.cancelled() or not closed.done() else closed.result()
            failure = error or MqttError("unreachable", "disconnected")
        self._down(failure.reason, failure.message, self.state.attempts)

    def _down(self, reason: str, message: str, attempt: int) -> None:
        since = self.state.since if not self.state.up and self.state.reason != "connecting" \
            else self.clock()
        self._set(LinkState(False, reason, message, since, None, self.state.connects, attempt))

    def _heard(self, payload: bytes) -> None:
        """A message on :attr:`hold_topic`: parsed, bounded, kept (never obeyed blindly)."""
        now = self.wall()
        try:
            got = hold.parse(payload, now, self.max_hold)
        except hold.HoldRefused as err:
            heard = FleetHold("", None, refused=str(err), received=now)
            log.warning("fleet hold on %s refused: %s", self.hold_topic, err,
                        extra={"check": self.target.name})
        else:
            heard = FleetHold(got.reason, got.until, got.by, received=now)
            log.info("fleet hold on %s: %s", self.hold_topic,
                     f"until {got.until:%Y-%m-%dT%H:%M:%SZ} ({got.reason})" if got.until
                     else "released", extra={"check": self.target.name})
        self.fleet_hold = heard

    def confirm(self) -> None:
        """Ask the broker now whether the connection still works (one PINGREQ), without
        waiting: no PINGRESP within ``timeout`` ends the connection (``timeout``), which
        :attr:`state` shows at once and :meth:`run` re-makes with backoff. At most one
        confirmation at a time; nothing while not connected."""
        conn = self._conn
        if conn is None or not self.connected or self._closing or (
                self._confirming is not None and not self._confirming.done()):
            return
        self._confirming = asyncio.get_running_loop().create_task(
            self._confirm(conn), name=f"edgeheal.mqtt.confirm.{self.target.name}")

    async def _confirm(self, conn: Connection) -> None:
        with contextlib.suppress(MqttError):  # a failure ends conn: _ended sets the state
            await conn.ping(self.target.timeout)

    def _stop_confirming(self) -> None:
        if self._confirming is not None:
            self._confirming.cancel()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False,
                      limit: float | None = None) -> None:
        """QoS 1; returns once the broker's PUBACK arrived, else raises MqttError.

        A PUBACK that does not come within ``limit`` seconds (default: twice the keepalive)
        drops the connection: the message's fate is unknown, the caller resends it.
        """
        conn = self._conn
        if conn is None or not self.connected:
            raise MqttError("unreachable", f"{self.target.name}: not connected")
        fut = conn.publish(topic, payload, retain=retain)
        limit = limit if limit is not None else 2 * max(1.0, self.target.keepalive)
        try:
            async with compat.timeout(limit):  # wait_for before 3.12 can swallow a cancel
                await asyncio.shield(fut)
        except compat.TimeoutErrors as err:
            conn.abort(MqttError("timeout", f"{self.target.name}: no PUBACK within "
                                 f"{limit:g}s"))
            raise MqttError("timeout", f"{self.target.name}: no PUBACK within "
                            f"{limit:g}s") from err

    async def close(self, final: tuple[str, bytes] | None = None,
                    limit: float = 1.0) -> None:
        """Publish ``final`` (retained, e.g. the offline status), then DISCONNECT."""
        self._closing = True
        self._stop_confirming()
        conn = self._conn
        if conn is None:
            return
        began = time.monotonic()
        if final is not None and self.connected:
            with contextlib.suppress(MqttError):
                await self.publish(final[0], final[1], retain=True, limit=limit)
        await conn.disconnect(max(0.1, limit - (time.monotonic() - began)))
        self._conn = None
        self._ended(self.generation, conn.closed)

    def drop(self) -> None:
        """Close the current connection now (no DISCONNECT); :meth:`run` may reconnect."""
        self._abort_conn()

    def abort(self) -> None:
        self._closing = True
        self._stop_confirming()
        self._abort_conn()

    def _abort_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()  # resolves conn.closed at once
            self._ended(self.generation, conn.closed)


def for_alerts(config: Config, *, clock: Callable[[], float] = time.monotonic) -> Link | None:
    """The link to ``[alerts] target`` (None without one), backing off up to
    ``[alerts] reconnect_max``; the agent builds it once and hands it on."""
    name = config.alerts.target
    if not name:
        return None
    target = next(t for t in config.mqtt.targets if t.name == name)
    return Link(target, config.node, max_delay=config.alerts.reconnect_max, clock=clock,
                hold_topic=hold.topic(config.alerts.topic_prefix.strip("/"))
                if config.fleet.hold else "",
                max_hold=config.fleet.max_hold)
