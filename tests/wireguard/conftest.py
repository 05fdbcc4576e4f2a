"""Fixtures for the WireGuard tests: a check context from TOML, a fake clock, a real mesh."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from edgeheal import checks, config
from edgeheal.lab.wireguard import WgMesh


@dataclass
class Clock:
    """An injected clock: ``mono`` drives ages and windows, ``wall`` what devices report."""

    mono: float = 1000.0
    wall: float = 1_796_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds

    def step_wall(self, seconds: float) -> None:
        """An NTP step: the wall clock jumps, the monotonic clock does not."""
        self.wall += seconds


def context(toml: str, clock: Callable[[], float] | None = None,
            registry: CollectorRegistry | None = None) -> checks.Context:
    return checks.Context(
        config=config.loads(toml), registry=registry or CollectorRegistry(),
        clock=clock or __import__("time").monotonic,
        snapshot=lambda: None,  # type: ignore[arg-type,return-value]
        emit=lambda event: None)


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[WgMesh]:
    m = WgMesh(2, keepalive=5, log_dir=tmp_path)
    try:
        yield m
    finally:
        m.close()


@pytest.fixture
def mesh3(tmp_path: Path) -> Iterator[WgMesh]:
    m = WgMesh(3, keepalive=5, log_dir=tmp_path)
    try:
        yield m
    finally:
        m.close()
