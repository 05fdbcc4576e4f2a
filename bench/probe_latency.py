"""/readyz latency idle and under load: the probes never wait (issue 27).

    python bench/probe_latency.py --out FILE.json [--probes N] [--peers N]

One real agent in this process (its HTTP server, supervisor, alert engine and outbox on a
state directory of its own; no network check), a required check that runs every second
(the lab's cadence), and a ``mesh`` check whose detail and Prometheus series are those of
the real WireGuard check over ``--peers`` fake peers (``[metrics] all_peers = true``).
``/readyz`` is asked every 20 ms from this process's loop (the agent's own: a stalled loop
shows in full), ``--probes`` times per load:

- ``idle``: nothing else.
- ``scrape``: four threads of another process fetch ``/metrics`` back to back, and one
  ``/status`` (5,000 peers: 3.4 MB and 1.7 MB).
- ``fsync``: every fsync of the outbox and the history takes 2 s (simulated where the
  agent calls it, as in ``tests/hardening/test_slow_disk_probes.py``); an alert is raised
  and the history saved every 0.5 s.
- ``broker-flood``: the agent's alert connection goes to a real Mosquitto on loopback,
  with the fleet hold on (``[fleet] hold = true``: its one subscription, so the broker
  may send it PUBLISH at all), and ``mosquitto_pub -l`` publishes a hold message the
  agent must refuse (no ``until``) on that topic as fast as it can: every one is read,
  framed, parsed and refused on the agent's loop, and logged through the agent's own
  rate-limited stderr handler (:func:`edgeheal.base.log.setup`, as ``edgeheal run``
  sets it up). The count heard is reported.
- ``api-45mb``: the agent's Kubernetes client (:class:`edgeheal.boundaries.kube.KubeClient`,
  the one the pod remedy lists with), on the agent's loop, lists the Flannel pods back to
  back from the lab's API stand-in (:class:`edgeheal.lab.kubeapi.FakeKube`, in a child
  process so its own JSON making is not charged to the agent), which answers each list
  with 42,000 pods in one 45 MB answer (``crowd(paged=False)``): read up to the 4 MiB cap,
  then refused. Then ``api-paged``: 60,000 pods, ``limit`` honoured (60 pages parsed).

The probe path has no setting: the shipped defaults and the lab's tuning differ only in
check cadences, which this does not exercise. Figures: p50, p99 and max in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import labkit

from edgeheal import config
from edgeheal.agent import endpoints as http
from edgeheal.agent import http_server
from edgeheal.agent.alerts.outbox import Outbox
from edgeheal.agent.remediation.history import Store, Timeline
from edgeheal.agent.supervisor import Agent
from edgeheal.base import compat
from edgeheal.boundaries import wg
from edgeheal.checks import wireguard as wgcheck
from edgeheal.config import CheckSettings
from edgeheal.core.safeguards import History
from edgeheal.model import CheckResult, State
from tests.hardening.test_scrape_flood_probes import SCRAPERS
from tests.support import Clock, context

FSYNC = 2.0
HOLD_REFUSED = b'{"reason": "flood"}'
"""A hold message without ``until``: framed and parsed, then refused (never obeyed)."""
KUBE_CHILD = r"""
import asyncio, sys
from pathlib import Path
from edgeheal.lab.kubeapi import FakeKube
workdir, pods, paged = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "paged"

async def main():
    api = FakeKube()
    api.add_node("edge-test")
    api.add_node("edge-2")
    api.add_daemonset("kube-flannel", "kube-flannel-ds", {"app": "flannel"})
    await api.start()
    creds = api.add_user("system:serviceaccount:kube-flannel:edgeheal-edge-test")
    api.allow_agent(creds.user, "kube-flannel")
    api.crowd(pods, paged=paged)
    api.write_kubeconfig(workdir / "kubeconfig", creds)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await api.close()

