"""Telling Kubernetes: Events on the Node and the ``EdgeTunnelHealthy`` Node condition.

Why: an operator looking at the cluster (``kubectl describe node``) should see what
edgeheal did and how the tunnel is, without logging in to the node. With ``[kubernetes]``,
remediation's moments become Events on the Node (``FlannelRestarted``,
``RemediationSkipped``, ``RemediationCircuitOpen``, ``FlannelRecovered``) and the
``EdgeTunnelHealthy`` condition follows the tunnel.

Both are best effort and never delay a decision: each call runs as a background task, an
API error is logged, and a 403 (the optional RBAC rule is missing) turns that side off with
one warning while the rest carries on. The Kubernetes client is the actor's shared one,
made only when something is actually sent.

The condition has one sender task at a time: it sends the latest wanted value, and after a
failure waits (exponential from :data:`RETRY_MIN` to :data:`RETRY_MAX`, jittered into the
upper half) before sending again; a value already sent is never sent again. Issue 27: a
failing API had the condition re-sent on every evaluation, 36 requests in 12 s from one
node. No background task dies silently: anything unexpected is logged with its traceback.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from edgeheal.model import State

if TYPE_CHECKING:
    from edgeheal.boundaries.kube import KubeClient
    from edgeheal.config import Config
    from edgeheal.core.flannel_ladder import TunnelView

log = logging.getLogger("edgeheal.remediation.reporting")  # the name operators grep for

CONDITION_TYPE = "EdgeTunnelHealthy"
RETRY_MIN = 2.0
"""Seconds before the condition is sent again after a first failure (doubling after)."""
RETRY_MAX = 120.0
"""The longest wait between failed sends of the condition, seconds."""


class NodeReporter:
    def __init__(self, config: Config, kube: Callable[[], KubeClient], *,
                 retry_min: float = RETRY_MIN, retry_max: float = RETRY_MAX,
                 rng: random.Random | None = None) -> None:
        self.node = config.node
        settings = config.kubernetes
        self.kube = kube
        self.events = settings is not None and settings.events
        """Record Node Events (off without ``[kubernetes]``, by setting, or after a 403)."""
        self.condition = settings is not None and settings.node_condition
        """Keep the Node condition (off without ``[kubernetes]``, by setting, or after a 403)."""
        self._wanted: tuple[bool | None, str, str] | None = None
        """The condition to have: (healthy, reason, message)."""
        self._sent: bool | str | None = "nothing"
        """The health last sent successfully ("nothing" before the first)."""
        self._sender: asyncio.Task[None] | None = None
        self.retry_min, self.retry_max = retry_min, retry_max
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self.failures = 0
        """Failed sends of the condition in a row."""
        self.background: set[asyncio.Task[None]] = set()

    def cancel(self) -> None:
        for task in list(self.background):
            task.cancel()

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        async def run() -> None:
            try:
                await coro
            except Exception:  # never "Task exception was never retrieved"
                log.exception("%s failed unexpectedly", name)

        task = asyncio.get_running_loop().create_task(run(), name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    # --- Events ----------------------------------------------------------------------------

    def event(self, reason: str, message: str, *, warning: bool) -> None:
        if self.events:
            self._spawn(self._post_event(reason, message, warning),
                        "edgeheal.remediation.event")

    async def _post_event(self, reason: str, message: str, warning: bool) -> None:
        from edgeheal.boundaries.kube import KubeError, KubePermissionError

        try:
            await self.kube().node_event(self.node, reason, message, warning=warning)
        except KubePermissionError as err:
            log.warning("not recording Node Events any more: %s", err)
            self.events = False
        except KubeError as err:
            log.warning("could not record Event %s on node %s: %s", reason, self.node, err)

    # --- the condition ---------------------------------------------------------------------

    def follow(self, view: TunnelView) -> None:
        """Bring the condition in line with the tunnel, when that changed."""
        if not self.condition:
            return
        if view.wireguard is None and not view.tunnel_mqtt:
            return
        healthy: bool | None = view.healthy
        if not healthy and view.failure() is None and (
                view.wireguard in (None, State.UNKNOWN) or (
                    view.wireguard is State.OK and State.UNKNOWN in view.tunnel_mqtt.values())):
            healthy = None  # no evidence either way (starting, connecting, check error)
        if self._wanted is not None and healthy == self._wanted[0]:
            return
        reason = "TunnelHealthy" if healthy else (
            "Tunnel" + "".join(p.title() for p in (view.failure() or view.wireguard_reason
                                                   or "unknown").split("_")))
        message = (f"wireguard {view.wireguard.value if view.wireguard else 'not watched'}"
                   f" ({view.wireguard_reason or '-'}); tunnel-path MQTT: "
                   + (", ".join(f"{n}={s.value}" for n, s in view.tunnel_mqtt.items())
                      or "none"))
        self._wanted = (healthy, reason, message)
        if self._sender is None or self._sender.done():
            self._sender = self._spawn(self._send_condition(),
                                       "edgeheal.remediation.condition")

    def retry_delay(self) -> float:
        """Seconds before the next send after :attr:`failures` failures in a row."""
        base = min(self.retry_max, self.retry_min * 2.0 ** max(0, self.failures - 1))
        return base * self._rng.uniform(0.5, 1.0)

    async def _send_condition(self) -> None:
        """Send the wanted condition until it is sent, backing off between failures."""
        from edgeheal.boundaries.kube import KubeError, KubePermissionError

        while self.condition and self._wanted is not None and self._wanted[0] != self._sent:
            healthy, reason, message = self._wanted
            try:
                await self.kube().set_node_condition(self.node, CONDITION_TYPE, healthy,
                                                     reason, message)
            except KubePermissionError as err:
                log.warning("not keeping the %s Node condition: %s", CONDITION_TYPE, err)
                self.condition = False
                return
            except Exception as err:  # an API error, or a bug: retried later, never dead
                self.failures += 1
                delay = self.retry_delay()
                if isinstance(err, KubeError):
                    log.warning("could not update the %s condition: %s; again in %.0fs",
                                CONDITION_TYPE, err, delay)
                else:
                    log.exception("could not update the %s condition; again in %.0fs",
                                  CONDITION_TYPE, delay)
                await asyncio.sleep(delay)
            else:
                self._sent, self.failures = healthy, 0
