"""Fixtures for the WireGuard tests: a check context from TOML, a fake clock, a real mesh."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from edgeheal import config
from edgeheal.lab import netns
from edgeheal.lab.wireguard import WgMesh
from edgeheal.model import Context


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
            registry: CollectorRegistry | None = None) -> Context:
    return Context(
        config=config.loads(toml), registry=registry or CollectorRegistry(),
        clock=clock or __import__("time").monotonic,
        snapshot=lambda: None,  # type: ignore[arg-type,return-value]
        emit=lambda event: None)


@pytest.fixture(autouse=True)
def no_leaked_wireguard_sockets() -> Iterator[None]:
    """Every wireguard-go socket this process made is gone after the test."""
    mine = f"{netns.PREFIX}{os.getpid() % 10000:04d}"

    def sockets() -> set[str]:
        uapi = Path("/var/run/wireguard")
        return {p.name for p in uapi.glob(f"{mine}*.sock")} if uapi.is_dir() else set()

    before = sockets()
    yield
    leaked = sockets() - before
    for name in leaked:
        (Path("/var/run/wireguard") / name).unlink(missing_ok=True)
    assert not leaked, f"test leaked wireguard-go sockets: {sorted(leaked)}"


def wireguard_go_processes() -> list[str]:
    """Command lines of wireguard-go processes serving this process's interfaces."""
    mine = f"{netns.PREFIX}{os.getpid() % 10000:04d}"
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"wireguard-go") and any(
                    a.decode(errors="replace").startswith(mine) for a in argv[1:]):
                found.append(" ".join(a.decode(errors="replace") for a in argv))
    return found


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
