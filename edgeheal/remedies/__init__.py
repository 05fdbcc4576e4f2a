"""Remedies: actors that restart Flannel, one module per way of doing it.

The pure policy (:mod:`edgeheal.policy`) decides *whether* to act; a remedy only knows
*how*: ``pod`` deletes this node's Flannel pod through the Kubernetes API, ``k3s-service``
restarts the k3s/k3s-agent unit over systemd's D-Bus API. Each boundary error is turned
into :class:`RemedyError` with ``config_problem=True`` when a human must fix permissions or
settings (401/403, polkit denial) rather than wait for a retry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class RemedyError(Exception):
    """A restart could not be carried out. The message names what failed, never a secret."""

    def __init__(self, message: str, *, config_problem: bool = False) -> None:
        super().__init__(message)
        self.config_problem = config_problem


@dataclass(frozen=True, slots=True)
class Availability:
    usable: bool
    why: str
    """Human reason, shown in /status and the log ("flannel pod kube-flannel/x on node")."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one restart did: ``target`` names the pod or unit acted on."""

    target: str
    detail: str = ""


class Remedy(Protocol):
    mode: str
    """``pod`` or ``k3s-service``."""

    async def probe(self) -> Availability:
        """Can this remedy act on this node? (used by ``mode = "auto"``)"""
        ...

    async def restart(self) -> Outcome:
        """Restart Flannel and return once the replacement is up (pod Ready / unit
        active), or raise :class:`RemedyError`. Tunnel recovery is verified by the caller."""
        ...
