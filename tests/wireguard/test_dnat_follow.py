"""``watch_peers = "auto"`` follows kube-proxy's DNAT through conntrack (issue 34).

The peers carry what Flannel gives them (their node's pod subnet only); the tunnel target is
a Service ClusterIP that no peer's allowed IPs hold. conntrack is a stand-in here that
answers what the kernel's ctnetlink answers for connections to ``ClusterIP:port`` (the real
one is exercised against a real DNAT in ``test_conntrack.py`` and ``test_clusterip.py``).
"""

from __future__ import annotations

from dataclasses import replace

from edgeheal.boundaries import wg
from edgeheal.boundaries.kernel.conntrack import ConntrackError, Translation
from edgeheal.checks import wireguard as wgcheck
from edgeheal.checks.wireguard.peers import FOLLOW_EVERY, follow
from edgeheal.model import State
from tests.support import Clock, context
from tests.wireguard.test_check import CLOUD, EDGE2, peer

CLUSTER_IP = "10.43.0.20"
TOML = f"""
[wireguard]
interfaces = ["flannel-wg"]
[[mqtt.targets]]
name = "cloud"
host = "{CLUSTER_IP}"
port = 1883
path = "tunnel"
"""
OTHER = "T1RIRVJPVEhFUk9USEVST1RIRVJPVEhFUk9USEVST1Q="  # the node the broker moves to


class Conntrack:
    """What ctnetlink holds for connections to an address (set by the test)."""

    def __init__(self) -> None:
        self.entries: dict[str, list[Translation]] = {}
        self.asked: list[tuple[str, int | None]] = []
        self.error: Exception | None = None

    async def __call__(self, address: str, port: int | None) -> list[Translation]:
        self.asked.append((address, port))
        if self.error is not None:
            raise self.error
        return list(self.entries.get(address, []))


def device(clock: Clock, *, cloud: bool = True, other: bool = False) -> wg.DeviceStats:
    peers = [peer(EDGE2, hs_age=10, clock=clock, allowed=("10.42.11.0/24",))]
    if cloud:
        peers.insert(0, peer(CLOUD, hs_age=10, clock=clock, allowed=("10.42.0.0/24",)))
    if other:
        peers.append(peer(OTHER, hs_age=10, clock=clock, allowed=("10.42.12.0/24",)))
    return wg.DeviceStats("flannel-wg", 51820, tuple(peers))


def make(toml: str = TOML) -> tuple[wgcheck.WireguardCheck, Conntrack, Clock, list[str],
                                    dict[str, object]]:
    clock, ct, hastened = Clock(), Conntrack(), []
    devices: dict[str, object] = {}

    async def reader(ifname: str) -> object:
        return devices[ifname]

    ctx = replace(context(toml, clock=clock).ctx, hasten=hastened.append)
    check = wgcheck.WireguardCheck(ctx, reader=reader, conntrack=ct)
    return check, ct, clock, hastened, devices


def watched(result: object) -> list[str]:
    return [p["peer"] for p in result.detail["peers"] if p["watched"]]  # type: ignore[attr-defined]


async def test_a_clusterip_is_followed_to_the_peer_that_carries_its_pod() -> None:
    check, ct, clock, _, devices = make()
    devices["flannel-wg"] = device(clock)
    ct.entries[CLUSTER_IP] = [Translation("10.42.0.5", 1883, "established")]
    result = await check.run()
    assert (result.state, result.reason) == (State.OK, "ok"), result.message
    assert watched(result) == [CLOUD[:8]]
    assert result.detail["targets"][CLUSTER_IP] == {
        "addresses": [CLUSTER_IP], "how": ["dnat"], "via": ["10.42.0.5"], "message": ""}
    assert ct.asked == [(CLUSTER_IP, 1883)]


