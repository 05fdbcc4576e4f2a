"""Drive the real ``wireguard`` check against a real mesh: run it at a short cadence, fold
results through the real debounce, and keep a timeline the tests assert causal bounds on."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from edgeheal.base.compat import UTC
from edgeheal.checks.wireguard import WireguardCheck
from edgeheal.core import debounce
from edgeheal.lab.wireguard import WgMesh
from edgeheal.model import CheckResult, CheckStatus, Context
from tests.support import context, until

log = logging.getLogger(__name__)

INTERVAL = 1.0
FAIL_AFTER = 2
RECOVER_AFTER = 2
GRACE = 10.0


def config_for(mesh: WgMesh, *, target_node: int = 1, extra: str = "") -> str:
    """The edge node is node 0; the broker sits in node ``target_node``'s pod subnet."""
    target = mesh.nodes[target_node].pod_cidr.replace(".0/24", ".5")
    return f"""
[agent]
check_interval = "{INTERVAL}s"
[wireguard]
interfaces = ["{mesh.nodes[0].ifname}", "{mesh.nodes[0].ifname}x"]
fail_after = {FAIL_AFTER}
recover_after = {RECOVER_AFTER}
connect_grace = "{GRACE}s"
{extra}
[[mqtt.targets]]
name = "cloud"
host = "{target}"
path = "tunnel"
"""


def real_time(ctx: Context) -> Context:
    """The context on the real clocks: the mesh's handshakes and timers are real."""
    return replace(ctx, clock=time.monotonic, wall=lambda: datetime.now(UTC))


@dataclass
class Sample:
    t: float
    result: CheckResult
    status: CheckStatus

    def peer(self, fingerprint: str) -> dict[str, Any]:
        return next(p for p in self.result.detail["peers"] if p["peer"] == fingerprint)


@dataclass
class Driver:
    check: WireguardCheck
    status: CheckStatus | None = None
    history: tuple[CheckResult, ...] = ()
    samples: list[Sample] = field(default_factory=list)

    @classmethod
    def for_mesh(cls, mesh: WgMesh, **kw: Any) -> Driver:
        return cls(WireguardCheck(real_time(context(config_for(mesh, **kw)).ctx)))

    async def step(self) -> Sample:
        now = time.monotonic()
        result = await self.check.run()
        if self.status is None:
            self.status = debounce.initial("wireguard", required=True, now=now,
                                           wall=datetime.now(UTC))
        self.status, self.history = debounce.advance(
            self.status, result, now=now, wall=datetime.now(UTC), fail_after=FAIL_AFTER,
            recover_after=RECOVER_AFTER, history=self.history)
        sample = Sample(now, result, self.status)
        self.samples.append(sample)
        return sample

    async def until(self, predicate: Callable[[Sample], bool], within: float,
                    what: str) -> Sample:
        """Run the check every INTERVAL until ``predicate`` holds; fail after ``within`` s
        (the suite's bounded poller, driving the check)."""

        def report(sample: Sample) -> str:
            last = sample.result
            return (f"effective {sample.status.state.value}/{sample.status.reason}, raw "
                    f"{last.state.value}/{last.reason}: {last.message}")

        return await until(self.step, holds=predicate, within=within, every=INTERVAL,
                           what=what, report=report)

    def reasons(self, since: float = 0.0) -> list[str]:
        return [s.result.reason for s in self.samples if s.t >= since]

    def effective(self, since: float = 0.0) -> list[str]:
        return [s.status.reason for s in self.samples if s.t >= since]