asyncio.run(main())
"""


class Check:
    def __init__(self, name: str, settings: CheckSettings, result: CheckResult) -> None:
        self.name, self.settings, self.result = name, settings, result

    async def run(self) -> CheckResult:
        return self.result


async def mesh(peers: int) -> tuple[wgcheck.WireguardCheck, CheckResult]:
    clock = Clock()
    harness = context('[wireguard]\ninterfaces = ["flannel-wg"]\n'
                      '[metrics]\nall_peers = true\n', clock=clock)
    hs = clock.wall().timestamp() - 30.0
    device = wg.DeviceStats("flannel-wg", 51820, tuple(
        wg.PeerStats(public_key=base64.b64encode(i.to_bytes(32, "big")).decode(),
                     endpoint=f"198.51.{i // 250}.{i % 250}:51820",
                     allowed_ips=(f"10.{i // 250}.{i % 250}.0/24",), last_handshake=hs,
                     rx_bytes=1000, tx_bytes=2000, persistent_keepalive=0)
        for i in range(peers)), reader="uapi")

    async def reader(ifname: str) -> wg.DeviceStats:
        return device

    check = wgcheck.WireguardCheck(harness.ctx, reader=reader)
    return check, await check.run()


async def probe(session: Any, url: str, count: int) -> list[float]:
    took = []
    for _ in range(count):
        began = time.perf_counter()
        async with session.get(url) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        took.append((time.perf_counter() - began) * 1000)
        await asyncio.sleep(0.02)
    return took


def figures(took: list[float]) -> dict[str, Any]:
    return {"n": len(took), "p50_ms": round(labkit.percentile(took, 50) or 0, 2),
            "p99_ms": round(labkit.percentile(took, 99) or 0, 2),
            "max_ms": round(max(took), 2)}


async def measure(workdir: Path, probes: int, peers: int) -> dict[str, Any]:
    from edgeheal.base import log
    from edgeheal.lab.mosquitto import Mosquitto
    from edgeheal.lab.netns import Sandbox

    log.setup("info")  # the agent's handler: what a flood of refusals costs it
    with Sandbox() as sandbox:
        broker = Mosquitto(sandbox, workdir)
        broker.start()
        return await _measure(workdir, probes, peers, broker)


async def _measure(workdir: Path, probes: int, peers: int, broker: Any) -> dict[str, Any]:
    import aiohttp

    from edgeheal.boundaries.mqtt.link import Link

    heard = [0]
    real_heard = Link._heard

    def counting(self: Link, payload: bytes) -> None:
        heard[0] += 1
        real_heard(self, payload)

    Link._heard = counting  # type: ignore[method-assign]
    collector, result = await mesh(peers)
    cfg = config.loads_generic(
        f'[agent]\nstate_dir = "{workdir}/state"\nnode_name = "edge-test"\n'
        '[http]\nlisten = ["127.0.0.1:0"]\n'
        f'[[mqtt.targets]]\nname = "broker"\nhost = "127.0.0.1"\nport = {broker.port}\n'
        '[alerts]\ntarget = "broker"\n[fleet]\nhold = true\n')
    agent = Agent(cfg, checks=[
        Check("fast", CheckSettings(interval=1.0, required=True), CheckResult(State.OK, "ok")),
        Check("mesh", CheckSettings(interval=1.0, required=False), result)])
    task = asyncio.create_task(agent.run())
    out: dict[str, Any] = {"peers": peers, "loadavg_start": labkit.loadavg()}
    try:
        async with compat.timeout(30):
            while not agent.snapshot.ready:
                await agent.changed(agent.snapshot.version, 0.05)
        agent.registry.register(collector)
        assert agent.http_runner is not None
        port = http_server.bound_ports(agent.http_runner)[0]
        url = f"http://127.0.0.1:{port}/readyz"
        async with aiohttp.ClientSession() as session:
            gc.collect()
            out["idle"] = figures(await probe(session, url, probes))
            window = probes * 0.03 + 2
            scrapers = await asyncio.create_subprocess_exec(
                sys.executable, "-c", SCRAPERS, str(port), str(window), str(peers),
                stdout=asyncio.subprocess.PIPE)
            try:
                out["scrape"] = figures(await probe(session, url, probes))
                done, _ = await scrapers.communicate()
                out["scrape"]["scrapes"] = done.decode().strip()
            finally:
                if scrapers.returncode is None:
                    scrapers.kill()
                    await scrapers.wait()
            out["scrape"]["renders"] = agent.http_runner.app[http.RENDER].renders
            out["fsync"] = figures(await slow_disk(agent, workdir, session, url, probes))
            out["broker-flood"] = await broker_flood(agent, broker, session, url,
                                                     probes=probes, heard=heard)
            for name, pods, paged in (("api-45mb", 42_000, False), ("api-paged", 60_000, True)):
                out[name] = await api_answers(workdir / name, session, url, probes,
                                              pods=pods, paged=paged)
    finally:
        Link._heard = real_heard  # type: ignore[method-assign]
        agent.stop_event.set()
        async with compat.timeout(10):
            await task
    out["loadavg_end"] = labkit.loadavg()
    return out


async def broker_flood(agent: Agent, broker: Any, session: Any, url: str, *, probes: int,
                       heard: list[int]) -> dict[str, Any]:
    """``mosquitto_pub -l`` publishes the refused hold message as fast as it can, for as
    long as the probes take (its input is a pipe kept full)."""
    link = agent.alert_link
    assert link is not None
    async with compat.timeout(20):
        while not link.state.up:
            await link.wait_change()
    topic = f"{agent.config.alerts.topic_prefix}/fleet/hold"
    pub = await asyncio.create_subprocess_exec(
        "mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", topic, "-l",
        "-q", "0", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    stop = asyncio.Event()

    async def feed() -> None:
        assert pub.stdin is not None
        block = (HOLD_REFUSED + b"\n") * 2000
        with contextlib.suppress(ConnectionError):
            while not stop.is_set():
                pub.stdin.write(block)
                await pub.stdin.drain()

    before, connects = heard[0], link.state.connects
    feeder = asyncio.create_task(feed())
    try:
        await asyncio.sleep(1.0)  # the flood under way
        began, start = time.monotonic(), heard[0]
        took = await probe(session, url, probes)
        rate = (heard[0] - start) / (time.monotonic() - began)
    finally:
        stop.set()
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
        if pub.returncode is None:
            pub.kill()
        await pub.wait()
    return {**figures(took), "heard": heard[0] - before, "per_second": round(rate),
            "reconnects": link.state.connects - connects}


async def api_answers(workdir: Path, session: Any, url: str, probes: int, *, pods: int,
                      paged: bool) -> dict[str, Any]:
    """The agent's Kubernetes client lists pods back to back while ``/readyz`` is asked."""
    from edgeheal.boundaries.kube import KubeClient, KubeError
    from edgeheal.config import KubernetesSettings

    await asyncio.to_thread(workdir.mkdir, parents=True)
    api = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KUBE_CHILD, str(workdir), str(pods),
        "paged" if paged else "one", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    lists: dict[str, Any] = {"lists": 0, "refused": 0, "error": ""}
    try:
        assert api.stdout is not None
        async with compat.timeout(60):
            line = await api.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"the API stand-in did not start: {line!r}")
        kube = KubeClient(KubernetesSettings(kubeconfig=str(workdir / "kubeconfig"),
                                             request_timeout=30.0, retries=0))
        stop = asyncio.Event()

        async def lister() -> None:
            while not stop.is_set():
                try:
                    await kube.list_pods("kube-flannel", "app=flannel", "edge-test")
                except KubeError as err:
                    lists["refused"] += 1
                    lists["error"] = str(err)[:160]
                lists["lists"] += 1

        task = asyncio.create_task(lister())
        try:
            await asyncio.sleep(1.0)
            took = await probe(session, url, probes)
        finally:
            stop.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await kube.close()
    finally:
        if api.stdin is not None:
            api.stdin.close()
        try:
            async with compat.timeout(10):
                await api.wait()
        except compat.TimeoutErrors:
            api.kill()
            await api.wait()
    return {**figures(took), **lists}


