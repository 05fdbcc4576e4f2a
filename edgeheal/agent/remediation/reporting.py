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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from edgeheal.model import State

if TYPE_CHECKING:
    from edgeheal.boundaries.kube import KubeClient
    from edgeheal.config import Config
    from edgeheal.core.flannel_ladder import TunnelView

log = logging.getLogger("edgeheal.remediation.reporting")  # the name operators grep for

CONDITION_TYPE = "EdgeTunnelHealthy"


class NodeReporter:
    def __init__(self, config: Config, kube: Callable[[], KubeClient]) -> None:
        self.node = config.node
        settings = config.kubernetes
        self.kube = kube
        self.events = settings is not None and settings.events
        """Record Node Events (off without ``[kubernetes]``, by setting, or after a 403)."""
        self.condition = settings is not None and settings.node_condition
        """Keep the Node condition (off without ``[kubernetes]``, by setting, or after a 403)."""
        self._last: bool | None = None
        self.background: set[asyncio.Task[None]] = set()

    def cancel(self) -> None:
        for task in list(self.background):
            task.cancel()

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        async def run() -> None:
            await coro

        task = asyncio.get_running_loop().create_task(run(), name=name)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

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
        if healthy == self._last:
            return
        self._last = healthy
        reason = "TunnelHealthy" if healthy else (
            "Tunnel" + "".join(p.title() for p in (view.failure() or view.wireguard_reason
                                                   or "unknown").split("_")))
        message = (f"wireguard {view.wireguard.value if view.wireguard else 'not watched'}"
                   f" ({view.wireguard_reason or '-'}); tunnel-path MQTT: "
                   + (", ".join(f"{n}={s.value}" for n, s in view.tunnel_mqtt.items())
                      or "none"))
        self._spawn(self._patch_condition(healthy, reason, message),
                    "edgeheal.remediation.condition")

    async def _patch_condition(self, healthy: bool | None, reason: str, message: str,
                               ) -> None:
        from edgeheal.boundaries.kube import KubeError, KubePermissionError

        try:
            await self.kube().set_node_condition(self.node, CONDITION_TYPE, healthy, reason,
                                                 message)
        except KubePermissionError as err:
            log.warning("not keeping the %s Node condition: %s", CONDITION_TYPE, err)
            self.condition = False
        except KubeError as err:
            self._last = None  # try again on the next evaluation that differs
            log.warning("could not update the %s condition: %s", CONDITION_TYPE, err)
