"""The uplink ladder's actor: the Flannel actor with the uplink's evidence and rungs.

Why a subclass and not a second actor: the safeguards around an attempt — the history
persisted before and after it (so an agent killed by ``kill -9`` mid-rung still counts
it), dry-run, skips said once per episode, the circuit, pause/resume/reset on the control
socket, the counters and the ``/status`` view — are the ones Flannel's ladder proved, and
they must stay one implementation (:class:`~edgeheal.agent.remediation.flannel_actor.Remediator`).
This
class only fills the actor's *ladder hooks*:

- the decision is :func:`edgeheal.core.uplink_ladder.decide` over
:func:`edgeheal.core.uplink_ladder.view_of`, with
  the rungs usable on this node, probed when the uplink check first leaves ``ok`` and
  again every minute while it is not ok (ModemManager or NetworkManager may come and go);
  never while it is fine, so a healthy uplink costs no D-Bus call and no dbus-fast import;
- a decision names its rung (``Action.rung``), the remedy registered for it under
  ``ladder = "uplink"`` carries it out;
- recovery is a fresh ``ok`` of the ``uplink`` check *and* of every direct-path MQTT
  target after the rung;
- before the ``reboot`` rung, the alert ``uplink_ladder.rebooting`` is raised and the
  reboot goes ahead only if the outbox took it durably (``durable()``, the agent's view of
  the outbox); otherwise a ``skip`` ``alert_not_durable``;
- its own alert kinds (``uplink_ladder.*``), control commands (``remediation.uplink.*``),
  history file (``uplink-history.json``), metric label (``ladder="uplink"``) and Node
  Event reasons.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from edgeheal import remedies
from edgeheal.agent.remediation import modes
from edgeheal.agent.remediation.flannel_actor import REPROBE_EVERY, Remediator
from edgeheal.agent.remediation.metrics import RESTART_RESULTS
from edgeheal.core import uplink_ladder as uplink
from edgeheal.core.path_verdict import targets
from edgeheal.core.safeguards import Action
from edgeheal.model import Context, Snapshot, State
from edgeheal.remedies import Remedy

if TYPE_CHECKING:
    from edgeheal.config import UplinkLadderSettings

log = logging.getLogger("edgeheal.remediation.uplink")  # the name operators grep for

HISTORY_FILE = "uplink-history.json"


class UplinkRemediator(Remediator):
    LADDER: ClassVar[str] = remedies.UPLINK
    KIND: ClassVar[str] = "uplink_ladder"
    COMMANDS: ClassVar[str] = "remediation.uplink"
    HISTORY: ClassVar[str] = HISTORY_FILE
    NODE_EVENTS: ClassVar[Mapping[str, str]] = {
        "acted": "UplinkRungTried", "recovered": "UplinkRecovered",
        "skipped": "UplinkRungSkipped", "circuit_open": "UplinkCircuitOpen"}
    WHAT: ClassVar[str] = "the uplink"
    SUBJECT: ClassVar[str] = "the uplink"
    OBEYS_FLEET_HOLD: ClassVar[bool] = False  # a hub fault is not the uplink's
    COUNTED: ClassVar[tuple[tuple[str, str], ...]] = (
        *(("restart", r) for r in RESTART_RESULTS),
        *(("skip", r) for r in (*uplink.SKIP_REASONS, "alert_not_durable")),
        ("open_circuit", "opened"), ("close_circuit", "closed"))

    def __init__(self, ctx: Context, *, durable: Callable[[], bool] = lambda: True,
                 **kw: Any) -> None:
        self.durable = durable
        self.rungs: dict[str, Remedy] = {}
        self.usable: tuple[str, ...] = ()
        self.why: dict[str, str] = {}
        self._reason: str | None = None
        self._reason_since = -math.inf
        """The uplink check's reason and since when this actor has seen it change (before
        the first change: the snapshot's ``since_mono``)."""
        self._probed: float | None = None
        """When the rungs were last probed (None: not yet, the uplink has been fine)."""
        self.ladder: UplinkLadderSettings = ctx.config.remediation.uplink
        super().__init__(ctx, settings=self.ladder, **kw)

    @property
    def configured_mode(self) -> str:
        return ", ".join(self.ladder.rungs)

    # --- hooks -----------------------------------------------------------------------------

    async def resolve(self) -> None:
        """Probe the rungs only once the uplink is in trouble (:meth:`evaluate`): probing
        asks ModemManager and NetworkManager over D-Bus, and a healthy uplink must cost
        neither the calls nor the dbus-fast import (RSS, docs/footprint.md)."""
        if self._probed is None:
            self.selection = modes.Selection(
                None, "not probed", "the rungs are probed when the uplink is in trouble")

    async def probe_rungs(self) -> None:
        """Probe every configured rung; the usable ones, in order, are the ladder."""
        self._probed = self.clock()
        usable, why = [], {}
        for rung in self.ladder.rungs:
            remedy = self.rungs.get(rung)
            if remedy is None:
                remedy = self._make(rung)
                if remedy is None:
                    reg = remedies.by_mode(rung, self.LADDER)
                    why[rung] = (reg.unavailable(self.config) if reg is not None
                                 else "not installed") or "not configured"
                    continue
                self.rungs[rung] = remedy
            availability = await modes.probe(remedy)
            why[rung] = availability.why
            if availability.usable:
                usable.append(rung)
        if (tuple(usable), why) != (self.usable, self.why):
            log.info("uplink ladder: usable rungs %s (%s)", ", ".join(usable) or "none",
                     "; ".join(f"{k}: {v}" for k, v in why.items()))
        self.usable, self.why = tuple(usable), why
        self.selection = modes.Selection(
            None, " > ".join(self.usable) or "none",
            "; ".join(f"{k}: {v}" for k, v in why.items()) or "no rung configured")

    def reprobe_wanted(self) -> bool:
        return False  # evaluate() probes, while the uplink is in trouble

    def counted_rungs(self) -> tuple[tuple[str, str], ...]:
        return ()  # the first rung is the Flannel ladder's

    async def evaluate(self, snap: Snapshot) -> list[Action]:
        status = snap.checks.get(uplink.UPLINK)
        trouble = status is not None and status.completed and status.state is not State.OK
        if trouble and (self._probed is None or self.clock() - self._probed >= REPROBE_EVERY):
            await self.probe_rungs()
        return await super().evaluate(snap)

    def decide(self, snap: Snapshot) -> list[Action]:
        status = snap.checks.get(uplink.UPLINK)
        reason = status.reason if status is not None else ""
        if self._reason is None:  # first sight: the snapshot's date is all there is
            self._reason = reason
        elif reason != self._reason:  # the snapshot dates the state, not the reason
            self._reason, self._reason_since = reason, self.clock()
        view = uplink.view_of(snap, self.config, rungs=self.usable,
                              booted_mono=self.clock() - self.boot_clock(),
                              reason_since=self._reason_since)
        return uplink.decide(view, self.history, self.clock(), self.ladder)

    def remedy_for(self, action: Action) -> tuple[Remedy | None, str]:
        return self.rungs.get(action.rung), action.rung

    def verified_by(self) -> tuple[str, ...]:
        return (uplink.UPLINK, *targets(self.config, "direct"))

    async def before(self, action: Action, detail: Mapping[str, Any],
                     correlation: str) -> str:
        if action.rung != uplink.REBOOT:
            return ""
        self._emit(f"{self.KIND}.rebooting",
                   f"rebooting the node: {action.message} (the last rung; at most once a "
                   "day)", dict(detail), correlation)
        if not self.durable():
            log.critical("uplink ladder: not rebooting: the alert could not be written to "
                         "the outbox (it would be lost with the reboot)")
            return "alert_not_durable"
        return ""

    def view(self) -> dict[str, Any]:
        out = super().view()
        out["rungs"] = {r: {"usable": r in self.usable, "why": self.why.get(r, "")}
                        for r in self.ladder.rungs}
        out["act_after_seconds"] = self.ladder.act_after
        return out

    async def serve(self) -> None:
        try:
            await super().serve()
        finally:
            for remedy in self.rungs.values():
                close = getattr(remedy, "close", None)
                if close is not None:
                    try:
                        await close()
                    except Exception as err:  # closing must not mask the stop
                        log.debug("closing rung %s: %s", remedy.mode, err)