async def slow_disk(agent: Agent, workdir: Path, session: Any, url: str,
                    probes: int) -> list[float]:
    real_fsync, real_add = os.fsync, Outbox.add

    def fsync(fd: int) -> None:
        real_fsync(fd)
        time.sleep(FSYNC)

    def add(self: Outbox, *args: Any) -> int:
        dropped: int = real_add(self, *args)
        time.sleep(FSYNC)
        return dropped

    os.fsync = fsync  # type: ignore[assignment]
    Outbox.add = add  # type: ignore[method-assign]
    store = Store(workdir / "state", Timeline(boot_id="bench", offset=0.0))
    stop = asyncio.Event()

    async def write() -> None:
        n = 0
        while not stop.is_set():
            agent.alerts.raise_alert("agent.test", f"queued on a slow disk {n}")
            store.save(History(failures_in_row=n % 3))
            n += 1
            await asyncio.sleep(0.5)

    writer = asyncio.create_task(write())
    try:
        return await probe(session, url, probes)
    finally:
        stop.set()
        await writer
        os.fsync, Outbox.add = real_fsync, real_add  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--probes", type=int, default=300)
    parser.add_argument("--peers", type=int, default=5000)
    args = parser.parse_args()
    return labkit.run_bench("probes", lambda w: measure(w, args.probes, args.peers),
                            args.out)


if __name__ == "__main__":
    sys.exit(main())
