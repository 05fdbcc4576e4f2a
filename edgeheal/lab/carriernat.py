"""A carrier-grade NAT that keeps stale mappings: the lab's ``stale-nat`` scenarios.

What the field does (issue 30: opnsense/core#9066 — an LTE modem behind CGNAT —,
ThisSeanZhang/landscape#214, WireGuard/wireguard-vyatta-ubnt#47): the carrier maps the
subscriber's flows onto a public address. When it moves the subscriber to another public
address, new flows get the new one, but a flow that already has a mapping keeps it as long
as packets refresh it — and WireGuard's persistent keepalive refreshes the flow of port
51820 every K seconds, so it never ages out. The old public address no longer routes back
to the subscriber: the node sends, the cloud answers into the void, the tunnel is silently
dead. A new source port is a new flow and gets the new address.

How the lab does it, with the kernel's own NAT (in the carrier namespace, where the
faulty-NIC relay sends the edge's tunnel packets on towards the cloud,
:mod:`edgeheal.lab.faultynic`): the relay's flows to the cloud's WireGuard port are
source-NATed (an nftables ``snat`` rule in ``table ip lab_cgnat``) to the edge's public
address, an extra address on the carrier's cloud-facing link. Conntrack binds a flow's
translation at its first packet and keeps it for the flow's life (UDP: refreshed by every
packet); ``snat`` entries, unlike ``masquerade`` ones, are not flushed when the address
goes away. :func:`renumber` moves the public address: the new one is added and the rule
now says it, the old one is removed and whatever the cloud sends to it is dropped in
``prerouting`` before conntrack (the carrier routes that address to someone else now).
The relay keeps one mapping — one socket, one flow — per edge source address *and* port,
as a NAT does: the edge's packets from port 51820 stay on the stale flow (a Flannel restart
re-creates the device on 51820: same flow), and packets from a new port open a new flow,
which the rule maps to the new address.

Lab code: it runs ``ip`` and ``nft`` in the lab's namespaces; the agent never does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeheal.lab.netns import LabError, run

if TYPE_CHECKING:
    from edgeheal.lab.netns import Sandbox
    from edgeheal.lab.world import Edge

TABLE = "lab_cgnat"
FIRST_HOST = 10
"""The edge's first public address is ``10.61.<i>.10`` on the carrier's cloud link."""


def public_ip(edge: Edge, host: int) -> str:
    return f"10.61.{edge.index}.{host}"


def _cloud_link(edge: Edge) -> str:
    """The carrier's interface towards the cloud (the one holding ``carrier_cloud_ip``)."""
    out = run(["ip", "-o", "-4", "addr", "show"], ns=edge.carrier).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == edge.carrier_cloud_ip:
            return fields[1]
    raise LabError(f"{edge.carrier}: no interface holds {edge.carrier_cloud_ip}")


def _ruleset(edge: Edge, cloud_ip: str, port: int, public: str, old: str | None) -> str:
    drop = (f" chain gone {{\n  type filter hook prerouting priority -300; policy accept;\n"
            f"  ip daddr {old} drop\n }}\n") if old else ""
    return (f"table ip {TABLE} {{\n chain post {{\n"
            "  type nat hook postrouting priority srcnat; policy accept;\n"
            f"  ip saddr {edge.carrier_cloud_ip} ip daddr {cloud_ip} udp dport {port} "
            f"snat to {public}\n }}\n{drop}}}\n")


def install(sandbox: Sandbox, edge: Edge, cloud_ip: str, port: int) -> str:
    """Map the relay's flows to the cloud's ``port`` onto the edge's first public address
    (before the relay sends anything: a flow seen before the rule keeps no translation)."""
    public = public_ip(edge, FIRST_HOST)
    run(["ip", "addr", "add", f"{public}/24", "dev", _cloud_link(edge)], ns=edge.carrier)
    sandbox.nft(edge.carrier, _ruleset(edge, cloud_ip, port, public, None))
    return public


def renumber(sandbox: Sandbox, edge: Edge, cloud_ip: str, port: int, *, old: str,
             host: int) -> str:
    """The carrier moves the edge to a new public address; established flows keep the old
    one (their conntrack entries), which no longer reaches the edge."""
    new = public_ip(edge, host)
    link = _cloud_link(edge)
    run(["ip", "addr", "add", f"{new}/24", "dev", link], ns=edge.carrier)
    run(["nft", "delete", "table", "ip", TABLE], ns=edge.carrier)
    sandbox.nft(edge.carrier, _ruleset(edge, cloud_ip, port, new, old))
    run(["ip", "addr", "del", f"{old}/24", "dev", link], ns=edge.carrier)
    return new


def mappings(edge: Edge, cloud_ip: str, port: int) -> list[str]:
    """The carrier's translations of the relay's UDP flows to the cloud's ``port``, as
    ``relay_port->public:port`` (the kernel's conntrack table of the carrier namespace)."""
    out = run(["cat", "/proc/net/nf_conntrack"], ns=edge.carrier, check=False).stdout
    found = []
    for line in out.split("\n"):
        words = line.split()
        if "udp" not in words:
            continue
        keys = [w.split("=", 1) for w in words if "=" in w]
        src = [v for k, v in keys if k == "src"]
        dst = [v for k, v in keys if k == "dst"]
        sport = [v for k, v in keys if k == "sport"]
        dport = [v for k, v in keys if k == "dport"]
        if len(src) == 2 and dst[0] == cloud_ip and dport[0] == str(port) \
                and src[0] == edge.carrier_cloud_ip:
            found.append(f"{sport[0]}->{dst[1]}:{dport[1]}")
    return found
