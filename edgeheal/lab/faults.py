"""The faults the lab's scenarios inject into a :class:`~edgeheal.lab.world.World`: what a
carrier, a modem or a neighbour does to an edge (offload back on, a re-enumerated uplink, a
lost carrier or address, a moved public address, a NAT's drifting ports, an outage, a
shrunk path MTU, loss, a black hole, a powered-off node), each the commands a real network
would see. A mixin of ``World``: it needs only the world's sandbox, the relays and the
cloud's namespace and device."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from edgeheal.lab.netns import LabError, Sandbox, run, stop_process

if TYPE_CHECKING:
    from edgeheal.lab.world import Edge

WG_PORT = 51820


class Faults:
    """Fault injection, mixed into :class:`~edgeheal.lab.world.World`."""

    sandbox: Sandbox
    cloud: str
    cloud_wg: str
    cloud_public: str

    def set_uplink_offload(self, edge: Edge, on: bool) -> None:
        run(["ethtool", "-K", edge.uplink, "tx", "on" if on else "off"], ns=edge.ns)

    def recreate_uplink(self, edge: Edge) -> None:
        """The modem re-enumerates: the uplink is deleted (if still there) and comes back,
        offload on."""
        run(["ip", "link", "del", edge.uplink], ns=edge.ns, check=False)
        self.sandbox.veth(edge.ns, edge.carrier, addr_a=f"{edge.edge_ip}/24",
                          addr_b=f"{edge.carrier_edge_ip}/24", name_a=edge.uplink)
        run(["ip", "route", "replace", "default", "via", edge.carrier_edge_ip], ns=edge.ns)
        run(["ethtool", "-K", edge.uplink, "tx", "on"], ns=edge.ns)

    def uplink_carrier(self, edge: Edge, on: bool) -> None:
        """The first uplink loses its carrier (the carrier's end of the veth goes down),
        and what NetworkManager does then: the device is deactivated, its address and
        with it its default route removed, so the second uplink's route (metric 700)
        carries; ``on``: carrier back, address and the metric-100 default route again."""
        if not on:
            run(["ip", "link", "set", edge.uplink_peer, "down"], ns=edge.carrier)
            run(["ip", "addr", "flush", "dev", edge.uplink], ns=edge.ns)
            return
        run(["ip", "link", "set", edge.uplink_peer, "up"], ns=edge.carrier)
        run(["ip", "addr", "add", f"{edge.edge_ip}/24", "dev", edge.uplink], ns=edge.ns)
        run(["ip", "route", "replace", "default", "via", edge.carrier_edge_ip, "dev",
             edge.uplink, "metric", "100"], ns=edge.ns)

    def drop_address(self, edge: Edge) -> None:
        """The modem drops its data session: the uplink keeps its carrier (link up) but
        loses its address, and with it the connected and default routes."""
        run(["ip", "addr", "del", f"{edge.edge_ip}/24", "dev", edge.uplink], ns=edge.ns)

    def give_address(self, edge: Edge, host: int) -> None:
        """The modem's new data session: a (possibly new) address and the default route,
        as the modem manager / DHCP client sets them."""
        edge.host = host
        run(["ip", "addr", "add", f"{edge.edge_ip}/24", "dev", edge.uplink], ns=edge.ns)
        run(["ip", "route", "replace", "default", "via", edge.carrier_edge_ip], ns=edge.ns)

    def renumber_public(self, edge: Edge, host: int) -> str:
        """The carrier moves the edge to a new public address; the established tunnel flow
        keeps the old, now dead one (a carrier NAT's stale mapping). Returns the new one."""
        from edgeheal.lab import carriernat

        if not edge.public_ip:
            raise LabError("this world has no carrier NAT (World(carrier_nat=True))")
        edge.public_ip = carriernat.renumber(self.sandbox, edge, edge.cloud_ip, WG_PORT,
                                             old=edge.public_ip, host=host)
        return edge.public_ip

    def nat_mappings(self, edge: Edge) -> list[str]:
        """The carrier's live translations of the edge's tunnel flows (``port->ip:port``)."""
        from edgeheal.lab import carriernat

        return carriernat.mappings(edge, edge.cloud_ip, WG_PORT)

    def nat_drift(self, edge: Edge, step: str) -> None:
        """Port drift at the carrier's NAT (the relay, :mod:`edgeheal.lab.faultynic`):
        ``remap`` the edge's flow to a new random public port, forgetting the old one;
        ``drift`` the cloud's side of the flow to a random port as the edge sees it;
        ``forget`` the drifted mappings (flannel-io/flannel#1770's dead pair)."""
        signals = {"remap": signal.SIGUSR1, "drift": signal.SIGUSR2, "forget": signal.SIGHUP}
        if step not in signals:
            raise LabError(f"nat_drift: unknown step {step!r} (one of {', '.join(signals)})")
        if edge.relay is None or edge.relay.poll() is not None:
            raise LabError(f"{edge.name}: the carrier's relay is not running")
        edge.relay.send_signal(signals[step])

    def edge_endpoint(self, edge: Edge) -> str:
        """Where the edge sends its tunnel packets for the cloud (configured, or learned
        by roaming)."""
        out = run(["wg", "show", edge.wg_ifname, "endpoints"], ns=edge.ns,
                  check=False).stdout
        for line in out.splitlines():
            key, _, value = line.partition("\t")
            if key == self.cloud_public:
                return value.strip()
        return ""

    def listen_port(self, edge: Edge) -> int:
        """The edge's WireGuard listen port, as ``wg show`` says."""
        out = run(["wg", "show", edge.wg_ifname, "listen-port"], ns=edge.ns,
                  check=False).stdout.strip()
        return int(out) if out.isdigit() else 0

    def cloud_endpoint(self, edge: Edge) -> str:
        """Where the cloud sends this edge's tunnel packets (learned by roaming)."""
        out = run(["wg", "show", self.cloud_wg, "endpoints"], ns=self.cloud,
                  check=False).stdout
        for line in out.splitlines():
            key, _, value = line.partition("\t")
            if key == edge.public_key:
                return value.strip()
        return ""

    def uplink_down(self, edge: Edge, down: bool) -> None:
        """Drop everything on the edge's uplink (in the carrier), or lift that."""
        if down:
            self.sandbox.nft(edge.carrier, "table inet lab_outage {\n" + "".join(
                f" chain {hook} {{ type filter hook {hook} priority -10; policy drop; }}\n"
                for hook in ("forward", "input", "output")) + "}\n")
        else:
            run(["nft", "delete", "table", "inet", "lab_outage"], ns=edge.carrier,
                check=False)

    def path_mtu(self, edge: Edge, limit: int | None) -> None:
        """The carrier's link towards the cloud shrinks: tunnel packets over ``limit``
        bytes (outer IP) vanish and no ICMP "fragmentation needed" comes back, both ways
        (a black-holing carrier tunnel); None lifts it. Every tunnel packet reaches the
        relay with dport 51820, whichever its direction."""
        if limit is None:
            run(["nft", "delete", "table", "inet", "lab_pmtu"], ns=edge.carrier, check=False)
            return
        self.sandbox.nft(edge.carrier, "table inet lab_pmtu {\n chain inp {\n"
                         "  type filter hook input priority -10;\n"
                         f"  udp dport {WG_PORT} ip length > {limit} drop\n"
                         " }\n chain out {\n  type filter hook output priority -10;\n"
                         "  icmp type destination-unreachable icmp code frag-needed drop\n"
                         " }\n}\n")

    def loss(self, edge: Edge, percent: int | None) -> None:
        """Random loss on the tunnel's UDP through the carrier (None lifts it)."""
        if percent is None:
            run(["nft", "delete", "table", "inet", "lab_loss"], ns=edge.carrier, check=False)
            return
        # every tunnel packet reaches the relay with dport 51820, whichever its direction
        self.sandbox.nft(edge.carrier, "table inet lab_loss {\n chain inp {\n"
                         "  type filter hook input priority -10;\n"
                         f"  udp dport {WG_PORT} numgen random mod 100 < {percent} drop\n"
                         " }\n}\n")

    def tunnel_blackhole(self, edge: Edge, on: bool) -> None:
        """The carrier drops every tunnel packet, both directions (every one reaches the
        relay with dport 51820); the direct path still works."""
        if on:
            self.sandbox.nft(edge.carrier, "table inet lab_blackhole {\n chain inp {\n"
                             "  type filter hook input priority -10;\n"
                             f"  udp dport {WG_PORT} drop\n }}\n}}\n")
        else:
            run(["nft", "delete", "table", "inet", "lab_blackhole"], ns=edge.carrier,
                check=False)

    def power_off(self, edge: Edge) -> None:
        """A neighbour that is switched off: its agent, collector and tunnel stop."""
        for proc in (edge.agent, edge.collector, edge.wg_process):
            if proc is not None:
                stop_process(proc)
        run(["ip", "link", "set", edge.uplink, "down"], ns=edge.ns, check=False)
