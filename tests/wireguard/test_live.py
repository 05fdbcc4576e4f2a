"""The five fault scenarios of issue 4 on real wireguard-go tunnels between namespaces.

Node 0 is the edge node running the check; the MQTT broker (the tunnel-path target) is in
node 1's pod subnet, so node 1 is the watched peer; node 2, when present, is another edge
box of Flannel's full mesh. Keepalive is 5 s to keep the fast tests fast (10 s for the
incident: see its docstring); the protocol's 120 s / 180 s timers are constants, so the
incident scenario takes about three minutes.
Assertions are causal bounds, never exact timings.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from edgeheal.lab.netns import run
from edgeheal.lab.wireguard import WgMesh
from edgeheal.model import State
from tests.wireguard.conftest import wireguard_go_processes
from tests.wireguard.live import FAIL_AFTER, GRACE, INTERVAL, RECOVER_AFTER, Driver

pytestmark = pytest.mark.netns
log = logging.getLogger(__name__)

KEEPALIVE = 5
RX_STALL = 2.5 * KEEPALIVE + 5
DEAD_AFTER = 180 + KEEPALIVE
SLACK = 5.0
DEBOUNCE = (FAIL_AFTER + 1) * INTERVAL
INCIDENT_KEEPALIVE = 10
"""K of the incident test's mesh: above REKEY_TIMEOUT + its jitter (see the test)."""


def fp(mesh: WgMesh, i: int) -> str:
    return mesh.nodes[i].public_key[:8]


async def healthy(mesh: WgMesh, driver: Driver) -> None:
    a, b = mesh.nodes[0], mesh.nodes[1]
    mesh.wait_handshake(a, b)
    await driver.until(lambda s: s.status.state is State.OK, 10, "ok at start")


