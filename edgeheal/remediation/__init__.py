"""Remediation: restart Flannel when the tunnel is broken, carefully.

Why a package of small modules: deciding is pure (:mod:`edgeheal.policy`), how to restart
is each remedy's (:mod:`edgeheal.remedies`, a registry), and what is left here is doing it,
one job per module:

- :mod:`~edgeheal.remediation.actor` — the loop: read the snapshot, decide, carry out the
  actions (restart through the remedy, verify the tunnel, count, alert);
- :mod:`~edgeheal.remediation.modes` — which remedy this node uses and why (``auto``
  probes the registered remedies in order), driven by the registry alone;
- :mod:`~edgeheal.remediation.history` — the persisted history, every piece of state a
  decision reads, surviving agent restarts and wall-clock steps;
- :mod:`~edgeheal.remediation.reporting` — Events on the Node and the
  ``EdgeTunnelHealthy`` condition (best effort, in the background);
- :mod:`~edgeheal.remediation.operator` — the control-socket commands (pause, resume,
  reset) and the ``/status`` view.

The agent's hook is :func:`build`.
"""

from __future__ import annotations

import logging

from edgeheal.model import Context
from edgeheal.policy import NO_REMEDY
from edgeheal.remediation.actor import Remediator
from edgeheal.remediation.history import (
    HISTORY_FILE,
    HistoryError,
    Timeline,
    boot_id,
    boottime,
)
from edgeheal.remediation.modes import RemedyFactory
from edgeheal.remediation.reporting import CONDITION_TYPE

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
]

log = logging.getLogger(__name__)


def build(ctx: Context) -> Remediator | None:
    """The agent's hook: a remediator unless ``mode = "none"``."""
    if ctx.config.remediation.mode == NO_REMEDY:
        log.info("remediation mode none (configured): alerts only")
        return None
    return Remediator(ctx)
