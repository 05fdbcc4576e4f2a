"""The lab's world: a cloud, N edge nodes behind 4G "carriers", and everything they run.

Topology (each box is a network namespace the lab creates and always removes)::

    edge i ──veth (uplink)── carrier i ──veth── cloud
    10.60.i.2            10.60.i.1 | 10.61.i.2   10.61.i.1

- **cloud**: Mosquitto on all addresses: the broker pod's address ``10.42.0.17`` in the
  cloud node's pod subnet ``10.42.0.0/24``, reached through the tunnel as the Service
  ClusterIP ``10.43.0.20`` (below), and the direct path's ``10.61.i.1``; the test Kubernetes
  API (:mod:`edgeheal.lab.kubeapi`, in the lab's own process, listening in this namespace),
  the cloud end of every edge's WireGuard tunnel (wireguard-go), and an alert subscriber
  (``mosquitto_sub``) recording everything under ``edgeheal/#``.
- **carrier i**: routes between edge and cloud, and runs the faulty-NIC emulator
  (:mod:`edgeheal.lab.faultynic`) as the relay for the WireGuard port: while edge i's uplink
  has TX checksum offload on, its handshake packets reach the cloud with bad checksums.
- **edge i**: the uplink (a veth whose TX offload starts *on*), the tunnel device managed by
  a stand-in Flannel that (re)creates it from the cluster's data whenever its pod is
  (re)created in the test API, a stand-in collector publishing through the tunnel, and the
  real agent (``edgeheal run``) with a real config file.

What K3s does, the lab does (docs/lab.md reviews the differences that remain): cluster CIDR
``10.42.0.0/16`` with one /24 lease per node (the cloud ``10.42.0.0/24``, edge i
``10.42.<10+i>.0/24``), service CIDR ``10.43.0.0/16``. Every WireGuard device is set up as
Flannel's WireGuard backend sets ``flannel-wg`` (flannel-io/flannel
``pkg/backend/wireguard``: ``Configure`` puts the lease's first address on the device as a
/32 and routes the cluster CIDR through it; ``handleSubnetEvents`` gives every peer exactly
its node's lease as allowed IPs, never the service CIDR). On every edge
:mod:`edgeheal.lab.kubeproxy` installs what kube-proxy and Flannel install: the ClusterIP
DNATed to the broker pod in the nat table (``output`` for the host's own traffic,
``prerouting`` for pods), and host traffic into the tunnel masqueraded to the device's
address. No interface holds the ClusterIP and no route leads to it but the default one.

Lab code: it runs ``ip``, ``nft``, ``wg``, ``ethtool`` and ``wireguard-go``; the agent never
does. Names are unique per run; :meth:`World.close` removes everything, also after Ctrl-C.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeheal.base import compat
from edgeheal.lab import kubeproxy, nsutil
from edgeheal.lab.faults import WG_PORT, Faults
from edgeheal.lab.kubeproxy import CLUSTER_CIDR, SERVICE_CIDR
from edgeheal.lab.mosquitto import Mosquitto
from edgeheal.lab.netns import (
    LabError,
    Sandbox,
    require_programs,
    require_root,
    run,
    stop_process,
    unique,
)

log = logging.getLogger(__name__)

CLOUD_POD_CIDR = "10.42.0.0/24"
CLOUD_OVERLAY = "10.42.0.0"
"""The cloud's tunnel address: its lease's first address, as Flannel sets it."""
BROKER_CLUSTER_IP = "10.43.0.20"
"""The broker Service's ClusterIP (virtual: only kube-proxy's DNAT knows it)."""
BROKER_POD_IP = "10.42.0.17"
"""The broker pod's address in the cloud's pod subnet (kube-proxy's endpoint)."""
AGENT_PORT = 9917
KEEPALIVE = 5
"""Persistent keepalive in the lab, seconds. Shorter than the field's 20-25 s so scenarios
finish in minutes; every threshold that matters derives from it."""
FIELD_KEEPALIVE = 25
"""Flannel's WireGuard persistent keepalive on K3s: the field's K (``edgeheal lab --field``)."""
FLANNEL_NS = "kube-flannel"
AGENT_USER = "system:serviceaccount:kube-flannel:edgeheal"
CLUSTER_RANGES = (CLUSTER_CIDR, SERVICE_CIDR)
"""Pod and service ranges: only the tunnel carries them (the carrier refuses)."""
PROGRAMS = ("ip", "nft", "wg", "wireguard-go", "ethtool", "mosquitto", "mosquitto_sub",
            "mosquitto_passwd")


def keypair() -> tuple[str, str]:
    private = run(["wg", "genkey"]).stdout.strip()
    public = run(["wg", "pubkey"], input=private + "\n").stdout.strip()
    return private, public


@dataclass
class Edge:
    index: int
    name: str
    ns: str
    carrier: str
    uplink: str
    wg_ifname: str
    private_key: str = field(repr=False)
    public_key: str
    overlay: str
    pod_cidr: str
    workdir: Path
    agent: Any = None
    collector: Any = None
    relay: Any = None
    flannel_pod_uid: str = ""
    device_builds: int = 0
    wg_process: Any = None
    host: int = 2
    """Last octet of the uplink's address: the modem's carrier may hand out a new one."""
    modem_bus: str = ""
    """Address of the private D-Bus where this edge's stand-in ModemManager runs ("": no
    modem in this world)."""
    uplink_peer: str = ""
    """The carrier's end of the uplink veth (set down: the edge's uplink loses carrier)."""
    uplink2: str = ""
    """The second uplink (``uplinks=2``), ``10.62.i.2`` to the carrier's ``10.62.i.1``;
    "" in a one-uplink world."""
    public_ip: str = ""
    """The edge's public address at the carrier's NAT ("": no carrier NAT in this world,
    the cloud sees the carrier's own address)."""
    k3s_bus: str = ""
    """Address of the private D-Bus with the stand-in systemd's ``k3s-agent.service``
    ("": no stand-in K3s agent in this world, :mod:`edgeheal.lab.k3s_agent`)."""

    @property
    def edge_ip(self) -> str:
        return f"10.60.{self.index}.{self.host}"

    @property
    def carrier_edge_ip(self) -> str:
        return f"10.60.{self.index}.1"

    @property
    def carrier_cloud_ip(self) -> str:
        return f"10.61.{self.index}.2"

    @property
    def cloud_ip(self) -> str:
        """The cloud's address on this edge's link: the direct path's broker address."""
        return f"10.61.{self.index}.1"

    @property
    def config_path(self) -> Path:
        return self.workdir / "edgeheal.toml"

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"


class World(Faults):
    """Build with :meth:`build` (async), tear down with :meth:`close` (always)."""

    def __init__(self, workdir: Path, *, edges: int = 1, agent: bool = True,
                 offload_on_at_boot: bool = True, field: bool = False,
                 modem: bool = False, collector_payload: int = 0,
                 agent_extra: str = "", uplinks: int = 1,
                 carrier_nat: bool = False, uplink_ladder: str = "",
                 k3s_agent: bool = False) -> None:
        if not 1 <= edges <= 50:
            raise LabError("--edges must be between 1 and 50")
        self.field = field
        """Field timings: K = 25 s and the agent on its shipped defaults (``--field``)."""
        self.keepalive = FIELD_KEEPALIVE if field else KEEPALIVE
        self.workdir = workdir
        self.edge_count = edges
        self.with_agent = agent
        self.offload_on_at_boot = offload_on_at_boot
        self.modem = modem
        """Each edge's uplink is a modem behind a stand-in ModemManager (its own private
        D-Bus), and the agents run the uplink check and ladder against it."""
        self.collector_payload = collector_payload
        """Bytes of each collector reading (0: a small JSON reading, as always)."""
        self.agent_extra = agent_extra
        """TOML added to every agent's config (``{wg}`` names the edge's tunnel device,
        ``{uplink}`` and ``{uplink2}`` its uplinks)."""
        self.uplink_ladder = uplink_ladder
        """TOML keys added to ``[remediation.uplink]`` (the ``dead-sim`` scenario's)."""
        self.uplinks = uplinks
        """2: each edge has a second uplink whose default route has a higher metric
        (Ethernet at 100, LTE at 700, as NetworkManager orders them)."""
        self.carrier_nat = carrier_nat
        """The carriers map the edges' tunnel flows onto a public address that they can
        move, keeping established flows on the old one (:mod:`edgeheal.lab.carriernat`)."""
        self.k3s_agent = k3s_agent
        """Each edge runs the stand-in K3s agent (:mod:`edgeheal.lab.k3s_agent`) against a
        stand-in server in the cloud, and its agent the control check and ladder."""
        self.k3s: dict[str, Any] = {}
        """edge name -> its K3sAgent."""
        self.modems: dict[str, Any] = {}
        """edge name -> its FakeModemManager (edgeheal.lab.modemmanager)."""
        self.modem_units: dict[str, Any] = {}
        """edge name -> the stand-in systemd on its modem bus, with ModemManager.service
        (the ``modemmanager-restart`` rung's target)."""
        self.sandbox = Sandbox()
        self.cloud = ""
        self.cloud_wg = ""
        self.cloud_private = ""
        self.cloud_public = ""
        self.edges: list[Edge] = []
        self.broker: Mosquitto | None = None
        self.kube: Any = None
        self.alerts_path = workdir / "alerts.log"
        self.mqtt_port = 0
        self.kube_port = 0
        self._tasks: list[asyncio.Task[None]] = []

    # --- building ------------------------------------------------------------------------

    async def build(self) -> None:
        require_root()
        require_programs(*PROGRAMS)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cloud = self.sandbox.netns("c")
        run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns=self.cloud)
        run(["ip", "addr", "add", f"{BROKER_POD_IP}/32", "dev", "lo"], ns=self.cloud)
        self.cloud_private, self.cloud_public = keypair()
        self.cloud_wg = unique("wc")
        for i in range(self.edge_count):
            self.edges.append(self._build_edge(i))
        self._start_cloud_wireguard()
        self._start_broker()
        await self._start_kube()
        if self.carrier_nat:
            from edgeheal.lab import carriernat

            for edge in self.edges:  # before the relay's first packet
                edge.public_ip = carriernat.install(self.sandbox, edge, edge.cloud_ip,
                                                    WG_PORT)
        for edge in self.edges:
            self._start_kube_proxy(edge)
            self._start_relay(edge)
            self._build_device(edge)  # what Flannel does when its pod first starts
            self._start_collector(edge)
        self._tasks.append(asyncio.create_task(self._flannel_watch(), name="lab.flannel"))
        if self.k3s_agent:
            from edgeheal.lab import k3s_agent

            if self.modem:
                raise LabError("a stand-in K3s agent and a modem need one bus: not built")
            k3s_agent.start_server(self)
            for edge in self.edges:
                self.k3s[edge.name] = k3s_agent.K3sAgent(self, edge)
                await self.k3s[edge.name].start()
        if self.modem:
            from edgeheal.lab.modems import start_modem

            for edge in self.edges:
                self.modems[edge.name] = await start_modem(self, edge)

    def _build_edge(self, i: int) -> Edge:
        ns, carrier = self.sandbox.netns(f"e{i}"), self.sandbox.netns(f"g{i}")
        workdir = self.workdir / f"edge-{i}"
        (workdir / "state").mkdir(parents=True, exist_ok=True)
        private, public = keypair()
        edge = Edge(index=i, name=f"edge-{i}", ns=ns, carrier=carrier, uplink=unique("u"),
                    wg_ifname=unique("wg"), private_key=private, public_key=public,
                    overlay=f"10.42.{10 + i}.0", pod_cidr=f"10.42.{10 + i}.0/24",
                    workdir=workdir)
        _, edge.uplink_peer = self.sandbox.veth(ns, carrier, addr_a=f"{edge.edge_ip}/24",
                                                addr_b=f"{edge.carrier_edge_ip}/24",
                                                name_a=edge.uplink)
        self.sandbox.veth(carrier, self.cloud, addr_a=f"{edge.carrier_cloud_ip}/24",
                          addr_b=f"{edge.cloud_ip}/24")
        run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns=carrier)
        if self.uplinks == 2:
            edge.uplink2 = unique("v")
            self.sandbox.veth(ns, carrier, addr_a=f"10.62.{i}.2/24",
                              addr_b=f"10.62.{i}.1/24", name_a=edge.uplink2)
            # the relay's address stays reachable over the second uplink when the first
            # link is down (a carrier's gateway does not vanish with one access link)
            run(["ip", "addr", "add", f"{edge.carrier_edge_ip}/32", "dev", "lo"],
                ns=carrier)
            run(["ip", "route", "add", "default", "via", f"10.62.{i}.1", "dev",
                 edge.uplink2, "metric", "700"], ns=ns)
            run(["ip", "route", "add", f"10.62.{i}.0/24", "via", edge.carrier_cloud_ip],
                ns=self.cloud)
            run(["ip", "route", "add", "default", "via", edge.carrier_edge_ip, "dev",
                 edge.uplink, "metric", "100"], ns=ns)
        else:
            run(["ip", "route", "add", "default", "via", edge.carrier_edge_ip], ns=ns)
        run(["ip", "route", "add", "default", "via", edge.cloud_ip], ns=carrier)
        for cluster_range in CLUSTER_RANGES:  # the cluster is reachable only via the tunnel
            run(["ip", "route", "add", "unreachable", cluster_range], ns=carrier)
        run(["ip", "route", "add", f"10.60.{i}.0/24", "via", edge.carrier_cloud_ip],
            ns=self.cloud)
        # a 4G NIC ships with TX checksum offload on: that is the incident
        state = "on" if self.offload_on_at_boot else "off"
        run(["ethtool", "-K", edge.uplink, "tx", state], ns=ns)
        return edge

    def _start_cloud_wireguard(self) -> None:
        sock = Path("/var/run/wireguard") / f"{self.cloud_wg}.sock"
        self.sandbox.track(sock)
        self.sandbox.spawn(["wireguard-go", "-f", self.cloud_wg], ns=self.cloud,
                           log_path=self.workdir / "wg-cloud.log")
        _wait(sock.exists, 10, "cloud wireguard-go socket")
        run(["wg", "set", self.cloud_wg, "private-key", "/dev/stdin", "listen-port",
             str(WG_PORT)], ns=self.cloud, input=self.cloud_private + "\n")
        # No endpoint for the edges: they sit behind the carrier's NAT, so the cloud learns
        # an edge's endpoint from its first valid handshake (WireGuard roaming), as in the
        # field. (With an endpoint, both ends initiate at once after the offload fix and
        # each drops the other's response, in lockstep, every 5 s: seen with wireguard-go.)
        for edge in self.edges:
            run(["wg", "set", self.cloud_wg, "peer", edge.public_key, "allowed-ips",
                 edge.pod_cidr, "persistent-keepalive",
                 str(self.keepalive)], ns=self.cloud)
        run(["ip", "addr", "add", f"{CLOUD_OVERLAY}/32", "dev", self.cloud_wg], ns=self.cloud)
        run(["ip", "link", "set", self.cloud_wg, "up"], ns=self.cloud)
        run(["ip", "route", "replace", CLUSTER_CIDR, "dev", self.cloud_wg, "scope", "link"],
            ns=self.cloud)

    def _start_broker(self) -> None:
        self.broker = Mosquitto(self.sandbox, self.workdir, ns=self.cloud, host="0.0.0.0")
        self.broker.start()
        self.mqtt_port = self.broker.port
        self.broker.subscribe("edgeheal/#", self.alerts_path)

    async def _start_kube(self) -> None:
        from edgeheal.lab.kubeapi import FakeKube

        self.kube = FakeKube(ready_delay=1.0, replace_delay=0.5)
        # the edges reach the API on the cloud's address of their own link
        self.kube._server_cert = self.kube.ca.issue_cert(
            "127.0.0.1", "localhost", *(e.cloud_ip for e in self.edges))
        for edge in self.edges:
            self.kube.add_node(edge.name)
        self.kube.add_daemonset(FLANNEL_NS, "kube-flannel-ds", {"app": "flannel"})
        creds = self.kube.add_user(AGENT_USER, token=os.urandom(16).hex())
        self.kube.allow_agent(AGENT_USER)
        with nsutil.inside(self.cloud):  # the listening socket lives in the cloud
            url = await self.kube.start(host="0.0.0.0")
        self.kube_port = int(url.rsplit(":", 1)[1])
        for edge in self.edges:
            self.kube.write_kubeconfig(edge.workdir / "kubeconfig", creds)
            _retarget_kubeconfig(edge.workdir / "kubeconfig", edge.cloud_ip, self.kube_port)
            edge.flannel_pod_uid = self.kube.pod_on(FLANNEL_NS, edge.name)["metadata"]["uid"]

    def _start_kube_proxy(self, edge: Edge) -> None:
        """kube-proxy's Service rules and Flannel's masquerade on ``edge``."""
        kubeproxy.install(self.sandbox, edge.ns, [
            kubeproxy.Service(BROKER_CLUSTER_IP, self.mqtt_port, BROKER_POD_IP)],
            tunnel=edge.wg_ifname)

    def _start_relay(self, edge: Edge) -> None:
        edge.relay = self.sandbox.spawn(
            [sys.executable, "-m", "edgeheal.lab.faultynic", "--edge-ns", edge.ns,
             "--uplink", edge.uplink, "--listen", f"{edge.carrier_edge_ip}:{WG_PORT}",
             "--upstream", f"{edge.cloud_ip}:{WG_PORT}", "--source", edge.carrier_cloud_ip,
             "--events", str(edge.workdir / "nic-events.jsonl")],
            ns=edge.carrier, log_path=edge.workdir / "relay.log")

    # --- the stand-in Flannel ------------------------------------------------------------

    def _build_device(self, edge: Edge) -> None:
        """(Re)create the edge's tunnel device from the cluster's data, as Flannel does."""
        if edge.wg_process is not None:
            stop_process(edge.wg_process)
            if edge.wg_process in self.sandbox.processes:
                self.sandbox.processes.remove(edge.wg_process)
            run(["ip", "link", "del", edge.wg_ifname], ns=edge.ns, check=False)
        sock = Path("/var/run/wireguard") / f"{edge.wg_ifname}.sock"
        _wait(lambda: not sock.exists(), 5, "old wireguard-go socket removed")
        self.sandbox.track(sock)
        edge.wg_process = self.sandbox.spawn(
            ["wireguard-go", "-f", edge.wg_ifname], ns=edge.ns,
            log_path=edge.workdir / "wg.log")
        _wait(sock.exists, 10, f"wireguard-go socket of {edge.name}")
        run(["wg", "set", edge.wg_ifname, "private-key", "/dev/stdin", "listen-port",
             str(WG_PORT)], ns=edge.ns, input=edge.private_key + "\n")
        self.add_cloud_peer(edge)
        for other in self.edges:  # the full mesh: every other edge is a peer too
            if other is not edge:
                run(["wg", "set", edge.wg_ifname, "peer", other.public_key, "endpoint",
                     f"{other.edge_ip}:{WG_PORT}", "allowed-ips", other.pod_cidr,
                     "persistent-keepalive",
                     str(self.keepalive)], ns=edge.ns)
        run(["ip", "addr", "add", f"{edge.overlay}/32", "dev", edge.wg_ifname], ns=edge.ns)
        run(["ip", "link", "set", edge.wg_ifname, "up"], ns=edge.ns)
        run(["ip", "route", "replace", CLUSTER_CIDR, "dev", edge.wg_ifname, "scope", "link"],
            ns=edge.ns)
        edge.device_builds += 1

    def add_cloud_peer(self, edge: Edge) -> None:
        run(["wg", "set", edge.wg_ifname, "peer", self.cloud_public, "endpoint",
             f"{edge.carrier_edge_ip}:{WG_PORT}", "allowed-ips", CLOUD_POD_CIDR,
             "persistent-keepalive",
             str(self.keepalive)], ns=edge.ns)

    def remove_cloud_peer(self, edge: Edge) -> None:
        """The stuck-Flannel fault: the device loses its cloud peer."""
        run(["wg", "set", edge.wg_ifname, "peer", self.cloud_public, "remove"], ns=edge.ns)

    async def _flannel_watch(self) -> None:
        """Rebuild an edge's device whenever its Flannel pod is replaced (new uid)."""
        while True:
            for edge in self.edges:
                try:
                    pod = self.kube.pod_on(FLANNEL_NS, edge.name)
                except (KeyError, LookupError):
                    continue
                uid = pod["metadata"]["uid"]
                if uid != edge.flannel_pod_uid:
                    edge.flannel_pod_uid = uid
                    log.info("stand-in flannel on %s: new pod %s, rebuilding %s", edge.name,
                             pod["metadata"]["name"], edge.wg_ifname)
                    await asyncio.to_thread(self._build_device, edge)
            await asyncio.sleep(0.3)

    # --- collector and agent -------------------------------------------------------------

    def _start_collector(self, edge: Edge) -> None:
        edge.collector = self.sandbox.spawn(
            [sys.executable, "-m", "edgeheal.lab.collector", "--host", BROKER_CLUSTER_IP,
             "--port", str(self.mqtt_port), "--client-id", f"collector-{edge.name}",
             "--stats", str(edge.workdir / "collector.json"),
             "--payload", str(self.collector_payload)],
            ns=edge.ns, log_path=edge.workdir / "collector.log")

    def agent_config(self, edge: Edge, *, remediation: str = "pod", extra: str = "") -> str:
        """The config of ``edge``'s agent: the lab's tuning, or with ``--field`` the shipped
        defaults (:mod:`edgeheal.lab.agent_config`); the uplink sections if it has a modem."""
        from edgeheal.lab import agent_config  # it imports this module

        k3s = self.k3s[edge.name].control_config() if edge.name in self.k3s else ""
        return agent_config.render(edge, mqtt_port=self.mqtt_port, shipped=self.field,
                                   uplink=bool(edge.modem_bus), remediation=remediation,
                                   ladder=self.uplink_ladder,
                                   extra=self.agent_extra.replace("{wg}", edge.wg_ifname)
                                   .replace("{uplink2}", edge.uplink2)
                                   .replace("{uplink}", edge.uplink) + extra + k3s)

    def start_agent(self, edge: Edge, **kw: Any) -> None:
        edge.config_path.write_text(self.agent_config(edge, **kw))
        env = {**os.environ, "EDGEHEAL_LOG_LEVEL": "info"}
        if edge.modem_bus or edge.k3s_bus:  # every D-Bus call goes to the lab's bus
            env["DBUS_SYSTEM_BUS_ADDRESS"] = edge.modem_bus or edge.k3s_bus
        edge.agent = self.sandbox.spawn(
            [sys.executable, "-m", "edgeheal", "run", "--config", str(edge.config_path)],
            ns=edge.ns, log_path=edge.workdir / "agent.log", env=env)

    def kill_agent(self, edge: Edge) -> None:
        if edge.agent is not None and edge.agent.poll() is None:
            edge.agent.send_signal(signal.SIGKILL)
            edge.agent.wait(5)

    def status(self, edge: Edge) -> dict[str, Any] | None:
        try:
            code, doc = nsutil.get_json(edge.ns, "127.0.0.1", AGENT_PORT, "/status", 2.0)
        except OSError:
            return None
        return doc if code == 200 and isinstance(doc, dict) else None

    def collector_stats(self, edge: Edge) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((edge.workdir / "collector.json").read_text())
        except (OSError, ValueError):
            return {}
        return data

    # --- faults --------------------------------------------------------------------------

    def last_handshake(self, edge: Edge) -> int:
        """Seconds-since-epoch of the edge's last handshake with the cloud (0: never)."""
        out = run(["wg", "show", edge.wg_ifname, "latest-handshakes"], ns=edge.ns,
                  check=False).stdout
        for line in out.splitlines():
            key, _, value = line.partition("\t")
            if key == self.cloud_public:
                return int(value or 0)
        return 0

    def cloud_in_csum_errors(self) -> int:
        text = run(["cat", "/proc/net/snmp"], ns=self.cloud).stdout
        rows = [ln.split() for ln in text.splitlines() if ln.startswith("Udp:")]
        return int(rows[1][rows[0].index("InCsumErrors")])

    def nic_events(self, edge: Edge) -> list[dict[str, Any]]:
        path = edge.workdir / "nic-events.jsonl"
        try:
            return [json.loads(line) for line in path.read_text().splitlines() if line]
        except (OSError, ValueError):
            return []

    def alerts(self) -> list[dict[str, Any]]:
        out = []
        try:
            lines = self.alerts_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        for line in lines:
            topic, _, payload = line.partition(" ")
            if not topic.endswith("/alerts"):
                continue
            try:
                out.append(json.loads(payload))
            except ValueError:
                continue
        return out

    # --- teardown ------------------------------------------------------------------------

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for fake in (*self.modem_units.values(), *self.modems.values(),
                     *self.k3s.values()):
            await fake.close()
        if self.kube is not None:
            try:
                await asyncio.wait_for(self.kube.close(), 5)
            except (*compat.TimeoutErrors, OSError) as err:
                log.warning("closing the test API server: %s", err)
        await asyncio.to_thread(self.sandbox.close)


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def _retarget_kubeconfig(path: Path, host: str, port: int) -> None:
    """Point the kubeconfig at the cloud address the edge reaches the API on."""
    text = path.read_text()
    import re

    text = re.sub(r"server: https://[^\s]+", f"server: https://{host}:{port}", text)
    path.write_text(text)
