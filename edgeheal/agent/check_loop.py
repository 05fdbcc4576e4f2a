"""The checks' loops: each check run on its cadence, under its timeout, its result debounced.

Why apart from the supervisor: the supervisor keeps the one snapshot and the tasks; this
module is what happens inside one task ``edgeheal.check.<name>`` (the supervisor names and
spawns it) and the statuses those loops keep, from which the supervisor builds the snapshot.
A check that raises or times out becomes ``unknown`` with the error recorded (reasons
``check_error`` / ``check_timeout``) and never takes the agent down; every run is timed and
counted (``edgeheal_check_runs_total{check,result}``, ``edgeheal_check_duration_seconds``).

Scheduling (frugal in health, quick in doubt): a healthy check runs every ``interval``
and nothing more. After a result that is not ok, or while the effective state is not ok,
a check with a ``retry_interval`` runs again that long after its last run ended (for
:data:`~edgeheal.agent.cadence.QUICK_RETRY_FOR` at most), so ``fail_after``/
``recover_after`` are reached in seconds. A check may ask for another one to run now
(``Context.hasten``, e.g. the WireGuard check confirming a suspicion with the tunnel-path
MQTT probe): the loop waits on its interval *or* a wake-up, and a hastened run starts no
sooner than ``hasten_spacing`` (the agent's :data:`~edgeheal.agent.supervisor.HASTEN_SPACING`)
after the previous run ended; a check already in doubt keeps its retry cadence and
ignores it. The decision is :func:`~edgeheal.agent.cadence.next_due`, a pure function.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from edgeheal.agent.cadence import Cadence, in_doubt, next_due
from edgeheal.base import compat
from edgeheal.core import debounce
from edgeheal.model import CheckResult, CheckStatus, State

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgeheal.boundaries.prometheus import AgentMetrics
    from edgeheal.checks import Check
    from edgeheal.config import Config

log = logging.getLogger("edgeheal.agent")  # the name operators grep for


class CheckLoops:
    """Every check's loop, and the debounced status each keeps (:attr:`statuses`)."""

    def __init__(self, config: Config, metrics: AgentMetrics, *,
                 clock: Callable[[], float], wall: Callable[[], datetime],
                 publish: Callable[[], None], hasten_spacing: float) -> None:
        """``publish``: called after every recorded run (the supervisor's new snapshot)."""
        self.config, self.metrics = config, metrics
        self.clock, self.wall, self.publish = clock, wall, publish
        self.hasten_spacing = hasten_spacing
        self.statuses: dict[str, CheckStatus] = {}
        """Check name -> its debounced status, in the checks' order."""
        self._history: dict[str, tuple[CheckResult, ...]] = {}
        self._cadence: dict[str, Cadence] = {}
        self._checks: list[Check] = []

    def add(self, checks: Iterable[Check], reasons: Callable[[str], Iterable[str]]) -> None:
        """Take ``checks`` on: each one's ``pending`` status, its metrics (``reasons``: a
        check's name -> its reason table), its cadence."""
        now, wall = self.clock(), self.wall()
        for check in checks:
            self.statuses[check.name] = debounce.initial(
                check.name, required=check.settings.required, now=now, wall=wall)
            self.metrics.declare(self.statuses[check.name], reasons(check.name))
            self._cadence[check.name] = Cadence()
            self._checks.append(check)

    def hasten(self, name: str) -> None:
        """Run check ``name`` now rather than at its next interval (``Context.hasten``).

        Bounded: the run starts no sooner than :attr:`hasten_spacing` after the check's
        last run ended; a check in doubt keeps its retry cadence; unknown names are
        ignored. Never blocks, never raises."""
        cadence = self._cadence.get(name)
        if cadence is None:
            log.debug("hasten: no check named %r", name)
            return
        if cadence.doubt_since is None and not cadence.wake.is_set():
            cadence.wake.set()

    async def _pause(self, name: str, cadence: Cadence, due: float, ended: float) -> None:
        """Sleep until ``due`` or, when hastened, until ``ended`` + the spacing."""
        hastened = False
        while (left := due - self.clock()) > 0:
            try:
                async with compat.timeout(left):
                    await cadence.wake.wait()
            except compat.TimeoutErrors:
                break
            cadence.wake.clear()
            if not hastened:
                hastened = True
                due = min(due, ended + self.hasten_spacing)
                log.debug("check %s hastened", name, extra={"check": name})

    async def run(self, check: Check) -> None:
        """``check``'s loop, for ever (the task ``edgeheal.check.<name>``)."""
        interval = check.settings.effective_interval(self.config.agent)
        retry = check.settings.retry_interval
        timeout = check.settings.timeout
        cadence = self._cadence[check.name]
        while True:
            cadence.wake.clear()
            began = self.clock()
            try:
                async with compat.timeout(timeout):
                    result = await check.run()
                outcome = "completed"
            except compat.TimeoutErrors:
                result = CheckResult(State.UNKNOWN, "check_timeout",
                                     f"no result within {timeout:g}s")
                outcome = "timeout"
            except Exception as err:  # a check must never take the agent down
                log.warning("check %s raised %s: %s", check.name, type(err).__name__, err,
                            extra={"check": check.name}, exc_info=log.isEnabledFor(
                                logging.DEBUG))
                result = CheckResult(State.UNKNOWN, "check_error",
                                     f"{type(err).__name__}: {err}")
                outcome = "error"
            ended = self.clock()
            self._record(check, result, ended - began, outcome)
            if not in_doubt(result, self.statuses[check.name]):
                cadence.doubt_since = None
            elif cadence.doubt_since is None:
                cadence.doubt_since = began
            await self._pause(check.name, cadence, next_due(
                began=began, ended=ended, interval=interval, retry=retry,
                doubt_since=cadence.doubt_since), ended)

    def _record(self, check: Check, result: CheckResult, duration: float, outcome: str) -> None:
        old = self.statuses[check.name]
        status, self._history[check.name] = debounce.advance(
            old, result, now=self.clock(), wall=self.wall(),
            fail_after=check.settings.fail_after, recover_after=check.settings.recover_after,
            history=self._history.get(check.name, ()))
        status = dataclasses.replace(status, last_duration=duration)
        self.statuses[check.name] = status
        self.metrics.observe_run(check.name, status, duration, outcome)
        if status.state is not old.state or status.reason != old.reason:
            level = logging.INFO if status.state.serving else logging.WARNING
            log.log(level, "check %s: %s (%s) -> %s (%s): %s", check.name, old.state.value,
                    old.reason, status.state.value, status.reason, status.message,
                    extra={"check": check.name})
        self.publish()

    def stuck(self, now: float, since: float) -> list[str]:
        """Checks whose loop has not completed a run for much longer than it should
        (``since``: when the loops started, for a check that has not run yet)."""
        out = []
        for check in self._checks:
            status = self.statuses[check.name]
            last = status.last_run_mono if status.last_run_mono is not None else since
            bound = 2 * (check.settings.effective_interval(self.config.agent)
                         + check.settings.timeout) + 5.0
            if now - last > bound:
                out.append(check.name)
        return out
