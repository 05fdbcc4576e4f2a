"""The control ladder's actor: restart the K3s agent when it has lost its server.

Why a subclass of the Flannel actor, like the uplink's: the safeguards around an attempt
— the history persisted before and after it (an agent killed mid-restart still counts
it), dry-run, skips said once per episode, the circuit, pause/resume/reset on the control
socket, the counters and the ``/status`` view — must stay one implementation
(:class:`~edgeheal.agent.remediation.flannel_actor.Remediator`). This class fills the
*ladder hooks*:

- the decision is :func:`edgeheal.core.control_ladder.decide` over
  :func:`~edgeheal.core.control_ladder.view_of`; ``busy`` — the other ladders acting now —
  comes from the agent (``others``: it asks the Flannel and the uplink actors), so the
  agent is never restarted under a Flannel restart or a modem reconnect;
- the remedy is the registered ``k3s-service`` remedy (:mod:`edgeheal.remedies.k3s_service`:
  ``RestartUnit`` of the ``[remediation.service]`` unit over systemd's D-Bus API, the
  polkit rule ``50-edgeheal-k3s-restart.rules``), probed only once the ``control`` check is
  in trouble and then every minute while it stays so: a healthy node costs no D-Bus call
  and no dbus-fast import (RSS);
- for ``balancer_stuck``, :meth:`before` removes the agent's load-balancer state file
  (``balancer_state``; k3s-io/k3s#11349) when the agent's user may remove it; the shipped
  unit (``ProtectSystem=strict``) may not, and the restart then goes ahead without and its
  alerts say why in ``detail.balancer_state``;
- a fleet hold (``[fleet] hold``) holds it as it holds the Flannel ladder (the base
  class's :meth:`fleet_hold` reads the alert link's last hold), and the first restart of
  an episode waits its random part of ``[remediation] restart_jitter`` (drawn by the pure
  ladder from the actor's ``rng``, kept in the history): a fault on the server's side
  reaches every node's Lease in the same second;
- recovery is a fresh ``ok`` of the ``control`` check after the restart, and its effective
  state ``ok`` (the debounce through): else the next decision restarts again;
- its own alert kinds (``control_ladder.*``), control commands
  (``remediation.control.*``), history file (``control-history.json``), metric label
  (``ladder="control"``) and Node Event reasons.

Cost: nothing while the check is ok (the decision is a pure function of the snapshot, once
a second at most); one D-Bus connection per probe (only in trouble) and per restart.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgeheal import checks, remedies
from edgeheal.agent.remediation import modes
from edgeheal.agent.remediation.flannel_actor import REPROBE_EVERY, Remediator
from edgeheal.agent.remediation.metrics import RESTART_RESULTS
from edgeheal.core import control_ladder as control
from edgeheal.core.safeguards import Action
from edgeheal.model import Context, Snapshot, State
from edgeheal.remedies import Remedy

if TYPE_CHECKING:
    from edgeheal.config import ControlLadderSettings

log = logging.getLogger("edgeheal.remediation.control")  # the name operators grep for

HISTORY_FILE = "control-history.json"
CLEAR_FOR = frozenset(f"control_{reason}" for reason in control.CLEAR_BALANCER)
"""The actions' reasons (``control_<verdict>``) whose restart clears the balancer first."""


def clear_balancer(path: str) -> str:
    """Remove the agent's load-balancer state file; say what happened (never raises)."""
    if not path:
        return "not removed: [remediation.control] balancer_state is empty"
    file = Path(path)
    try:
        file.unlink()
    except FileNotFoundError:
        return f"{file} was not there"
    except OSError as err:
        return (f"not removed: {err.strerror} (uid {os.geteuid()}; the shipped unit's "
                "ProtectSystem=strict keeps K3s's directory read-only: docs/control.md)")
    return f"removed {file}"


