"""Remediation: restart Flannel when the tunnel is broken, carefully.

Why a package of small modules: deciding is pure (:mod:`edgeheal.core.flannel_ladder`), how to
restart is each remedy's (:mod:`edgeheal.remedies`, a registry), and what is left here is doing it,
one job per module:

- :mod:`~edgeheal.agent.remediation.flannel_actor` — the loop: read the snapshot, decide, carry out
  the actions (skip, watch, the circuit; count, alert);
- :mod:`~edgeheal.agent.remediation.attempt` — one restart: run the remedy within its bound,
  verify the cure from the snapshot, record the attempt before and after;
- :mod:`~edgeheal.agent.remediation.modes` — which remedy this node uses and why (``auto``
  probes the registered remedies in order), driven by the registry alone;
- :mod:`~edgeheal.agent.remediation.history` — the persisted history, every piece of state a
  decision reads, surviving agent restarts and wall-clock steps;
- :mod:`~edgeheal.agent.remediation.reporting` — Events on the Node and the
  ``EdgeTunnelHealthy`` condition (best effort, in the background);
- :mod:`~edgeheal.agent.remediation.operator` — the control-socket commands (pause, resume,
  reset) and the ``/status`` view;
- :mod:`~edgeheal.agent.remediation.uplink_actor` — the uplink ladder's actor: the same actor with
the
  uplink's evidence and rungs (docs/remediation-uplink.md);
- :mod:`~edgeheal.agent.remediation.control_actor` — the control ladder's actor: restart the K3s
  agent when it has lost its server (docs/control.md).

The agent's hooks are :func:`build`, :func:`build_uplink` and :func:`build_control`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edgeheal.agent.remediation.flannel_actor import Remediator
from edgeheal.agent.remediation.history import (
    HISTORY_FILE,
    HistoryError,
    Timeline,
    boot_id,
    boottime,
)
from edgeheal.agent.remediation.modes import RemedyFactory
from edgeheal.agent.remediation.reporting import CONDITION_TYPE
from edgeheal.core.flannel_ladder import NO_REMEDY
from edgeheal.model import Context

__all__ = [
    "CONDITION_TYPE",
    "HISTORY_FILE",
    "HistoryError",
    "Remediator",
    "RemedyFactory",
    "Timeline",
    "boot_id",
    "boottime",
    "build",
    "build_control",
    "build_uplink",
]

log = logging.getLogger("edgeheal.remediation")  # the name operators grep for


def build(ctx: Context) -> Remediator | None:
    """The agent's hook: a remediator unless ``mode = "none"``."""
    if ctx.config.remediation.mode == NO_REMEDY:
        log.info("remediation mode none (configured): alerts only")
        return None
    return Remediator(ctx)


def build_uplink(ctx: Context, *, durable: Callable[[], bool]) -> Remediator | None:
    """The agent's hook for the uplink ladder: an actor when ``[remediation.uplink]
    enabled`` (off by default). ``durable``: the outbox takes alerts durably now."""
    if not ctx.config.remediation.uplink.enabled:
        return None
    from edgeheal.agent.remediation.uplink_actor import UplinkRemediator

    return UplinkRemediator(ctx, durable=durable)


def build_control(ctx: Context, *, others: Callable[[], tuple[str, ...]]) -> Remediator | None:
    """The agent's hook for the control ladder: an actor when ``[remediation.control]
    enabled`` (off by default; config validation requires ``[control]`` then). ``others``:
    the other ladders acting now."""
    if not ctx.config.remediation.control.enabled:
        return None
    from edgeheal.agent.remediation.control_actor import ControlRemediator

    return ControlRemediator(ctx, others=others)
