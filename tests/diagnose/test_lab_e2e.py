"""End to end in the lab world (no agent): `edgeheal diagnose --json` names each fault.

Each test builds its own :class:`~edgeheal.lab.world.World` (cloud, carrier with the
faulty-NIC emulator, one edge with a wireguard-go tunnel), injects one condition, runs the
command inside the edge's namespace with a config file in ``tmp_path``, and checks the
verdict and the evidence behind it. The emulator, not an nftables rule, is the test bed for
the incident: on veth a checksum rewritten by nftables is never verified while TX offload is
on (see :mod:`edgeheal.lab.faultynic`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from edgeheal.lab.world import Edge, World

pytestmark = [pytest.mark.slow, pytest.mark.netns]

SECONDS = 12
"""Longer than two lab keepalives (5 s) and two REKEY_TIMEOUTs (5 s)."""


async def build(tmp_path: Path, *, offload_on: bool) -> World:
    world = World(tmp_path / "world", edges=1, agent=False, offload_on_at_boot=offload_on)
    try:
        await world.build()
    except BaseException:
        await world.close()
        raise
    return world


@pytest.fixture
async def healthy_world(tmp_path: Path) -> AsyncIterator[World]:
    """Offload off at boot; yields once the edge has a handshake with the cloud."""
    world = await build(tmp_path, offload_on=False)
    try:
        edge = world.edges[0]
        deadline = time.monotonic() + 30
        while world.last_handshake(edge) == 0:
            assert time.monotonic() < deadline, "no handshake within 30 s"
            await asyncio.sleep(0.5)
        yield world
    finally:
        await world.close()


@pytest.fixture
async def incident_world(tmp_path: Path) -> AsyncIterator[World]:
    """Offload on at boot, as the incident's 4G NIC shipped: no handshake ever completes."""
    world = await build(tmp_path, offload_on=True)
    try:
        yield world
    finally:
        await world.close()


async def diagnose(edge: Edge, tmp_path: Path, *, offload_section: bool = True,
                   ) -> tuple[int, dict[str, Any], str]:
    """Without an [offload] section the uplink is found by the route to the peers."""
    config = tmp_path / "diagnose.toml"
    config.write_text(f'[wireguard]\ninterfaces = ["{edge.wg_ifname}", "ehabsent0"]\n'
                      + (f'[offload]\ninterfaces = ["{edge.uplink}"]\n'
                         if offload_section else ""))
    argv = ["ip", "netns", "exec", edge.ns, sys.executable, "-m", "edgeheal", "diagnose",
            "--config", str(config), "--seconds", str(SECONDS), "--json"]
    proc = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True,
                                   timeout=SECONDS + 40, check=False)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON (exit {proc.returncode}): {proc.stdout!r} {proc.stderr}")
    return proc.returncode, doc, proc.stderr


def cloud_peer(doc: dict[str, Any], world: World) -> dict[str, Any]:
    peers = [p for p in doc["peers"] if p["public_key"] == world.cloud_public]
    assert len(peers) == 1, doc["peers"]
    return peers[0]


async def test_the_incident_offload_on_names_bad_checksums_and_the_fix(
        incident_world: World, tmp_path: Path) -> None:
    world = incident_world
    edge = world.edges[0]
    before = world.cloud_in_csum_errors()
    code, doc, err = await diagnose(edge, tmp_path)
    assert code == 1, err
    assert doc["verdict"]["code"] == "checksum_offload", doc
    assert "rekey packets are probably leaving with bad checksums" in doc["verdict"]["summary"]
    assert "edgeheal offload apply" in doc["verdict"]["summary"]
    assert doc["uplink"] == edge.uplink
    assert doc["offload"]["on"] is True
    peer = cloud_peer(doc, world)
    assert peer["sent"].get("initiation", 0) + peer["sent"].get("response", 0) > 0
    assert "response" not in peer["received"]
    assert peer["handshake_completed_during_capture"] is False
    # the cause is real: the cloud's kernel dropped the edge's handshakes for bad checksums
    assert world.cloud_in_csum_errors() > before
    assert any(e["event"] == "corrupted" for e in world.nic_events(edge))


async def test_a_blackholed_uplink_is_named_as_a_path_down(
        healthy_world: World, tmp_path: Path) -> None:
    world = healthy_world
    edge = world.edges[0]
    world.uplink_down(edge, True)
    code, doc, err = await diagnose(edge, tmp_path)
    assert code == 1, err
    assert doc["verdict"]["code"] == "path_down", doc
    assert "uplink or the cloud path is down" in doc["verdict"]["summary"]
    peer = cloud_peer(doc, world)
    assert sum(peer["sent"].values()) > 0
    assert peer["received"] == {}
    assert doc["offload"]["on"] is False


async def test_a_healthy_tunnel_is_healthy_and_exits_0(
        healthy_world: World, tmp_path: Path) -> None:
    world = healthy_world
    edge = world.edges[0]
    code, doc, err = await diagnose(edge, tmp_path, offload_section=False)
    assert doc["verdict"]["code"] == "healthy", doc
    assert code == 0, err
    assert doc["uplink"] == edge.uplink
    assert doc["missing_interfaces"] == ["ehabsent0"]
    peer = cloud_peer(doc, world)
    assert peer["received"].get("keepalive", 0) + peer["received"].get("transport", 0) > 0
    assert peer["handshake_age_seconds"] is not None
    assert peer["handshake_age_seconds"] < 180
    assert doc["ports"] == [51820]
    assert doc["udp"]["delta"] == {"InCsumErrors": 0, "InErrors": 0}
