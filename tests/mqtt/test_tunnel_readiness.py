"""Readiness follows the tunnel with the shipped defaults, on real tunnels at K = 25 s.

Three sites at once, each a real wireguard-go tunnel between two namespaces with Flannel's
persistent keepalive (K = 25 s), a Mosquitto on the cloud side reached through the tunnel
(``broker-tunnel``, the collectors' readiness gate) and over the underlay
(``broker-direct``, the alert link), and a real ``edgeheal run`` on the edge whose config is
the example's with only the site's names and addresses filled in: every interval, timeout
and debounce is the shipped default.

1. Blackhole: the path drops every tunnel packet, both ways (nftables on arrival).
2. Send failure: the edge's firewall drops the tunnel's UDP on output (``sendmsg`` fails:
   both counters freeze).
3. 10 % random loss on the tunnel, both ways, for ~90 s: never not-ready.

Each fault is injected just after a scheduled tunnel probe, so the next one is a full
60 s away: a 503 well before ``K + 40 s`` can only come from the WireGuard check's
suspicion confirmed at once by the probe (``Context.hasten``) and the quick retry — long
before the handshake-age rules (135 s, 180 s + K) could fire. After the repair the probe
is retried every few seconds, so readiness returns within 30 s. The medians are the
benchmark's (``bench/readiness.py``); these are causal bounds with slack.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from edgeheal.base import compat
from edgeheal.base.compat import tomllib
from edgeheal.config import MqttTarget
from edgeheal.lab import nsutil
from edgeheal.lab.mosquitto import Mosquitto
from edgeheal.lab.wireguard import PORT, WgMesh
from tests.support import until

pytestmark = [pytest.mark.netns, pytest.mark.slow]

K = 25
EXAMPLE = Path(__file__).resolve().parents[2] / "edgeheal.example.toml"
SEND_FAULT = "edgeheal_test_send"


@dataclass
class Site:
    mesh: WgMesh
    port: int
    log: Path
    codes: list[tuple[float, str, int]] = field(default_factory=list)

    @property
    def edge(self) -> Any:
        return self.mesh.nodes[0]

    @property
    def cloud(self) -> Any:
        return self.mesh.nodes[1]

    def _get(self, path: str) -> tuple[int, Any]:
        try:
            return nsutil.get_json(self.edge.ns, "127.0.0.1", self.port, path, 2.0)
        except OSError:
            return 0, None

    async def get(self, path: str) -> tuple[int, Any]:
        return await asyncio.to_thread(self._get, path)

    async def poll(self, stop: asyncio.Event) -> None:
        """Record /probe/broker-tunnel and /readyz every 0.5 s until ``stop``."""
        while not stop.is_set():
            for path in ("/probe/broker-tunnel", "/readyz"):
                code, _ = await self.get(path)
                self.codes.append((time.monotonic(), path, code))
            with contextlib.suppress(*compat.TimeoutErrors):
                await asyncio.wait_for(stop.wait(), 0.5)

    def first(self, path: str, code: int, after: float) -> float | None:
        return next((t for t, p, c in self.codes if p == path and c == code and t > after),
                    None)

    async def story(self) -> str:
        """What a failure message needs: both checks' status and the agent's log tail."""
        checks = {n: await self.check(n) for n in ("wireguard", "broker-tunnel")}
        said = self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""
        return f"{checks}\n{said}"

    async def check(self, name: str) -> dict[str, Any]:
        _, doc = await self.get("/status")
        return dict(doc["checks"][name]) if isinstance(doc, dict) else {}


def shipped_defaults() -> None:
    """The example config sets no cadence for the MQTT targets: they run on the defaults
    this test relies on (so a change of either shows up here)."""
    example = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    for target in example["mqtt"]["targets"]:
        assert not {"interval", "timeout", "fail_after", "recover_after",
                    "retry_interval"} & set(target), target
    assert example["agent"]["check_interval"] == "5s"
    defaults = MqttTarget()
    assert (defaults.interval, defaults.timeout, defaults.retry_interval,
            defaults.fail_after, defaults.recover_after) == (60.0, 4.0, 2.0, 2, 2)


def build_site(tmp_path: Path) -> Site:
    mesh = WgMesh(2, keepalive=K, log_dir=tmp_path)
    try:
        edge, cloud = mesh.nodes
        broker = Mosquitto(mesh.sandbox, tmp_path, ns=cloud.ns, host="0.0.0.0")
        broker.start()
        port = 20000 + secrets.randbelow(20000)  # the namespace is ours alone
        conf = tmp_path / "edgeheal.toml"
        # the example config, with this site's names and addresses (no cadence key changed)
        conf.write_text(f"""
