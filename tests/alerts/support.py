"""Helpers: a Context for the engine, snapshots built by hand, a clock to move."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
from prometheus_client import CollectorRegistry

from edgeheal import config
from edgeheal.model import CheckResult, CheckStatus, Context, Event, Snapshot, State

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def validate(instance: Any, schema: str) -> None:
    doc = json.loads((SCHEMAS / schema).read_text())
    jsonschema.Draft202012Validator(doc, format_checker=jsonschema.FormatChecker()).validate(
        instance)


@dataclass
class Clock:
    now: float = 1000.0
    wall0: datetime = field(default_factory=lambda: datetime(2026, 12, 2, 20, 0, tzinfo=UTC))

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self.wall0 + timedelta(seconds=self.now - 1000.0)


@dataclass
class Harness:
    ctx: Context
    clock: Clock
    handlers: dict[str, Callable[[Mapping[str, Any]], Awaitable[Any]]]
    events: list[Event]


def harness(tmp_path: Path, toml: str = "", *, clock: Clock | None = None,
            registry: CollectorRegistry | None = None,
            control: Callable[[str, Callable[[Mapping[str, Any]], Awaitable[Any]]], None]
            | None = None) -> Harness:
    clock = clock or Clock()
    cfg = config.loads(f'[agent]\nstate_dir = "{tmp_path}/state"\nnode_name = "edge-7"\n'
                       f"{toml}")
    handlers: dict[str, Callable[[Mapping[str, Any]], Awaitable[Any]]] = {}
    events: list[Event] = []
    empty = Snapshot(node="edge-7", checks={}, started_mono=0.0, taken_mono=0.0)
    ctx = Context(config=cfg, registry=registry or CollectorRegistry(), clock=clock,
                  wall=clock.wall,
                  snapshot=lambda: empty, emit=events.append,
                  control=control or handlers.__setitem__)
    return Harness(ctx, clock, handlers, events)


def status(name: str, state: State, reason: str = "", *, required: bool = True,
           runs: int = 3, message: str = "", since: datetime | None = None) -> CheckStatus:
    reason = reason or state.value
    return CheckStatus(name=name, state=state, reason=reason, message=message or reason,
                       since=since or datetime(2026, 12, 2, 20, 0, tzinfo=UTC),
                       since_mono=0.0, detail={"x": 1}, required=required, runs=runs,
                       observed=CheckResult(state, reason))


def snapshot(*statuses: CheckStatus, complete: bool = True) -> Snapshot:
    return Snapshot(node="edge-7", checks={s.name: s for s in statuses}, started_mono=0.0,
                    taken_mono=0.0, round_complete=complete)
