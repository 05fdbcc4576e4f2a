"""Helpers: a Context for the engine (with the agent's alert link), snapshots by hand."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
from prometheus_client import CollectorRegistry

from edgeheal import config
from edgeheal.base.compat import UTC
from edgeheal.boundaries.mqtt.link import Link, for_alerts
from edgeheal.model import CheckResult, CheckStatus, Context, Event, Snapshot, State
from tests.support import Clock, context

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def validate(instance: Any, schema: str) -> None:
    doc = json.loads((SCHEMAS / schema).read_text())
    jsonschema.Draft202012Validator(doc, format_checker=jsonschema.FormatChecker()).validate(
        instance)


@dataclass
class Harness:
    ctx: Context
    clock: Clock
    handlers: dict[str, Callable[[Mapping[str, Any]], Awaitable[Any]]]
    events: list[Event]
    link: Link | None
    """The connection to ``[alerts] target``, built as the agent builds it (also
    ``ctx.alert_link``); hand it to the engine: ``AlertEngine(h.ctx, link=h.link)``."""


def harness(tmp_path: Path, toml: str = "", *, clock: Clock | None = None,
            registry: CollectorRegistry | None = None,
            control: Callable[[str, Callable[[Mapping[str, Any]], Awaitable[Any]]], None]
            | None = None) -> Harness:
    cfg = config.loads_generic(f'[agent]\nstate_dir = "{tmp_path}/state"\nnode_name = "edge-7"\n'
                       f"{toml}")
    base = context(config=cfg, clock=clock, registry=registry)
    link = for_alerts(cfg, clock=base.clock)
    ctx = dataclasses.replace(base.ctx, alert_link=link,
                              control=control or base.handlers.__setitem__)
    return Harness(ctx, base.clock, base.handlers, base.events, link)


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
