"""The ``wireguard`` check over recorded reader outputs: interfaces, watched peers, detail,
metrics. The reader is injected, so these tests need no tunnel and no real time."""

from __future__ import annotations

import asyncio
import itertools
import shutil
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edgeheal import checks
from edgeheal.boundaries import wg
from edgeheal.boundaries.kernel.conntrack import Translation
from edgeheal.boundaries.wg.egress import Diagnosis
from edgeheal.checks import wireguard as wgcheck
from edgeheal.model import CheckStatus, State
from tests.support import Clock, context

CLOUD = "Q0xPVURDTE9VRENMT1VEQ0xPVURDTE9VRENMT1VEQ0w="   # routes 10.42.0.0/24 (the broker)
EDGE2 = "RURHRTJFREdFMkVER0UyRURHRTJFREdFMkVER0UyRUQ="   # another edge box in the mesh
EDGE3 = "RURHRTNFREdFM0VER0UzRURHRTNFREdFM0VER0UzRUQ="

TOML = """
[wireguard]
interfaces = ["flannel-wg", "flannel-wg-v6"]
[[mqtt.targets]]
name = "cloud"
host = "10.42.0.17"
path = "tunnel"
[[mqtt.targets]]
name = "direct"
host = "192.0.2.1"
path = "direct"
"""


def peer(key: str, *, hs_age: float | None, clock: Clock, allowed: tuple[str, ...],
         endpoint: str = "198.51.100.1:51820", rx: int = 1000, tx: int = 1000,
         keepalive: int = 25) -> wg.PeerStats:
    hs = None if hs_age is None else clock.wall().timestamp() - hs_age
    return wg.PeerStats(public_key=key, endpoint=endpoint, allowed_ips=allowed,
                        last_handshake=hs,
                        rx_bytes=rx, tx_bytes=tx, persistent_keepalive=keepalive)


class FakeReader:
    """Recorded device readings by interface; an exception stands for a reader error."""

    def __init__(self) -> None:
        self.devices: dict[str, wg.DeviceStats | Exception] = {}

    async def __call__(self, ifname: str) -> wg.DeviceStats:
        got = self.devices.get(ifname, wg.NoSuchDevice(ifname, "no such interface"))
        if isinstance(got, Exception):
            raise got
        return got


async def untranslated(address: str, port: int | None) -> list[Translation]:
    """conntrack after the probe connected: the target's own address, not translated."""
    return [Translation(address, port, "time_wait")]


def make(toml: str = TOML) -> tuple[wgcheck.WireguardCheck, FakeReader, Clock,
                                    CollectorRegistry]:
    clock, reader, registry = Clock(), FakeReader(), CollectorRegistry()
    check = wgcheck.WireguardCheck(context(toml, clock=clock, registry=registry).ctx,
                                   reader=reader, conntrack=untranslated)
    registry.register(check)
    return check, reader, clock, registry


def mesh_device(clock: Clock, *, edge2_age: float | None = 900.0,
                cloud_age: float | None = 30.0) -> wg.DeviceStats:
    return wg.DeviceStats("flannel-wg", 51820, (
        peer(CLOUD, hs_age=cloud_age, clock=clock, allowed=("10.42.0.0/24",)),
        peer(EDGE2, hs_age=edge2_age, clock=clock, allowed=("10.42.2.0/24",),
             endpoint="203.0.113.2:51820"),
    ), reader="uapi")


async def test_no_configured_interface_present_is_interface_missing() -> None:
    check, _, _, _ = make()
    result = await check.run()
    assert (result.state, result.reason) == (State.FAILED, "interface_missing")
    assert "flannel-wg, flannel-wg-v6" in result.message
    assert result.detail["missing"] == ["flannel-wg", "flannel-wg-v6"]


async def test_an_absent_second_interface_is_skipped() -> None:
    check, reader, clock, _ = make()
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=10)
    result = await check.run()
    assert (result.state, result.reason) == (State.OK, "ok")
    assert result.detail["missing"] == ["flannel-wg-v6"]


async def test_no_privilege_is_unknown_not_failed() -> None:
    check, reader, _, _ = make()
    for name in ("flannel-wg", "flannel-wg-v6"):
        reader.devices[name] = wg.PermissionDenied(name, "netlink: operation not permitted")
    result = await check.run()
    assert (result.state, result.reason) == (State.UNKNOWN, "permission_denied")
    assert "not permitted" in result.message


