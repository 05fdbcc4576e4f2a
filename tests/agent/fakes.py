"""Scripted checks for supervisor and HTTP tests (the real checks are tested per subsystem)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from edgeheal.config import CheckSettings
from edgeheal.model import CheckResult, State


@dataclass
class ScriptedCheck:
    """Returns the results of ``script`` in turn (the last one repeats)."""

    name: str
    settings: CheckSettings = field(default_factory=CheckSettings)
    script: list[CheckResult | Exception | Callable[[], object]] = field(
        default_factory=lambda: [CheckResult(State.OK, "ok")])
    delay: float = 0.0
    runs: int = 0

    async def run(self) -> CheckResult:
        step = self.script[min(self.runs, len(self.script) - 1)]
        self.runs += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if isinstance(step, Exception):
            raise step
        if callable(step):
            step = step()  # type: ignore[assignment]
        assert isinstance(step, CheckResult)
        return step


def ok(reason: str = "ok") -> CheckResult:
    return CheckResult(State.OK, reason, "fine")


def failed(reason: str = "broken") -> CheckResult:
    return CheckResult(State.FAILED, reason, "it broke")


def degraded(reason: str = "wobbly") -> CheckResult:
    return CheckResult(State.DEGRADED, reason, "it wobbles")
