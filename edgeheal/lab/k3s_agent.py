"""The lab's stand-in K3s agent: its load balancer, its kubelet's heartbeats, its restart.

Why: the ``agent-stuck``, ``node-ip-changed`` and ``control-uplink-outage`` scenarios need a
node whose K3s agent can lose its server while the data plane is fine, and a
``k3s-agent.service`` whose restart does what K3s's does. Each behaviour is taken from the
source named:

- **the load balancer** (k3s-io/k3s ``pkg/agent/loadbalancer/loadbalancer.go``, ``New``):
  K3s's agent listens on ``127.0.0.1:<lb-server-port>`` (6444 by default), writes its
  server list to ``<data-dir>/agent/etc/k3s-agent-load-balancer.json`` (``configFile``,
  ``updateConfig``: ``ServerURL`` and ``ServerAddresses``) and proxies every client
  connection (``tcpproxy``) to a server it dials for it; a dial error closes the client
  (``onDialError``). The kubelet, embedded in the same process, reaches the API through it.
- **stuck** (k3s-io/k3s#11349, #10506: after an outage the balancer never reconnects and
  the node stays NotReady until the agent is restarted): :meth:`K3sAgent.stick` makes the
  balancer drop its server connections and from then on accept clients without ever
  forwarding them — the evidence the ``control`` check reads as ``balancer_stuck``.
- **the heartbeats**: the kubelet renews the node's Lease through the balancer
  (``pkg/kubelet``'s lease controller, every ``leaseDuration * 0.25``). Here the stand-in
  kubelet sends one line per renewal through the balancer to the stand-in server
  (:func:`serve_server`, on the cloud's 6443, the port K3s's supervisor and API share),
  which answers it; a renewal that came back is written to a status file, and the lab's
  watcher (:meth:`K3sAgent._watch`) lets the test API's kubelet renew the Lease only while
  they come back (:mod:`edgeheal.lab.kubeapi.heartbeats`: the lifecycle controller then
  turns a silent node's Ready to ``Unknown``). After :data:`SILENCE` renewal intervals
  without an answer the kubelet drops its connection and reconnects (an HTTP/2 client's
  ping timeout), so after an ordinary outage the agent finds its server by itself.
- **the node's address** (k3s-io/k3s ``pkg/util/net.go``, ``GetHostnameAndIPs``): without
  ``--node-ip`` the agent takes the primary interface's address once, at start, and
  registers it as the Node's InternalIP (and Flannel's ``public-ip``); an address changed
  under a running agent stays wrong on the Node until the agent restarts
  (k3s-io/k3s#2827). :meth:`K3sAgent.register` plays that at each (re)start.
- **the restart** (``k3s-agent.service``, ``KillMode=process``): the stand-in systemd's
  ``RestartUnit`` (:mod:`edgeheal.lab.systemd_bus`) stops the agent's process and starts a
  new one: a fresh balancer (its state file written again), the kubelet reconnecting,
  the node re-registered with its current address. The lab's Flannel is a pod
  (:mod:`edgeheal.lab.world`), so the tunnel is untouched, as it is on a node whose Flannel
  is not embedded.

What differs from K3s: no TLS on the balancer's connections (the stand-in server answers
lines, not the API); the Lease itself is written by the test API's kubelet, gated on the
renewals getting through, not by requests the lab's kubelet sends; no remotedialer tunnel.

Lab code: the processes run ``python -m edgeheal.lab.k3s_agent agent|server`` inside the
edge's and the cloud's namespaces; the agent never imports this module.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeheal.base import compat

if TYPE_CHECKING:
    from edgeheal.lab.systemd_bus import FakeSystemd
    from edgeheal.lab.world import Edge, World

SERVER_PORT = 6443
"""The K3s server's port (supervisor and API server share it)."""
BALANCER = ("127.0.0.1", 6444)
"""K3s's ``--lb-server-port`` default."""
UNIT = "k3s-agent.service"
STATE_NAME = "k3s-agent-load-balancer.json"
DIAL_TIMEOUT = 5.0
SILENCE = 6
"""Renewal intervals without an answer before the kubelet reconnects."""


# --- the processes ------------------------------------------------------------------------

async def serve_server(host: str, port: int) -> None:
    """The stand-in K3s server: answers every line it is sent (a renewal) with ``ok``."""
    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None  # noqa: S101 - a handler runs in a task
        handlers.add(me)
        try:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while line := await reader.readline():
                    writer.write(b"ok " + line)
                    await writer.drain()
        finally:
            handlers.discard(me)
            writer.close()

    server = await asyncio.start_server(handle, host, port, reuse_address=True)
    try:
        async with server:
            await server.serve_forever()
    finally:
        await _cancel(handlers)