async def test_before_any_connection_it_is_target_unresolved_never_no_peers() -> None:
    check, ct, clock, hastened, devices = make()
    devices["flannel-wg"] = device(clock)
    result = await check.run()
    assert (result.state, result.reason) == (State.UNKNOWN, "target_unresolved")
    assert "conntrack knows no translation" in result.message
    assert sorted(watched(result)) == sorted([CLOUD[:8], EDGE2[:8]])  # all, meanwhile
    assert hastened == ["cloud"]  # the probe's connection is what shows the DNAT
    ct.entries[CLUSTER_IP] = [Translation("10.42.0.5", 1883, "syn_sent")]
    clock.advance(5)
    result = await check.run()  # asked again at once while unresolved
    assert result.reason == "ok"
    assert watched(result) == [CLOUD[:8]]


async def test_an_unreadable_conntrack_is_target_unresolved_with_the_kernels_words() -> None:
    check, ct, clock, _, devices = make()
    devices["flannel-wg"] = device(clock)
    ct.error = ConntrackError("reading conntrack needs CAP_NET_ADMIN: [Errno 1]")
    result = await check.run()
    assert result.reason == "target_unresolved"
    assert "CAP_NET_ADMIN" in result.message



def test_target_unresolved_is_in_the_reason_table_as_unknown() -> None:
    reg = next(r for r in wgcheck.checks.registrations() if r.module == "wireguard")
    assert reg.reason_states["target_unresolved"] is State.UNKNOWN
    assert "\n    target_unresolved  unknown" in reg.doc


async def test_stuck_flannel_after_the_dnat_was_followed_is_no_peers() -> None:
    check, ct, clock, _, devices = make()
    devices["flannel-wg"] = device(clock)
    ct.entries[CLUSTER_IP] = [Translation("10.42.0.5", 1883, "established")]
    assert (await check.run()).reason == "ok"
    ct.entries.clear()  # the probe's entries expired: the cached translation is kept
    devices["flannel-wg"] = device(clock, cloud=False)  # the device lost its cloud peer
    clock.advance(FOLLOW_EVERY + 1)
    result = await check.run()
    assert (result.state, result.reason) == (State.FAILED, "no_peers")


async def test_stuck_flannel_at_boot_is_no_peers_when_conntrack_shows_the_pod() -> None:
    check, ct, clock, _, devices = make()
    devices["flannel-wg"] = device(clock, cloud=False)
    ct.entries[CLUSTER_IP] = [Translation("10.42.0.5", 1883, "syn_sent")]
    assert (await check.run()).reason == "no_peers"


async def test_a_moved_broker_pod_is_followed_within_the_refresh() -> None:
    check, ct, clock, _, devices = make()
    devices["flannel-wg"] = device(clock, other=True)
    ct.entries[CLUSTER_IP] = [Translation("10.42.0.5", 1883, "established")]
    assert watched(await check.run()) == [CLOUD[:8]]
    # the pod moved to another node: the old connection closes, a new one is DNATed there
    ct.entries[CLUSTER_IP] = [Translation("10.42.0.5", 1883, "time_wait"),
                              Translation("10.42.12.9", 1883, "established")]
    clock.advance(1)
    assert watched(await check.run()) == [CLOUD[:8]]  # cached: not asked every run
    clock.advance(FOLLOW_EVERY)
    assert watched(await check.run()) == [OTHER[:8]]
    assert len(ct.asked) == 2


async def test_a_pod_address_target_never_asks_conntrack() -> None:
    check, ct, clock, _, devices = make(TOML.replace(CLUSTER_IP, "10.42.0.5"))
    devices["flannel-wg"] = device(clock)
    assert (await check.run()).reason == "ok"
    assert ct.asked == []


def test_follow_prefers_live_connections_and_drops_untranslated_ones() -> None:
    import ipaddress

    ip = ipaddress.ip_address(CLUSTER_IP)
    assert follow([Translation(CLUSTER_IP, 1883, "established")], ip) == ()
    assert follow([Translation("10.42.0.5", 1883, "time_wait"),
                   Translation("10.42.3.5", 1883, "established")], ip) == (
        ipaddress.ip_address("10.42.3.5"),)
    assert follow([Translation("10.42.0.5", 1883, "time_wait")], ip) == (
        ipaddress.ip_address("10.42.0.5"),)
