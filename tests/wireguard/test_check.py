"""The ``wireguard`` check over recorded reader outputs: interfaces, watched peers, detail,
metrics. The reader is injected, so these tests need no tunnel and no real time."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edgeheal import checks, wg
from edgeheal.checks import wireguard as wgcheck
from edgeheal.model import State
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


def make(toml: str = TOML) -> tuple[wgcheck.WireguardCheck, FakeReader, Clock,
                                    CollectorRegistry]:
    clock, reader, registry = Clock(), FakeReader(), CollectorRegistry()
    check = wgcheck.WireguardCheck(context(toml, clock=clock, registry=registry).ctx,
                                   reader=reader)
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
        return replace(device, peers=tuple(replace(p, last_handshake=hs, rx_bytes=p.rx_bytes
                                                   + int(clock.now)) for p in device.peers))

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
        result = await check.run()
    assert result.reason == "dead"
    assert result.detail["peers"][0]["handshake_age_seconds"] == pytest.approx(215, abs=0.1)


async def test_metrics_list_every_peer_by_fingerprint() -> None:
    check, reader, clock, registry = make()
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=900)
    await check.run()
    text = generate_latest(registry).decode()
    assert (f'edgeheal_wireguard_handshake_age_seconds{{interface="flannel-wg",'
            f'peer="{CLOUD[:8]}"}} 30.0') in text
    assert (f'edgeheal_wireguard_receive_bytes_total{{interface="flannel-wg",'
            f'peer="{EDGE2[:8]}"}} 1000.0') in text
    assert 'edgeheal_wireguard_transmit_bytes_total{interface="flannel-wg"' in text
    assert (f'edgeheal_wireguard_peer_state{{interface="flannel-wg",peer="{EDGE2[:8]}",'
            f'state="failed"}} 1.0') in text
    assert (f'edgeheal_wireguard_peer_state{{interface="flannel-wg",peer="{EDGE2[:8]}",'
            f'state="ok"}} 0.0') in text
    assert CLOUD not in text  # fingerprints only


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
    check, reader, clock, registry = make()
    reader.devices["flannel-wg"] = mesh_device(clock, edge2_age=10)
    await check.run()
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
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = ("import sys, edgeheal.checks.wireguard, edgeheal.wg.uapi, edgeheal.wg; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pyroute2', 'paho', 'lightkube', 'dbus_fast', 'scapy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