async def test_an_unparseable_device_is_read_error_and_still_judges_the_other() -> None:
    check, reader, clock, _ = make()
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=10)
    reader.devices["flannel-wg-v6"] = wg.ProtocolError("flannel-wg-v6", "errno=5")
    result = await check.run()
    assert (result.state, result.reason) == (State.UNKNOWN, "read_error")
    assert result.detail["errors"] == {"flannel-wg-v6": "flannel-wg-v6: errno=5"}
    assert len(result.detail["peers"]) == 2


async def test_a_dead_unwatched_mesh_peer_never_drives_the_state() -> None:
    check, reader, clock, _ = make()
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=900)
    result = await check.run()
    assert (result.state, result.reason) == (State.OK, "ok")
    rows = {r["peer"]: r for r in result.detail["peers"]}
    assert rows[CLOUD[:8]]["watched"] is True
    assert rows[CLOUD[:8]]["reason"] == "ok"
    assert rows[EDGE2[:8]] | {"handshake_age_seconds": None} == rows[EDGE2[:8]] | {
        "watched": False, "reason": "dead", "state": "failed",
        "handshake_age_seconds": None, "endpoint": "203.0.113.2:51820"}
    assert rows[EDGE2[:8]]["handshake_age_seconds"] == pytest.approx(900, abs=1)


async def test_the_watched_peer_going_bad_drives_the_state() -> None:
    check, reader, clock, _ = make()
    reader.devices["flannel-wg"] = mesh_device(clock, cloud_age=170, edge2_age=10)
    result = await check.run()
    assert (result.state, result.reason) == (State.DEGRADED, "rekey_failing")
    assert CLOUD[:8] in result.message
    assert "198.51.100.1:51820" in result.message


async def test_without_tunnel_targets_every_peer_is_watched() -> None:
    check, reader, clock, _ = make('[wireguard]\ninterfaces = ["flannel-wg"]\n')
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=900)
    result = await check.run()
    assert (result.state, result.reason) == (State.FAILED, "dead")
    assert all(r["watched"] for r in result.detail["peers"])


async def test_a_removed_watched_peer_is_no_peers() -> None:
    check, reader, clock, _ = make()
    full = mesh_device(clock, edge2_age=10)
    reader.devices["flannel-wg"] = replace(full, peers=full.peers[1:])
    result = await check.run()
    assert (result.state, result.reason) == (State.FAILED, "no_peers")
    assert "routes the tunnel-path MQTT target(s) 10.42.0.17" in result.message
    assert [r["peer"] for r in result.detail["peers"]] == [EDGE2[:8]]


async def test_the_most_specific_allowed_ip_decides_which_peer_carries_the_target() -> None:
    check, reader, clock, _ = make()
    reader.devices["flannel-wg"] = wg.DeviceStats("flannel-wg", 51820, (
        peer(EDGE3, hs_age=900, clock=clock, allowed=("0.0.0.0/0",)),
        peer(CLOUD, hs_age=10, clock=clock, allowed=("10.42.0.0/24",)),
    ))
    result = await check.run()
    assert result.reason == "ok"
    assert [r["watched"] for r in result.detail["peers"]] == [False, True]


@pytest.mark.parametrize(("watch", "watched"), [
    (f'["{EDGE2}"]', [False, True]),
    ('["203.0.113.0/24"]', [False, True]),
    ('["198.51.100.1/32", "203.0.113.0/24"]', [True, True]),
])
async def test_watch_peers_by_key_or_endpoint_cidr(watch: str, watched: list[bool]) -> None:
    check, reader, clock, _ = make(f'[wireguard]\ninterfaces = ["flannel-wg"]\n'
                                   f'watch_peers = {watch}\n')
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=10)
    result = await check.run()
    assert [r["watched"] for r in result.detail["peers"]] == watched