async def _cancel(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel and await ``tasks`` (a stopped stand-in leaves nothing running)."""
    pending = [t for t in tasks if t is not asyncio.current_task()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


class Agent:
    """The stand-in agent process: the balancer and the kubelet (module docstring)."""

    def __init__(self, server: tuple[str, int], balancer: tuple[str, int], state: Path,
                 status: Path, renew: float) -> None:
        self.server, self.balancer, self.state, self.status = server, balancer, state, status
        self.renew = renew
        self.stuck = False
        self.upstreams: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()

    def write_state(self) -> None:
        """``updateConfig``: the balancer's server list, where K3s keeps it."""
        self.state.parent.mkdir(parents=True, exist_ok=True)
        host, port = self.server
        self.state.write_text(json.dumps({
            "ServerURL": f"https://{host}:{port}",
            "ServerAddresses": [f"{host}:{port}"]}, indent=2))

    def stick(self) -> None:
        """Drop every server connection; accept clients from now on, forward nothing."""
        self.stuck = True
        for writer in list(self.upstreams):
            writer.transport.abort()

    async def _client(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None  # noqa: S101 - a handler runs in a task
        self._handlers.add(me)
        try:
            await self._forward(reader, writer)
        finally:
            self._handlers.discard(me)
            writer.transport.abort()
            writer.close()

    async def _forward(self, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        if self.stuck:  # accepts, never forwards (k3s-io/k3s#11349)
            with contextlib.suppress(OSError):
                while await reader.read(4096):
                    pass
            return
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*self.server),
                                                DIAL_TIMEOUT)
        except (OSError, *compat.TimeoutErrors):
            return  # onDialError: the client is closed
        self.upstreams.add(up_w)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(4096):
                    dst.write(data)
                    await dst.drain()

        pipes = {asyncio.ensure_future(pipe(reader, up_w)),
                 asyncio.ensure_future(pipe(up_r, writer))}
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.upstreams.discard(up_w)
            up_w.transport.abort()
            up_w.close()
            await _cancel(pipes)

    def _renewed(self) -> None:
        tmp = self.status.with_suffix(".tmp")
        tmp.write_text(json.dumps({"renewed": time.time(), "pid": os.getpid()}))
        tmp.replace(self.status)

    async def kubelet(self) -> None:
        """Renew through the balancer every ``renew`` s; after :data:`SILENCE` renewals'
        time without an answer, reconnect (an HTTP/2 client's ping timeout)."""
        while True:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.balancer), DIAL_TIMEOUT)
            except (OSError, *compat.TimeoutErrors):
                await asyncio.sleep(self.renew)
                continue
            answered = time.monotonic()
            closed = False
            try:
                while time.monotonic() - answered < SILENCE * self.renew:
                    writer.write(b"renew\n")
                    await writer.drain()
                    try:
                        answer = await asyncio.wait_for(reader.readline(), self.renew)
                    except compat.TimeoutErrors:
                        continue  # unanswered: the next renewal on the same connection
                    if not answer:
                        closed = True
                        break
                    answered = time.monotonic()
                    self._renewed()
                    await asyncio.sleep(self.renew)
            except OSError:
                closed = True
            finally:
                writer.transport.abort()
                writer.close()
            if closed:  # the balancer closed it (a dial error): not at once again
                await asyncio.sleep(self.renew)

    async def run(self) -> None:
        self.write_state()
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self.stick)
        server = await asyncio.start_server(self._client, *self.balancer, reuse_address=True)
        try:
            async with server:
                await asyncio.gather(server.serve_forever(), self.kubelet())
        finally:
            await _cancel(self._handlers)


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgeheal.lab.k3s_agent")
    sub = parser.add_subparsers(dest="role", required=True)
    srv = sub.add_parser("server")
    srv.add_argument("--listen", type=_hostport, required=True)
    agent = sub.add_parser("agent")
    agent.add_argument("--server", type=_hostport, required=True)
    agent.add_argument("--balancer", type=_hostport, default=BALANCER)
    agent.add_argument("--state", type=Path, required=True)
    agent.add_argument("--status", type=Path, required=True)
    agent.add_argument("--renew", type=float, required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        if args.role == "server":
            asyncio.run(serve_server(*args.listen))
        else:
            asyncio.run(Agent(args.server, args.balancer, args.state, args.status,
                              args.renew).run())
    return 0


# --- the lab's side ------------------------------------------------------------------------

TUNED = {"renew": 0.5, "duration": 4, "grace": 8.0}
"""The lab's heartbeats: a 4 s Lease renewed every 0.5 s, NotReady 8 s after the last."""
FIELD = {"renew": 10.0, "duration": 40, "grace": 40.0}
"""kubelet's and the lifecycle controller's defaults (:mod:`edgeheal.lab.kubeapi.heartbeats`)."""


def start_server(world: World) -> None:
    """The stand-in K3s server on the cloud's :data:`SERVER_PORT` (every address)."""
    world.sandbox.spawn([sys.executable, "-m", "edgeheal.lab.k3s_agent", "server",
                         "--listen", f"0.0.0.0:{SERVER_PORT}"], ns=world.cloud,
                        log_path=world.workdir / "k3s-server.log")


class K3sAgent:
    """One edge's stand-in K3s agent, its unit on a private bus, and the Lease gate."""

    def __init__(self, world: World, edge: Edge) -> None:
        self.world, self.edge = world, edge
        self.timing = FIELD if world.field else TUNED
        base = edge.workdir / "k3s" / "agent"
        self.state = base / "etc" / STATE_NAME
        self.status = base / "status.json"
        self.proc: Any = None
        self.systemd: FakeSystemd | None = None
        self.posting = True
        self._task: asyncio.Task[None] | None = None
        self.registered: list[str] = []
        """The InternalIP of each (re)registration, in order."""

    @property
    def restarts(self) -> int:
        """``k3s-agent.service`` restarts the stand-in systemd carried out."""
        return len(self.systemd.restarts) if self.systemd is not None else 0

    async def start(self) -> None:
        from edgeheal.lab.systemd_bus import FakeSystemd, start_system_bus

        bus = start_system_bus(self.world.sandbox)
        self.edge.k3s_bus = bus.address
        self.systemd = FakeSystemd.with_units(bus.address, {UNIT: "active"},
                                              on_restart=self.restart)
        await self.systemd.start()
        self._spawn()
        self.world.kube.kubelet_start(self.edge.name, renew=self.timing["renew"],
                                      grace=self.timing["grace"],
                                      duration=int(self.timing["duration"]))
        self._task = asyncio.create_task(self._watch(), name=f"lab.k3s.{self.edge.name}")

    def register(self) -> None:
        """``GetHostnameAndIPs`` at the agent's start: the primary address, on the Node."""
        self.world.kube.set_addresses(self.edge.name, self.edge.edge_ip)
        self.registered.append(self.edge.edge_ip)

    def _spawn(self) -> None:
        self.status.unlink(missing_ok=True)
        self.register()
        self.proc = self.world.sandbox.spawn(
            [sys.executable, "-m", "edgeheal.lab.k3s_agent", "agent", "--server",
             f"{self.edge.cloud_ip}:{SERVER_PORT}", "--balancer",
             f"{BALANCER[0]}:{BALANCER[1]}", "--state", str(self.state), "--status",
             str(self.status), "--renew", str(self.timing["renew"])], ns=self.edge.ns,
            log_path=self.edge.workdir / "k3s-agent.log")

    def stick(self) -> None:
        """The fault of ``agent-stuck``: the balancer drops its server and forwards nothing."""
        self.proc.send_signal(signal.SIGUSR1)

    async def restart(self, _unit: str) -> None:
        """What ``RestartUnit`` of ``k3s-agent.service`` does (module docstring)."""
        from edgeheal.lab.netns import stop_process

        await asyncio.to_thread(stop_process, self.proc)
        if self.proc in self.world.sandbox.processes:
            self.world.sandbox.processes.remove(self.proc)
        self._spawn()

    def renewed_age(self) -> float | None:
        try:
            return time.time() - float(json.loads(self.status.read_text())["renewed"])
        except (OSError, ValueError, KeyError):
            return None

    async def _watch(self) -> None:
        """The Lease is renewed only while the kubelet's renewals get through."""
        kube, node = self.world.kube, self.edge.name
        while True:
            age = self.renewed_age()
            through = age is not None and age < 3 * self.timing["renew"]
            if through and not self.posting:
                kube.kubelet_start(node, renew=self.timing["renew"],
                                   grace=self.timing["grace"],
                                   duration=int(self.timing["duration"]))
            elif not through and self.posting:
                kube.kubelet_stop(node)
            self.posting = through
            await asyncio.sleep(0.25)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.systemd is not None:
            await self.systemd.close()

    def control_config(self) -> str:
        """The ``[control]`` and ``[remediation.control]`` sections of this edge's agent:
        the lab's tuning, or with ``--field`` only what names this world."""
        server = f'servers = ["{self.edge.cloud_ip}:{SERVER_PORT}"]\n'
        # the stand-in has no kubelet /healthz to ask (the real one is on 10248)
        head = f'\n[control]\n{server}kubelet_healthz = ""\n'
        ladder = f'\n[remediation.control]\nenabled = true\nbalancer_state = "{self.state}"\n'
        if self.world.field:
            return head + ladder
        return (head + 'interval = "1s"\nretry_interval = "1s"\napi_spacing = "5s"\n'
                + ladder + 'act_after = "15s"\nnot_ready_window = "30s"\n'
                'startup_grace = "10s"\ncooldown = "30s"\nverify_timeout = "30s"\n')


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
