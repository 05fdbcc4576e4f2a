"""The WireGuard checks against a fake /sys and /lib/modules tree and recorded devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeheal.tools.doctor import wireguard
from edgeheal.tools.doctor.finding import Result
from edgeheal.tools.doctor.system import Route
from tests.doctor.support import CLOUD, NEIGHBOUR, TUNNEL_CONFIG, config, edge


def test_a_loaded_kernel_module_is_found_in_sys(tmp_path: Path) -> None:
    (tmp_path / "sys/module/wireguard").mkdir(parents=True)
    found = wireguard.available(edge().system(tmp_path))
    assert (found.result, found.detail["kind"]) == (Result.OK, "kernel")
    assert "loaded" in found.found


@pytest.mark.parametrize(("path", "text"), [
    ("modules.builtin", "kernel/drivers/net/wireguard/wireguard.ko\n"),
    ("kernel/drivers/net/wireguard/wireguard.ko.zst", ""),
    ("modules.dep", "updates/dkms/wireguard.ko: kernel/lib/udp_tunnel.ko\n"),
])
def test_an_installed_or_built_in_module_counts(tmp_path: Path, path: str, text: str) -> None:
    file = tmp_path / "lib/modules/6.1.0-test" / path
    file.parent.mkdir(parents=True)
    file.write_text(text)
    found = wireguard.available(edge().system(tmp_path))
    assert (found.result, found.detail["kind"]) == (Result.OK, "kernel")


def test_another_kernels_module_does_not_count(tmp_path: Path) -> None:
    file = tmp_path / "lib/modules/5.10.0-old/kernel/drivers/net/wireguard/wireguard.ko"
    file.parent.mkdir(parents=True)
    file.write_text("")
    found = wireguard.available(edge().system(tmp_path))
    assert found.result is Result.FAIL
    assert "6.1.0-test" in found.found
    assert "modprobe wireguard" in found.fix


def test_wireguard_go_on_path_is_enough(tmp_path: Path) -> None:
    system = edge().system(tmp_path, which=lambda n: "/usr/bin/wireguard-go"
                           if n == "wireguard-go" else None)
    found = wireguard.available(system)
    assert (found.result, found.detail["kind"]) == (Result.OK, "userspace")


async def test_watched_peers_are_those_that_route_the_tunnel_targets() -> None:
    node = edge()
    tunnel = await wireguard.observe(config(TUNNEL_CONFIG), node.system())
    assert tunnel.present == ["flannel-wg"]
    assert tunnel.missing == ["flannel-wg-v6"]
    assert tunnel.watched["flannel-wg"] == {CLOUD}
    found = wireguard.interfaces(config(TUNNEL_CONFIG), tunnel)
    assert found.result is Result.OK
    assert "flannel-wg-v6" in found.found  # absent, said so, not a failure


async def test_no_tunnel_device_at_all_fails() -> None:
    node = edge()
    del node.links["flannel-wg"]
    tunnel = await wireguard.observe(config(TUNNEL_CONFIG), node.system())
    found = wireguard.interfaces(config(TUNNEL_CONFIG), tunnel)
    assert found.result is Result.FAIL
    assert "wireguard-native" in found.fix


async def test_a_watched_peer_without_keepalive_warns() -> None:
    tunnel = await wireguard.observe(config(TUNNEL_CONFIG), edge(keepalive=0).system())
    found = wireguard.keepalive(config(TUNNEL_CONFIG), tunnel)
    assert found.result is Result.WARN
    assert CLOUD[:8] in found.found
    assert "PersistentKeepaliveInterval" in found.fix


async def test_an_unwatched_peer_without_keepalive_does_not_matter() -> None:
    node = edge()
    dev = node.devices["flannel-wg"]
    node.devices["flannel-wg"] = type(dev)(dev.interface, dev.listen_port, (
        dev.peers[0], type(dev.peers[1])(**{**{f: getattr(dev.peers[1], f) for f in (
            "public_key", "endpoint", "allowed_ips", "last_handshake", "rx_bytes",
            "tx_bytes")}, "persistent_keepalive": 0})))
    tunnel = await wireguard.observe(config(TUNNEL_CONFIG), node.system())
    found = wireguard.keepalive(config(TUNNEL_CONFIG), tunnel)
    assert found.result is Result.OK
    assert [p["peer"] for p in found.detail["peers"]] == [CLOUD[:8]]
    assert NEIGHBOUR[:8] not in found.found


async def test_a_tunnel_target_routed_over_the_uplink_fails() -> None:
    node = edge()
    node.routes["10.42.1.20"] = Route("wwan0", source="100.64.0.2")
    cfg = config(TUNNEL_CONFIG)
    (found,) = await wireguard.routes(cfg, await wireguard.observe(cfg, node.system()),
                                      node.system())
    assert found.result is Result.FAIL
    assert "10.42.1.20 via wwan0" in found.found
    assert 'path = "direct"' in found.fix


async def test_a_tunnel_target_routed_through_the_tunnel_is_ok() -> None:
    node = edge()
    cfg = config(TUNNEL_CONFIG)
    (found,) = await wireguard.routes(cfg, await wireguard.observe(cfg, node.system()),
                                      node.system())
    assert (found.result, found.found) == (Result.OK, "broker-tunnel: 10.42.1.20 via flannel-wg")


CLUSTER_IP_CONFIG = TUNNEL_CONFIG.replace('"10.42.1.20"', '"10.43.0.20"\nport = 1883')


def clusterip_node(*translated: str) -> tuple[object, list[tuple[str, int | None]]]:
    """A node whose kube-proxy DNATs 10.43.0.20:1883 to ``translated`` (conntrack)."""
    from edgeheal.boundaries.kernel.conntrack import Translation

    node = edge()
    node.routes["10.43.0.20"] = Route("wwan0", source="100.64.0.2")  # the default route
    asked: list[tuple[str, int | None]] = []

    async def conntrack(address: str, port: int | None) -> list[Translation]:
        asked.append((address, port))
        return [Translation(t, 1883, "established") for t in translated]

    return node.system(conntrack=conntrack), asked


async def test_a_clusterip_target_passes_through_kube_proxys_dnat() -> None:
    system, asked = clusterip_node("10.42.1.20")
    cfg = config(CLUSTER_IP_CONFIG)
    tunnel = await wireguard.observe(cfg, system)
    (found,) = await wireguard.routes(cfg, tunnel, system)
    assert found.result is Result.OK, found.found
    assert "10.43.0.20 -> 10.42.1.20 (kube-proxy's DNAT, conntrack) via flannel-wg" in found.found
    assert asked == [("10.43.0.20", 1883)]
    assert tunnel.watched["flannel-wg"] == {CLOUD}  # the peer that carries the pod


async def test_a_clusterip_without_a_translation_yet_is_a_warning_not_a_failure() -> None:
    system, _ = clusterip_node()
    cfg = config(CLUSTER_IP_CONFIG)
    (found,) = await wireguard.routes(cfg, await wireguard.observe(cfg, system), system)
    assert found.result is Result.WARN
    assert "conntrack shows no translation yet" in found.found


async def test_a_clusterip_dnated_to_a_pod_no_tunnel_routes_fails() -> None:
    system, _ = clusterip_node("10.42.9.9")  # no route recorded: unreachable
    cfg = config(CLUSTER_IP_CONFIG)
    (found,) = await wireguard.routes(cfg, await wireguard.observe(cfg, system), system)
    assert found.result is Result.FAIL
    assert "10.42.9.9" in found.found
