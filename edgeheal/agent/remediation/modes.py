"""Mode selection: which remedy the actor uses on this node, and why.

Why apart from the actor: choosing is driven entirely by the remedy registry
(:mod:`edgeheal.remedies`), so this module — and everything above it — names no mode.
``mode`` set to a registered remedy uses that one (a probe says whether it can act *now*,
but it is used either way: the operator asked for it). ``auto`` probes the registered
remedies in their registry order and takes the first usable one; a remedy that cannot
exist in this configuration (``pod`` without ``[kubernetes]``) is not even built. Nothing
usable is ``none`` (alert only), and the actor probes again every minute. What was picked
and why is logged once per change and shown in ``/status``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeheal import remedies
from edgeheal.base import compat
from edgeheal.core.flannel_ladder import NO_REMEDY
from edgeheal.remedies import Availability, Needs, Remedy, RemedyError

if TYPE_CHECKING:
    from edgeheal.boundaries.kube import KubeClient
    from edgeheal.config import Config

log = logging.getLogger("edgeheal.remediation.modes")  # the name operators grep for

AUTO = "auto"
PROBE_TIMEOUT = 30.0
"""Seconds one remedy's probe may take before it counts as not usable."""

RemedyFactory = Callable[[str], Remedy | None]
"""mode -> remedy instance (None when that mode cannot exist in this configuration)."""


@dataclass(frozen=True, slots=True)
class Selection:
    """The remedy in use (None: alert only), its mode and the reason it was picked."""

    remedy: Remedy | None
    mode: str
    why: str


def initial(configured: str) -> Selection:
    """Before the first probe: the configured mode, or ``auto`` still resolving."""
    return Selection(None, configured, "resolving" if configured == AUTO else "configured")


def factory(config: Config, kube: Callable[[], KubeClient],
            ladder: str = remedies.FLANNEL) -> RemedyFactory:
    """Build ``ladder``'s remedies from their registrations, sharing the actor's Kubernetes
    client."""
    def make(mode: str) -> Remedy | None:
        reg = remedies.by_mode(mode, ladder)
        if reg is None or reg.unavailable(config):
            return None
        return reg.factory(Needs(config=config, kube=kube))

    return make


async def probe(remedy: Remedy) -> Availability:
    try:
        async with compat.timeout(PROBE_TIMEOUT):  # wait_for before 3.12 can swallow a cancel
            return await remedy.probe()
    except compat.TimeoutErrors:
        return Availability(False, f"probe timed out after {PROBE_TIMEOUT:g}s")
    except RemedyError as err:
        return Availability(False, str(err))


async def resolve(config: Config, make: RemedyFactory, previous: Selection) -> Selection:
    """Pick the remedy (``auto``: probe in registry order) and say why."""
    configured = config.remediation.mode
    if configured != AUTO:
        remedy = make(configured)
        if remedy is None:
            chosen = Selection(None, NO_REMEDY, f"mode {configured} is not available here")
        else:
            availability = await probe(remedy)
            now = (availability.why if availability.usable
                   else f"not usable now: {availability.why}")
            chosen = Selection(remedy, configured, f"configured; {now}")
        log.info("remediation mode %s: %s", chosen.mode, chosen.why)
        return chosen
    reasons = []
    for reg in remedies.registrations():
        remedy = make(reg.mode)
        if remedy is None:
            reasons.append(f"{reg.mode}: {reg.unavailable(config) or 'not configured'}")
            continue
        availability = await probe(remedy)
        if availability.usable:
            chosen = Selection(remedy, reg.mode, f"auto: {availability.why}")
            log.info("remediation mode %s: %s", chosen.mode, chosen.why)
            return chosen
        reasons.append(f"{reg.mode}: {availability.why}")
    why = "auto: nothing to restart (" + "; ".join(reasons) + ")"
    if (previous.mode, previous.why) != (NO_REMEDY, why):
        log.info("remediation mode %s: %s", NO_REMEDY, why)
    return Selection(None, NO_REMEDY, why)
