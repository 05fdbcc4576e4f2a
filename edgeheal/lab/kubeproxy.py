"""What kube-proxy and Flannel put in a K3s node's nat table, as nftables rules for the lab.

A Service's ClusterIP is virtual: no interface holds it and no route leads to it. kube-proxy
(iptables, nftables or IPVS mode) rewrites the destination of traffic to ``ClusterIP:port``
to one of the Service's endpoints, a pod address, in the nat table through conntrack: the
``output`` hook for the node's own traffic, ``prerouting`` for traffic from its pods.
Only then does the kernel route the packet, into ``flannel-wg`` for a pod on another node.
Host traffic leaving into the overlay is masqueraded to the tunnel device's address:
Flannel's ``! -s <cluster CIDR> -d <cluster CIDR> -j MASQUERADE`` (flannel-io/flannel
``pkg/trafficmngr/iptables``, ``MasqRules``) and kube-proxy's own ``KUBE-POSTROUTING``
masquerade of the packets it marks.

The rules follow kube-proxy's nftables mode (kubernetes ``pkg/proxy/nftables/proxier.go``:
table ``kube-proxy``, chains ``nat-output`` at priority -100 on ``output`` and
``nat-prerouting`` on ``prerouting``, a ``services`` map from ``daddr . proto . dport`` to a
per-service chain that ``dnat to`` an endpoint); one endpoint per Service is enough for the
lab (kube-proxy picks one at random with ``numgen`` when there are several, and conntrack
keeps a connection on the one it got). :func:`rules` renders the script, :func:`install`
applies it in a namespace (the table goes with the namespace).

Lab code: it runs ``nft``; the agent never does.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from edgeheal.lab.netns import Sandbox

TABLE = "kube-proxy"
SERVICE_CIDR = "10.43.0.0/16"
"""K3s's default service CIDR (``--service-cidr``)."""
CLUSTER_CIDR = "10.42.0.0/16"
"""K3s's default cluster (pod) CIDR (``--cluster-cidr``): one /24 lease per node."""


@dataclass(frozen=True, slots=True)
class Service:
    """One ClusterIP Service port and the endpoint kube-proxy sends it to."""

    cluster_ip: str
    port: int
    endpoint: str
    """A pod address (in the cluster CIDR)."""
    target_port: int | None = None

    def __post_init__(self) -> None:
        for what, value in (("cluster_ip", self.cluster_ip), ("endpoint", self.endpoint)):
            try:
                ipaddress.IPv4Address(value)
            except ValueError:
                raise ValueError(f"Service {what}: not an IPv4 address: {value!r}") from None


def rules(services: list[Service], *, tunnel: str | None,
          cluster_cidr: str = CLUSTER_CIDR) -> str:
    """The nftables script: DNAT on ``output`` and ``prerouting``, and (``tunnel``: the
    overlay device) the masquerade of non-pod sources into the overlay."""
    elements = ", ".join(f"{s.cluster_ip} . tcp . {s.port} : goto svc-{i}"
                         for i, s in enumerate(services))
    chains = "".join(
        f"  chain svc-{i} {{\n    meta l4proto tcp dnat to "
        f"{s.endpoint}:{s.target_port or s.port}\n  }}\n"
        for i, s in enumerate(services))
    masquerade = (f"    ip saddr != {cluster_cidr} ip daddr {cluster_cidr} "
                  f"oifname \"{tunnel}\" masquerade\n") if tunnel else ""
    services_map = (f"  map service-ips {{\n    type ipv4_addr . inet_proto . inet_service "
                    f": verdict\n    elements = {{ {elements} }}\n  }}\n") if services else ""
    lookup = "    ip daddr . meta l4proto . th dport vmap @service-ips\n" if services else ""
    return (
        f"table ip {TABLE}\ndelete table ip {TABLE}\n"
        f"table ip {TABLE} {{\n{services_map}{chains}"
        f"  chain nat-output {{\n    type nat hook output priority -100; policy accept;\n"
        f"{lookup}  }}\n"
        f"  chain nat-prerouting {{\n    type nat hook prerouting priority -100; "
        f"policy accept;\n{lookup}  }}\n"
        f"  chain nat-postrouting {{\n    type nat hook postrouting priority 100; "
        f"policy accept;\n{masquerade}  }}\n"
        "}\n")


def install(sandbox: Sandbox, ns: str, services: list[Service], *, tunnel: str | None,
            cluster_cidr: str = CLUSTER_CIDR) -> None:
    """Apply (or replace) the kube-proxy table in namespace ``ns``."""
    sandbox.nft(ns, rules(services, tunnel=tunnel, cluster_cidr=cluster_cidr))