async def test_a_healthy_tunnel_is_ok_and_detail_lists_every_peer(
        mesh3: WgMesh, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    driver = Driver.for_mesh(mesh3)
    await healthy(mesh3, driver)
    sample = await driver.step()
    assert sample.result.reason == "ok"
    rows = {p["peer"]: p for p in sample.result.detail["peers"]}
    assert set(rows) == {fp(mesh3, 1), fp(mesh3, 2)}
    assert rows[fp(mesh3, 1)]["watched"] is True
    assert rows[fp(mesh3, 2)]["watched"] is False
    assert rows[fp(mesh3, 1)]["endpoint"] == mesh3.endpoint(mesh3.nodes[0], mesh3.nodes[1])
    assert rows[fp(mesh3, 1)]["handshake_age_seconds"] < 30
    assert sample.result.detail["interfaces"][mesh3.nodes[0].ifname]["reader"] == "uapi"
    assert sample.result.detail["missing"] == [mesh3.nodes[0].ifname + "x"]
    for node in mesh3.nodes:
        assert node.private_key not in repr(sample.result) + caplog.text


async def test_blackhole_is_stalled_within_the_window_then_recovers(mesh: WgMesh) -> None:
    """Scenario 2 (+5): all tunnel UDP dropped -> stalled; lifted -> ok after the debounce."""
    driver = Driver.for_mesh(mesh)
    await healthy(mesh, driver)
    a, b = mesh.nodes
    mesh.blackhole(a, b)
    start = time.monotonic()
    hit = await driver.until(lambda s: s.status.reason == "stalled",
                             RX_STALL + DEBOUNCE + SLACK, "stalled")
    assert hit.status.state is State.FAILED
    assert mesh.fault_counter(a) > 0
    assert "dead" not in driver.reasons(start)  # the handshake is young: it is a stall
    log.info("blackhole -> stalled after %.1fs (window %.1fs)", hit.t - start, RX_STALL)

    mesh.clear_faults(a, b)
    lifted = time.monotonic()
    back = await driver.until(lambda s: s.status.state is State.OK,
                              KEEPALIVE + (RECOVER_AFTER + 1) * INTERVAL + SLACK, "ok again")
    log.info("blackhole lifted -> ok after %.1fs", back.t - lifted)


async def test_a_removed_watched_peer_is_no_peers_and_readding_recovers(mesh: WgMesh) -> None:
    """Scenario 4a (+5)."""
    driver = Driver.for_mesh(mesh)
    await healthy(mesh, driver)
    a, b = mesh.nodes
    mesh.remove_peer(a, b)
    hit = await driver.until(lambda s: s.status.reason == "no_peers", DEBOUNCE + SLACK,
                             "no_peers")
    assert hit.status.state is State.FAILED
    assert hit.result.detail["peers"] == []
    mesh.add_peer(a, b)
    await driver.until(lambda s: s.status.state is State.OK,
                       KEEPALIVE + (RECOVER_AFTER + 1) * INTERVAL + SLACK, "ok again")


async def test_an_unwatched_peer_that_never_connects_is_shown_but_harmless(
        mesh3: WgMesh) -> None:
    """Scenario 4b, fast form: a powered-off mesh member that never handshook."""
    driver = Driver.for_mesh(mesh3)
    await healthy(mesh3, driver)
    a, _, c = mesh3.nodes
    mesh3.stop_node(c)
    mesh3.remove_peer(a, c)
    mesh3.add_peer(a, c)  # a fresh peer entry: no handshake, ever
    hit = await driver.until(
        lambda s: s.peer(fp(mesh3, 2))["reason"] == "never_connected", GRACE + 5 * INTERVAL,
        "the dead mesh member shown as never_connected")
    assert hit.peer(fp(mesh3, 2))["watched"] is False
    assert set(driver.effective()) == {"ok"}
    assert set(driver.reasons()) == {"ok"}


async def test_recreating_the_device_returns_to_ok(mesh: WgMesh) -> None:
    """The harness's stand-in for Flannel rebuilding flannel-wg, observed by the check."""
    driver = Driver.for_mesh(mesh)
    await healthy(mesh, driver)
    a, b = mesh.nodes
    mesh.recreate_device(a)
    first = await driver.step()
    assert first.result.reason in {"ok", "connecting"}  # never a read error or missing
    await driver.until(lambda s: s.status.state is State.OK and s.result.reason == "ok",
                       GRACE, "ok after the rebuild")
    assert mesh.last_handshake(a, b) > 0


@pytest.mark.slow
async def test_an_unwatched_dead_peer_keeps_the_check_ok(mesh3: WgMesh) -> None:
    """Scenario 4b: a powered-off edge box in the mesh is `dead` in detail, the check ok."""
    driver = Driver.for_mesh(mesh3)
    await healthy(mesh3, driver)
    mesh3.stop_node(mesh3.nodes[2])
    dead = await driver.until(lambda s: s.peer(fp(mesh3, 2))["reason"] == "dead",
                              DEAD_AFTER + DEBOUNCE + SLACK, "the mesh member dead")
    assert dead.peer(fp(mesh3, 2))["watched"] is False
    # The result is the worst *watched* peer's: a sample that is not ok names the watched
    # peer's own trouble, never the dead member's (a busy box once stalled the watched
    # peer itself for 18 s in these three minutes: that is not what this test is about).
    for sample in driver.samples:
        if sample.result.reason != "ok":
            watched = {p["reason"] for p in sample.result.detail["peers"] if p["watched"]}
            assert sample.result.reason in watched, (sample.result.reason, watched)
    assert "dead" not in driver.reasons()
    await driver.until(lambda s: s.status.reason == "ok", 60.0, "the check ok")


@pytest.mark.slow
async def test_the_incident_rekey_failing_before_180s_then_dead(tmp_path: Path) -> None:
    """Scenario 1 (+5): bad UDP checksums on handshake packets, TX offload off.

    Keepalive 10 s here, not 5: at K = REKEY_TIMEOUT (5 s) wireguard-go's un-jittered
    persistent keepalive, not its jittered 5-5.33 s retransmit, sends every handshake
    attempt once the session has expired, so both ends keep initiating in the same
    instant. When the fault is lifted their initiations cross, each answers the other's
    and drops the answer to its own ("Received invalid response message"), and the
    crossing re-arms both timers together: a livelock that outlasted 40 s on a loaded
    machine (docs/wireguard.md). With K > REKEY_TIMEOUT + jitter, as in the field
    (20-25 s), the retransmits' jitter separates the two ends within a round or two.
    """
    with WgMesh(2, keepalive=INCIDENT_KEEPALIVE, log_dir=tmp_path) as mesh:
        await _incident(mesh, INCIDENT_KEEPALIVE)


async def _incident(mesh: WgMesh, k: int) -> None:
    a, b = mesh.nodes
    driver = Driver.for_mesh(mesh)
    await healthy(mesh, driver)
    before = {n.index: mesh.in_csum_errors(n) for n in mesh.nodes}
    mesh.corrupt_handshakes(a, b)
    age0 = (await driver.step()).peer(fp(mesh, 1))["handshake_age_seconds"]
    handshake_at = time.monotonic() - age0

    warned = await driver.until(lambda s: s.status.reason == "rekey_failing", 180 + k,
                                "rekey_failing")
    age = warned.t - handshake_at
    assert warned.status.state is State.DEGRADED
    assert 120 <= age < 180, f"rekey_failing at handshake age {age:.0f}s"
    ping = run(["ping", "-c", "3", "-W", "1", b.overlay], ns=a.ns, check=False)
    assert ping.returncode == 0, "the session must still carry traffic when warned"
    # Before 180 s only the session's initiator rekeys, so one receiver counts the drops.
    assert sum(mesh.in_csum_errors(n) for n in mesh.nodes) > sum(before.values())

    dead_after = 180 + k
    died = await driver.until(lambda s: s.status.state is State.FAILED,
                              dead_after + DEBOUNCE + SLACK, "dead or stalled")
    age = died.t - handshake_at
    assert died.status.reason in ("dead", "stalled")
    assert 180 - SLACK <= age <= dead_after + DEBOUNCE + SLACK, f"failed at age {age:.0f}s"
    # Once the session expired both ends initiate (at their next send, within K);
    # both receivers drop the bad checksums.
    both = await driver.until(
        lambda s: all(mesh.in_csum_errors(n) > before[n.index] for n in mesh.nodes),
        2 * k + SLACK, "InCsumErrors on both ends")
    assert both.status.state is State.FAILED
    log.info("incident: rekey_failing at %.0fs, %s at %.0fs (handshake age)",
             warned.t - handshake_at, died.status.reason, age)

    mesh.clear_faults(a, b)
    assert mesh.fault_counter(a) == mesh.fault_counter(b) == 0  # the rules are gone
    lifted = time.monotonic()
    # Both ends keep trying (the persistent keepalive re-arms the attempts; wireguard-go
    # does not give up while it runs): the next attempt within K, a crossing resolved by
    # the retransmits' jitter within three 5 s rounds, then the debounce. Generous for a
    # loaded machine: the bound is causal, the latency is the benchmark's.
    back = await driver.until(lambda s: s.status.state is State.OK,
                              k + 3 * (5.0 + 1 / 3) + (RECOVER_AFTER + 1) * INTERVAL
                              + 3 * SLACK, "ok again")
    assert mesh.last_handshake(a, b) > 0
    log.info("incident lifted -> ok after %.1fs", back.t - lifted)


@pytest.mark.slow
async def test_a_lossy_link_is_never_failed(mesh: WgMesh) -> None:
    """Scenario 3: 10 % random loss both ways for five minutes, with the collector's
    traffic (a ping a second) flowing: never failed; rekey_failing may appear rarely."""
    a, b = mesh.nodes
    driver = Driver.for_mesh(mesh)
    await healthy(mesh, driver)
    mesh.sandbox.spawn(["ping", "-i", "1", b.overlay], ns=a.ns)
    mesh.loss(10, a, b)
    start = time.monotonic()
    await driver.until(lambda s: s.t - start >= 300, 310, "five minutes")
    raw = driver.reasons(start)
    assert mesh.fault_counter(a) + mesh.fault_counter(b) > 0
    assert State.FAILED not in {s.status.state for s in driver.samples}
    log.info("lossy link: %d runs, rekey_failing in %d, raw reasons %s", len(raw),
             raw.count("rekey_failing"), sorted(set(raw)))
    print(f"lossy link: {len(raw)} runs, rekey_failing in {raw.count('rekey_failing')}")


def test_the_harness_leaves_nothing_behind_even_when_the_test_fails(tmp_path: Path) -> None:
    mesh = WgMesh(3, keepalive=5, log_dir=tmp_path)
    names = [n.ns for n in mesh.nodes]
    sockets = [n.socket for n in mesh.nodes]
    assert all(s.exists() for s in sockets)
    assert len(wireguard_go_processes()) == 3
    with pytest.raises(RuntimeError, match="boom"), mesh:
        raise RuntimeError("boom")
    listed = run(["ip", "netns", "list"]).stdout
    assert not [n for n in names if n in listed]
    assert not [s for s in sockets if s.exists()]
    assert wireguard_go_processes() == []
    mesh.close()  # closing twice is harmless