async def test_a_wall_clock_step_neither_fakes_nor_hides_a_dead_tunnel() -> None:
    check, reader, clock, _ = make()
    hs_wall = clock.wall().timestamp() - 10
    device = mesh_device(clock, edge2_age=10)

    def at(hs: float) -> wg.DeviceStats:
        return replace(device, peers=tuple(replace(
            p, last_handshake=hs, rx_bytes=p.rx_bytes + int(clock.now),
            tx_bytes=p.tx_bytes + int(clock.now)) for p in device.peers))

    reader.devices["flannel-wg"] = at(hs_wall)
    assert (await check.run()).reason == "ok"
    clock.advance(5)
    clock.step_wall(+3600)  # NTP corrects a clock an hour slow: nothing changed really
    result = await check.run()
    assert result.reason == "ok"
    assert result.detail["peers"][0]["handshake_age_seconds"] == pytest.approx(15, abs=0.1)
    clock.step_wall(-7200)  # and back: a dead tunnel must still age into "dead"
    for _ in range(40):
        clock.advance(5)
        reader.devices["flannel-wg"] = at(hs_wall)  # keepalives still go out
        result = await check.run()
    assert result.reason == "dead"
    assert result.detail["peers"][0]["handshake_age_seconds"] == pytest.approx(215, abs=0.1)


async def test_metrics_list_the_watched_peers_by_fingerprint() -> None:
    check, reader, clock, registry = make()
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=900)
    await check.run()
    text = generate_latest(registry).decode()
    assert (f'edgeheal_wireguard_handshake_age_seconds{{interface="flannel-wg",'
            f'peer="{CLOUD[:8]}",watched="true"}} 30.0') in text
    assert 'edgeheal_wireguard_transmit_bytes_total{interface="flannel-wg"' in text
    assert (f'edgeheal_wireguard_peer_state{{interface="flannel-wg",peer="{CLOUD[:8]}",'
            f'state="ok",watched="true"}} 1.0') in text
    assert EDGE2[:8] not in text  # the rest of the mesh: in /status only
    assert CLOUD not in text  # fingerprints only


async def test_all_peers_exports_the_whole_mesh_marked_unwatched() -> None:
    check, reader, clock, registry = make(TOML + "[metrics]\nall_peers = true\n")
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=900)
    await check.run()
    text = generate_latest(registry).decode()
    assert (f'edgeheal_wireguard_receive_bytes_total{{interface="flannel-wg",'
            f'peer="{EDGE2[:8]}",watched="false"}} 1000.0') in text
    assert (f'edgeheal_wireguard_peer_state{{interface="flannel-wg",peer="{EDGE2[:8]}",'
            f'state="failed",watched="false"}} 1.0') in text
    assert (f'edgeheal_wireguard_peer_state{{interface="flannel-wg",peer="{EDGE2[:8]}",'
            f'state="ok",watched="false"}} 0.0') in text
    assert f'peer="{CLOUD[:8]}",watched="true"' in text
    assert CLOUD not in text
    assert EDGE2 not in text


async def test_the_metrics_pass_promtool_lint() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    check, reader, clock, registry = make()
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=900)
    await check.run()
    proc = await asyncio.create_subprocess_exec(
        promtool, "check", "metrics", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate(generate_latest(registry))
    assert proc.returncode == 0, out.decode()


async def test_a_peer_that_disappears_leaves_the_metrics() -> None:
    check, reader, clock, registry = make(TOML + "[metrics]\nall_peers = true\n")
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=10)
    await check.run()
    assert EDGE2[:8] in generate_latest(registry).decode()
    full = reader.devices["flannel-wg"]
    assert isinstance(full, wg.DeviceStats)
    reader.devices["flannel-wg"] = replace(full, peers=full.peers[:1])
    await check.run()
    assert EDGE2[:8] not in generate_latest(registry).decode()


async def test_an_unresolvable_tunnel_target_watches_every_peer_rather_than_none(
        caplog: pytest.LogCaptureFixture) -> None:
    async def no_dns(host: str) -> list[str]:
        raise OSError(f"[Errno -2] Name or service not known: {host}")

    clock, reader = Clock(), FakeReader()
    check = wgcheck.WireguardCheck(
        context(TOML.replace('"10.42.0.17"', '"broker.invalid"'), clock=clock).ctx,
        reader=reader, resolve=no_dns)
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=10)
    result = await check.run()
    assert result.reason == "ok"
    assert all(r["watched"] for r in result.detail["peers"])
    assert "cannot resolve tunnel target broker.invalid" in caplog.text


async def test_a_tunnel_target_host_name_is_resolved_and_routed() -> None:
    async def dns(host: str) -> list[str]:
        assert host == "broker.example"
        return ["10.42.0.17", "fd00:42::17%eth0"]

    clock, reader = Clock(), FakeReader()
    check = wgcheck.WireguardCheck(
        context(TOML.replace('"10.42.0.17"', '"broker.example"'), clock=clock).ctx,
        reader=reader, resolve=dns)
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=900)
    result = await check.run()
    assert result.reason == "ok"
    assert [r["watched"] for r in result.detail["peers"]] == [True, False]