class ControlRemediator(Remediator):
    LADDER: ClassVar[str] = remedies.CONTROL
    KIND: ClassVar[str] = "control_ladder"
    COMMANDS: ClassVar[str] = "remediation.control"
    HISTORY: ClassVar[str] = HISTORY_FILE
    NODE_EVENTS: ClassVar[Mapping[str, str]] = {
        "acted": "K3sAgentRestarted", "recovered": "ControlPathRecovered",
        "skipped": "K3sAgentRestartSkipped", "circuit_open": "ControlCircuitOpen"}
    WHAT: ClassVar[str] = "the K3s agent"
    SUBJECT: ClassVar[str] = "the control path"
    OBEYS_FLEET_HOLD: ClassVar[bool] = True  # a server-side fault stales every node at once
    COUNTED: ClassVar[tuple[tuple[str, str], ...]] = (
        *(("restart", r) for r in RESTART_RESULTS),
        *(("skip", r) for r in control.SKIP_REASONS),
        ("open_circuit", "opened"), ("close_circuit", "closed"))

    def __init__(self, ctx: Context, *,
                 others: Callable[[], tuple[str, ...]] = lambda: (),
                 remedy_factory: modes.RemedyFactory | None = None, **kw: Any) -> None:
        self.others = others
        """The other ladders acting now (their actors' ``busy``), asked at each decision."""
        self.ladder: ControlLadderSettings = ctx.config.remediation.control
        self.limits = control.ControlLimits(
            act_after=self.ladder.act_after, not_ready_window=self.ladder.not_ready_window,
            cooldown=self.ladder.cooldown, max_per_hour=self.ladder.max_per_hour,
            startup_grace=self.ladder.startup_grace,
            give_up_after=self.ladder.give_up_after,
            restart_jitter=ctx.config.remediation.restart_jitter, dry_run=self.ladder.dry_run)
        self._reason: str | None = None
        self._reason_since = -math.inf
        self._probed: float | None = None
        self._remedy: Remedy | None = None
        self.check = next(iter(checks.role("control").names(ctx.config)), "control")
        super().__init__(ctx, settings=self.ladder, remedy_factory=remedy_factory, **kw)

    @property
    def configured_mode(self) -> str:
        """The ladder's one remedy: the first registered for it (``k3s-service``)."""
        regs = remedies.registrations(self.LADDER)
        return regs[0].mode if regs else "none"

    # --- hooks -----------------------------------------------------------------------------

    async def resolve(self) -> None:
        """Probe only once the control path is in trouble (:meth:`evaluate`)."""
        if self._probed is None:
            self.selection = modes.Selection(
                None, self.configured_mode,
                "not probed: the K3s unit is probed when the control check fails")

    def reprobe_wanted(self) -> bool:
        return False  # evaluate() probes, while the control check is in trouble

    def _remedy_now(self) -> Remedy | None:
        if self._remedy is None:
            self._remedy = self._make(self.configured_mode)
        return self._remedy

    async def probe(self) -> None:
        self._probed = self.clock()
        remedy = self._remedy_now()
        if remedy is None:
            self.selection = modes.Selection(None, self.configured_mode,
                                             "no remedy is registered for this ladder")
            return
        availability = await modes.probe(remedy)
        if availability.why != self.selection.why:
            log.info("control ladder: %s %s (%s)", self.configured_mode,
                     "usable" if availability.usable else "not usable", availability.why)
        self.selection = modes.Selection(remedy if availability.usable else None,
                                         self.configured_mode, availability.why)

    async def evaluate(self, snap: Snapshot) -> list[Action]:
        status = snap.checks.get(self.check)
        trouble = status is not None and status.completed and status.state is State.FAILED
        if trouble and (self._probed is None or self.clock() - self._probed >= REPROBE_EVERY):
            await self.probe()
        return await super().evaluate(snap)

    def decide(self, snap: Snapshot) -> list[Action]:
        status = snap.checks.get(self.check)
        reason = status.reason if status is not None else ""
        if self._reason is None:  # first sight: the snapshot's date is all there is
            self._reason = reason
        elif reason != self._reason:  # the snapshot dates the state, not the reason
            self._reason, self._reason_since = reason, self.clock()
        view = control.view_of(snap, self.config, busy=self.others(),
                               booted_mono=self.clock() - self.boot_clock(),
                               reason_since=self._reason_since, fleet_hold=self.fleet_hold())
        seen = control.episode_over(view, self.history)
        if seen is not self.history:
            self.store(seen)
        return control.decide(view, self.history, self.clock(), self.limits,
                              rand=self.rng.random)

    def remedy_for(self, action: Action) -> tuple[Remedy | None, str]:
        # even when the probe said "not usable": the restart then fails with the remedy's
        # own words (no unit, polkit), a config problem, rather than passing for a dry run
        return self._remedy_now(), self.configured_mode

    def verified_by(self) -> tuple[str, ...]:
        return (self.check,)

    def cured(self, snap: Snapshot, name: str, since: float) -> bool:
        """A fresh ``ok`` *and* the check's effective state ``ok``: until its debounce
        (``recover_after``) has cleared the verdict, the next decision would still see the
        old one and restart again (the end-to-end test found exactly that)."""
        return super().cured(snap, name, since) and snap.checks[name].state is State.OK

    async def before(self, action: Action, detail: dict[str, Any],
                     correlation: str) -> str:
        if action.reason in CLEAR_FOR:
            said = clear_balancer(self.ladder.balancer_state)
            detail["balancer_state"] = said
            level = logging.INFO if said.startswith("removed") else logging.WARNING
            log.log(level, "control ladder: load-balancer state %s", said)
        return ""

    def view(self) -> dict[str, Any]:
        out = super().view()
        out["act_after_seconds"] = self.ladder.act_after
        out["not_ready_window_seconds"] = self.ladder.not_ready_window
        out["acts_on"] = sorted(checks.role("control").vocabulary.get("healable", ()))
        return out