[agent]
node_name = "edge-test"
state_dir = "{tmp_path / 'state'}"
check_interval = "5s"
[http]
listen = ["127.0.0.1:{port}"]
[offload]
enabled = false
[wireguard]
interfaces = ["{edge.ifname}"]
watch_peers = "auto"
required = true
[[mqtt.targets]]
name = "broker-tunnel"
host = "{cloud.overlay}"
port = {broker.port}
path = "tunnel"
required = true
[[mqtt.targets]]
name = "broker-direct"
host = "{cloud.underlay[0]}"
port = {broker.port}
path = "direct"
[alerts]
target = "broker-direct"
[remediation]
mode = "none"
""", encoding="utf-8")
        mesh.wait_handshake(edge, cloud)
        log = mesh.sandbox.track(tmp_path / "agent.log")
        mesh.sandbox.spawn([sys.executable, "-m", "edgeheal", "run", "--config", str(conf)],
                           ns=edge.ns, log_path=log)
        return Site(mesh, port, log)
    except BaseException:
        mesh.close()
        raise


async def healthy(site: Site) -> None:
    async def ready() -> bool:
        code, _ = await site.get("/readyz")
        return code == 200
    for _ in range(120):  # bounded: 60 s
        if await ready():
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"site never ready: {await site.story()}")


async def after_a_scheduled_probe(site: Site) -> None:
    """Return just after the next scheduled run of broker-tunnel (the next is ~60 s off)."""
    runs = (await site.check("broker-tunnel"))["runs"]
    for _ in range(150):  # bounded: the interval (60 s) plus slack
        if (await site.check("broker-tunnel"))["runs"] > runs:
            return
        await asyncio.sleep(0.5)
    raise AssertionError("broker-tunnel did not run within 75 s")


async def fault_and_repair(site: Site, inject: Callable[[], None],
                           repair: Callable[[], None]) -> dict[str, float]:
    await healthy(site)
    await after_a_scheduled_probe(site)
    t0 = time.monotonic()
    inject()
    try:
        await until(lambda: site.first("/probe/broker-tunnel", 503, t0), within=K + 40 + 15,
                    every=0.25, what="broker-tunnel 503")
    except AssertionError as err:
        raise AssertionError(f"{err} ({site.log.parent.name}):\n{await site.story()}") from None
    not_ready = (site.first("/probe/broker-tunnel", 503, t0) or 0) - t0
    # the poller asks /readyz right after the probe: its answer may still be on the way
    with contextlib.suppress(AssertionError):
        await until(lambda: site.first("/readyz", 503, t0), within=10, every=0.25,
                    what="/readyz 503")
    readyz = site.first("/readyz", 503, t0)
    t1 = time.monotonic()
    repair()
    await until(lambda: site.first("/probe/broker-tunnel", 200, t1), within=45, every=0.25,
                what="broker-tunnel 200 again")
    ready = (site.first("/probe/broker-tunnel", 200, t1) or 0) - t1
    return {"not_ready": not_ready, "readyz_503": (readyz or 1e9) - t0, "ready": ready}


def send_failure(site: Site, on: bool) -> None:
    """The edge's own firewall drops the tunnel's UDP on output (sendmsg fails)."""
    script = (f"table inet {SEND_FAULT}\ndelete table inet {SEND_FAULT}\n")
    if on:
        script += (f"table inet {SEND_FAULT} {{\n  chain out {{ type filter hook output "
                   f"priority 0; policy accept;\n    udp dport {PORT} counter drop\n  }}\n}}\n")
    site.mesh.sandbox.nft(site.edge.ns, script)


async def lossy(site: Site, seconds: float) -> float:
    await healthy(site)
    t0 = time.monotonic()
    site.mesh.loss(10, site.edge, site.cloud)
    # a collector's traffic through the tunnel, so the loss really bites: the agent's own
    # probes are a PINGREQ a minute on the kept-open session, and 10 % of the few packets
    # that and the keepalives make in 90 s is often none at all
    site.mesh.sandbox.spawn(["ping", "-q", "-i", "0.5", "-w", str(int(seconds)),
                             site.cloud.overlay], ns=site.edge.ns)
    await asyncio.sleep(seconds)
    dropped = site.mesh.fault_counter(site.edge) + site.mesh.fault_counter(site.cloud)
    site.mesh.clear_faults()
    assert dropped > 0, "the loss rule dropped nothing: the run proved nothing"
    return t0


async def test_readiness_follows_the_tunnel_with_the_shipped_defaults(
        tmp_path: Path) -> None:
    shipped_defaults()
    sites = []
    try:
        for tag in ("blackhole", "send", "loss"):
            (tmp_path / tag).mkdir()
            sites.append(build_site(tmp_path / tag))
        hole, send, loss = sites
        stop = asyncio.Event()
        pollers = [asyncio.create_task(s.poll(stop), name=f"test.poll.{i}")
                   for i, s in enumerate(sites)]
        try:
            results = await asyncio.gather(
                fault_and_repair(hole, lambda: hole.mesh.blackhole(hole.edge, hole.cloud),
                                 hole.mesh.clear_faults),
                fault_and_repair(send, lambda: send_failure(send, on=True),
                                 lambda: send_failure(send, on=False)),
                lossy(loss, 90.0))
        finally:
            stop.set()
            await asyncio.gather(*pollers, return_exceptions=True)
        blackhole, send_fail, loss_began = results
        for name, got in (("blackhole", blackhole), ("send failure", send_fail)):
            # not ready long before the handshake-age rules (135 s; 180 s + K) could fire
            assert got["not_ready"] < K + 40, (name, got)
            assert got["readyz_503"] < K + 40, (name, got)
            assert got["ready"] < 30, (name, got)
        false_alarms = [(round(t - loss_began, 1), p) for t, p, c in loss.codes
                        if t > loss_began and c != 200]
        assert not false_alarms, f"not ready under 10 % loss: {false_alarms}"
        assert len([1 for t, _, _ in loss.codes if t > loss_began]) > 100  # really polled
        print(f"blackhole {blackhole}; send failure {send_fail}")
    finally:
        for site in sites:
            site.mesh.close()
