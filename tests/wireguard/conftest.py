"""Fixtures for the WireGuard tests: real meshes, and no leaked wireguard-go sockets.

The fake clock and the context builder are the shared ones in :mod:`tests.support`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeheal.lab import netns
from edgeheal.lab.wireguard import WgMesh


@pytest.fixture(autouse=True)
def no_leaked_wireguard_sockets() -> Iterator[None]:
    """Every wireguard-go socket this process made is gone after the test."""
    mine = netns.prefix_of(os.getpid())

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
    mine = netns.prefix_of(os.getpid())
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