def test_the_factory_registers_one_check_and_none_without_interfaces() -> None:
    reg = next(r for r in checks.registrations() if r.module == "wireguard")
    assert "rekey_failing" in reg.doc
    made = reg.factory(context('[wireguard]\ninterfaces = ["wg0"]\n').ctx)
    assert [c.name for c in made] == ["wireguard"]
    assert reg.factory(context("[wireguard]\ninterfaces = []\n").ctx) == []


def test_the_check_and_the_uapi_reader_do_not_load_pyroute2() -> None:
    import subprocess
    import sys

    code = ("import sys, edgeheal.checks.wireguard, edgeheal.boundaries.wg.uapi, "
            "edgeheal.boundaries.wg; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pyroute2', 'paho', 'lightkube', 'dbus_fast', 'scapy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


# --- send failures and suspicion ----------------------------------------------------------

class FakeEgress:
    """Stands for rtnetlink: what was asked, and a canned diagnosis."""

    def __init__(self, cause: str = "no_route") -> None:
        self.cause = cause
        self.learned: list[str] = []
        self.diagnosed: list[tuple[str, str | None]] = []

    async def learn(self, address: object) -> str | None:
        self.learned.append(str(address))
        return "192.0.2.10"

    async def diagnose(self, endpoint: object, *, source: str | None) -> Diagnosis:
        self.diagnosed.append((str(endpoint), source))
        return Diagnosis(self.cause, f"canned {self.cause}", {"endpoint": str(endpoint)})


def with_egress(toml: str = TOML, cause: str = "no_route") -> tuple[
        wgcheck.WireguardCheck, FakeReader, Clock, FakeEgress, list[str]]:
    clock, reader, egress = Clock(), FakeReader(), FakeEgress(cause)
    hastened: list[str] = []
    ctx = replace(context(toml, clock=clock).ctx, hasten=hastened.append)
    check = wgcheck.WireguardCheck(ctx, reader=reader, egress=egress,  # type: ignore[arg-type]
                                   conntrack=untranslated)
    return check, reader, clock, egress, hastened


def counters(clock: Clock, *, rx: int, tx: int, cloud_age: float = 30.0) -> wg.DeviceStats:
    return wg.DeviceStats("flannel-wg", 51820, (
        peer(CLOUD, hs_age=cloud_age, clock=clock, allowed=("10.42.0.0/24",), rx=rx, tx=tx),
        peer(EDGE2, hs_age=10, clock=clock, allowed=("10.42.2.0/24",),
             endpoint="203.0.113.2:51820", rx=rx, tx=tx),
    ), reader="uapi")


async def test_a_healthy_tunnel_learns_each_endpoint_once_and_asks_nothing_more() -> None:
    check, reader, clock, egress, hastened = with_egress()
    for i in range(30):  # 150 s, keepalives both ways every 25 s
        reader.devices["flannel-wg"] = counters(clock, rx=1000 + 32 * (i // 5),
                                                tx=1000 + 32 * (i // 5))
        result = await check.run()
        assert result.reason == "ok"
        assert result.detail["suspect"] is False
        clock.advance(5)
    assert sorted(egress.learned) == ["198.51.100.1", "203.0.113.2"]
    assert egress.diagnosed == []
    assert hastened == []


async def test_a_send_failure_names_its_cause_in_the_result_and_the_peer_row() -> None:
    check, reader, clock, egress, _ = with_egress(cause="no_address")
    reader.devices["flannel-wg"] = counters(clock, rx=1000, tx=1000)
    await check.run()
    clock.advance(31)  # K + 5 s and a bit, nothing sent or received
    result = await check.run()
    assert (result.state, result.reason) == (State.FAILED, "send_failing")
    assert result.detail["cause"] == "no_address"
    assert "no_address" in result.message
    row = next(p for p in result.detail["peers"] if p["peer"] == CLOUD[:8])
    assert row["send_failure"]["cause"] == "no_address"
    # the diagnosis used the source address learned while the peer was healthy
    assert ("198.51.100.1", "192.0.2.10") in egress.diagnosed
    assert wgcheck._alert(CheckStatus(
        name="wireguard", state=State.FAILED, reason="send_failing", message="",
        since=clock.wall(), since_mono=clock.now, detail={}, required=True, runs=2),
    ) == ("wireguard.send_failing", "wireguard.recovered")


async def test_a_source_address_not_learned_at_first_is_learned_later() -> None:
    """The first route lookup found nothing (seen in the QEMU bed under load; in the field,
    an agent that starts before the modem's data session): asked again after LEARN_RETRY,
    not every run, so a later address loss still reads as ``no_address``."""
    check, reader, clock, egress, _ = with_egress(cause="no_address")
    answers = iter([None, None])
    real = egress.learn

    async def learn(address: object) -> str | None:
        found = next(answers, "unused")
        return await real(address) if found == "unused" else None

    egress.learn = learn  # type: ignore[method-assign]
    for i in range(8):  # 35 s healthy, a run every 5 s
        reader.devices["flannel-wg"] = counters(clock, rx=1000 + 32 * i, tx=1000 + 32 * i)
        assert (await check.run()).reason == "ok"
        clock.advance(5)
    # two lookups failed (one per endpoint), then one each succeeded: not one per run
    assert sorted(egress.learned) == ["198.51.100.1", "203.0.113.2"]
    clock.advance(31)  # then nothing moves either way: a send failure
    result = await check.run()
    assert result.reason == "send_failing"
    assert ("198.51.100.1", "192.0.2.10") in egress.diagnosed


async def test_a_suspect_peer_hastens_the_tunnel_targets_once_then_every_few_seconds() -> None:
    toml = TOML + '[[mqtt.targets]]\nname = "cloud2"\nhost = "10.42.0.18"\npath = "tunnel"\n'
    check, reader, clock, _, hastened = with_egress(toml)
    reader.devices["flannel-wg"] = counters(clock, rx=1000, tx=1000)
    await check.run()
    tx = 1000
    seen = []
    for _ in range(66):  # rx silent (a blackhole) while our keepalives leave every 25 s
        clock.advance(1)
        tx += 32 if int(clock.now) % 25 == 0 else 0
        reader.devices["flannel-wg"] = counters(clock, rx=1000, tx=tx)
        result = await check.run()
        seen.append((clock.now - 1000, len(hastened), result.detail["suspect"]))
    first = next(t for t, n, _ in seen if n)
    assert first == pytest.approx(40.0)  # K + 15 s of silence on an idle tunnel
    assert next(s for t, _, s in seen if t == first) is True
    assert result.detail["suspicion"]
    assert "nothing received" in result.detail["suspicion"][0]
    # both tunnel-path targets (never the direct one), every 5 s, at most HASTEN_MAX times
    assert set(hastened) == {"cloud", "cloud2"}
    assert len(hastened) == 2 * wgcheck.HASTEN_MAX
    times = [t for (_, m, _), (t, n, _) in itertools.pairwise(seen) if n != m]
    assert times[0] == first
    assert len(times) == wgcheck.HASTEN_MAX
    assert all(b - a >= wgcheck.HASTEN_EVERY for a, b in itertools.pairwise(times))


async def test_a_new_suspicion_episode_hastens_again_and_an_unwatched_peer_never_does() -> None:
    check, reader, clock, _, hastened = with_egress()
    reader.devices["flannel-wg"] = counters(clock, rx=1000, tx=1000)
    await check.run()
    clock.advance(29)
    await check.run()
    assert hastened == []  # K + 4 s: not yet
    clock.advance(1)
    await check.run()
    assert hastened == ["cloud"]
    reader.devices["flannel-wg"] = counters(clock, rx=1032, tx=1032)  # traffic is back
    clock.advance(1)
    assert (await check.run()).detail["suspect"] is False
    # nothing either way for K + 5 s was also a send_failing verdict: its end is confirmed
    assert hastened == ["cloud", "cloud"]
    clock.advance(29.5)
    await check.run()
    assert hastened == ["cloud", "cloud"]
    clock.advance(0.5)
    await check.run()
    assert hastened == ["cloud", "cloud", "cloud"]
    # EDGE2 alone going silent (not watched) is no reason to probe
    check, reader, clock, _, hastened = with_egress()
    device = counters(clock, rx=1000, tx=1000)
    reader.devices["flannel-wg"] = device
    await check.run()
    for _ in range(8):
        clock.advance(5)
        peers = (replace(device.peers[0], rx_bytes=device.peers[0].rx_bytes + int(clock.now),
                         tx_bytes=device.peers[0].tx_bytes + int(clock.now)),
                 device.peers[1])
        reader.devices["flannel-wg"] = replace(device, peers=peers)
        await check.run()
    assert hastened == []


@pytest.mark.parametrize("verdict", ["no_peers", "interface_missing", "send_failing"])
async def test_a_failed_verdict_hastens_the_tunnel_targets_like_a_suspicion(
        verdict: str) -> None:
    check, reader, clock, _, hastened = with_egress()
    healthy = counters(clock, rx=1000, tx=1000)
    reader.devices["flannel-wg"] = healthy
    await check.run()
    assert hastened == []
    if verdict == "no_peers":  # stuck Flannel: the cloud peer is gone
        reader.devices["flannel-wg"] = replace(healthy, peers=healthy.peers[1:])
    elif verdict == "interface_missing":
        del reader.devices["flannel-wg"]
    clock.advance(2 if verdict != "send_failing" else 31)
    result = await check.run()
    assert (result.state, result.reason) == (State.FAILED, verdict)
    assert hastened == ["cloud"]  # at once, never the direct-path target
    for _ in range(40):  # then every HASTEN_EVERY s, at most HASTEN_MAX per episode
        clock.advance(2)
        await check.run()
    assert hastened == ["cloud"] * wgcheck.HASTEN_MAX


async def test_a_verdict_after_a_spent_suspicion_episode_hastens_again() -> None:
    check, reader, clock, _, hastened = with_egress()
    reader.devices["flannel-wg"] = counters(clock, rx=1000, tx=1000)
    await check.run()
    tx = 1000
    for _ in range(40):  # 80 s of a blackhole: rx silent, our keepalives leave every 25 s
        clock.advance(2)
        tx += 32 if int(clock.now) % 25 < 2 else 0
        reader.devices["flannel-wg"] = counters(clock, rx=1000, tx=tx)
        result = await check.run()
    assert result.reason == "stalled"
    # HASTEN_MAX for the suspicion, and a fresh episode for the verdict
    assert len(hastened) > wgcheck.HASTEN_MAX
    assert len(hastened) <= 2 * wgcheck.HASTEN_MAX


@pytest.mark.parametrize(("cause", "suspect"), [("no_address", True), ("link_down", True),
                                                ("local", False)])
async def test_a_busy_tunnel_falling_silent_asks_the_kernel_once_about_the_uplink(
        cause: str, suspect: bool) -> None:
    check, reader, clock, egress, hastened = with_egress(cause=cause)
    rx = tx = 1000
    for _ in range(5):  # a collector's traffic both ways
        rx, tx = rx + 200, tx + 300
        reader.devices["flannel-wg"] = counters(clock, rx=rx, tx=tx)
        assert (await check.run()).detail["suspect"] is False
        clock.advance(2)
    seen = []
    for _ in range(5):  # then nothing either way: the uplink's address went
        result = await check.run()
        seen.append(result.detail["suspect"])
        clock.advance(2)
    assert seen == [False, suspect, suspect, suspect, suspect]  # from 4 s of silence
    assert len(egress.diagnosed) == 1  # one question per silence
    # at once (4 s), then every HASTEN_EVERY while it lasts (10 s)
    assert hastened == (["cloud", "cloud"] if suspect else [])
    if suspect:
        assert f"uplink is gone: {cause}" in result.detail["suspicion"][0]


async def test_the_tunnel_back_from_a_failed_verdict_is_confirmed_once() -> None:
    check, reader, clock, _, hastened = with_egress()
    healthy = counters(clock, rx=1000, tx=1000)
    reader.devices["flannel-wg"] = replace(healthy, peers=healthy.peers[1:])  # stuck
    assert (await check.run()).reason == "no_peers"
    assert hastened == ["cloud"]
    clock.advance(2)
    reader.devices["flannel-wg"] = counters(clock, rx=1100, tx=1100)  # Flannel restarted
    assert (await check.run()).reason == "ok"
    assert hastened == ["cloud", "cloud"]  # the repair confirmed at once
    for i in range(5):  # and nothing more while it stays healthy
        clock.advance(2)
        reader.devices["flannel-wg"] = counters(clock, rx=1200 + i * 300, tx=1200 + i * 300)
        assert (await check.run()).reason == "ok"
    assert hastened == ["cloud", "cloud"]
