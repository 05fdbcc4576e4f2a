"""Helpers for the actor tests: a snapshot builder, a scripted remedy, the actor's world.

The fake clock and the poller are the suite's shared ones (:mod:`tests.support`),
re-exported here for the remediation tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from edgeheal import config as cfg
from edgeheal.base.compat import UTC
from edgeheal.model import CheckResult, CheckStatus, Context, Event, Snapshot, State
from edgeheal.remedies import Availability, RemedyError, RemedyOutcome
from tests.support import Clock, until

__all__ = ["EPOCH", "Clock", "ScriptedRemedy", "World", "make_config", "snapshot", "status",
           "until"]

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


NO_KUBE_SIDE = """
[kubernetes]
kubeconfig = "/nonexistent/kubeconfig"
events = false
node_condition = false
"""


def make_config(tmp_path: Path, extra: str = "", *, kube: str = NO_KUBE_SIDE) -> cfg.Config:
    defaults = {"startup_grace": '"0s"', "cooldown": '"1s"', "verify_timeout": '"5s"',
                "restart_jitter": '"0s"'}
    given = {line.split("=")[0].strip() for line in extra.splitlines() if "=" in line}
    extra = "\n".join([f"{k} = {v}" for k, v in defaults.items() if k not in given]
                      + [extra])
    text = f"""
[agent]
node_name = "edge-1"
state_dir = "{tmp_path / 'state'}"

[[mqtt.targets]]
name = "broker-tunnel"
host = "10.42.0.1"
path = "tunnel"

[[mqtt.targets]]
name = "broker-direct"
host = "127.0.0.1"
path = "direct"

{kube}

[remediation]
{extra}
"""
    return cfg.loads_generic(text)


def status(name: str, state: State, reason: str, *, last_run: float,
           observed: State | None = None) -> CheckStatus:
    return CheckStatus(name=name, state=state, reason=reason, message="", since=EPOCH,
                       since_mono=0.0, detail={}, required=False, runs=3,
                       observed=CheckResult(observed or state, reason),
                       last_run_mono=last_run)


def snapshot(at: float, *, wg: State = State.FAILED, wg_reason: str = "stalled",
             tunnel: State = State.FAILED, direct: State = State.OK) -> Snapshot:
    checks = {
        "wireguard": status("wireguard", wg, wg_reason, last_run=at),
        "broker-tunnel": status("broker-tunnel", tunnel, "x", last_run=at),
        "broker-direct": status("broker-direct", direct, "x", last_run=at),
    }
    return Snapshot(node="edge-1", checks=checks, started_mono=0.0, taken_mono=at,
                    round_complete=True)


class World:
    """The context a remediator gets, with everything it emits and registers recorded."""

    def __init__(self, config: cfg.Config, clock: Clock) -> None:
        self.config, self.clock = config, clock
        self.registry = CollectorRegistry()
        self.events: list[Event] = []
        self.handlers: dict[str, Callable[[Mapping[str, Any]], Awaitable[Any]]] = {}
        self.snap = snapshot(clock.now)
        self.live: Callable[[float], Snapshot] | None = None
        """When set, every read builds the snapshot at the current time (fresh results)."""
        self.ctx = Context(config=config, registry=self.registry, clock=clock,
                           wall=clock.wall, snapshot=self.read, emit=self.events.append,
                           control=self.handlers.__setitem__)

    def read(self) -> Snapshot:
        return self.live(self.clock.now + 0.001) if self.live is not None else self.snap

    def recover_after_restart(self) -> None:
        """From now on the checks observe a healthy tunnel, fresh on every read."""
        self.live = lambda at: snapshot(at, wg=State.OK, wg_reason="ok", tunnel=State.OK)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def metric(self, action: str, result: str) -> float:
        value = self.registry.get_sample_value(
            "edgeheal_remediations_total",
            {"ladder": "flannel", "action": action, "result": result})
        return value or 0.0


class ScriptedRemedy:
    """A Remedy whose restart does what the test says (and records being called)."""

    def __init__(self, mode: str = "pod", *, usable: bool = True, why: str = "test remedy",
                 on_restart: Callable[[], None] | None = None,
                 error: RemedyError | None = None) -> None:
        self.mode, self.usable, self.why = mode, usable, why
        self.on_restart, self.error = on_restart, error
        self.calls = 0

    async def probe(self) -> Availability:
        return Availability(self.usable, self.why)

    async def restart(self) -> RemedyOutcome:
        self.calls += 1
        await asyncio.sleep(0)
        if self.error is not None:
            raise self.error
        if self.on_restart is not None:
            self.on_restart()
        return RemedyOutcome(target=f"{self.mode} flannel-xyz")
