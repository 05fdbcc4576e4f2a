"""Where the kernel really sends a connection: the DNAT conntrack recorded for it.

Why: on a K3s node the broker is a Service ClusterIP, which no interface holds and no
WireGuard peer's allowed IPs cover. kube-proxy (iptables, nftables and IPVS modes alike)
rewrites the destination to a pod address in the nat table, and conntrack records the
rewrite: an entry's *original* tuple has the ClusterIP as destination, its *reply* tuple
the pod address as source. :func:`destinations` asks the kernel for the entries whose
original destination is ``address:port`` (ctnetlink, ``IPCTNL_MSG_CT_GET`` dump with a
``CTA_FILTER`` on the original tuple, Linux >= 5.8; older kernels ignore the filter and the
entries are matched here) and returns what each was translated to. No API, no RBAC, no
subprocess: one netlink socket, opened for the question and closed after it, through the
light pyroute2 import (:mod:`edgeheal.boundaries.kernel.pyroute2_light`; pyroute2's
``nfctsocket`` module adds about 1 MB the first time, docs/wireguard.md has the figures).

Reading conntrack needs CAP_NET_ADMIN (the agent runs as root). Errors are
:class:`ConntrackError` with the kernel's words. ``netns`` (tests only) asks a named network
namespace instead of the agent's own.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass
from typing import Any

from edgeheal.boundaries.kernel import pyroute2_light as _pyroute2

log = logging.getLogger(__name__)

TCP_STATES = {1: "syn_sent", 2: "syn_recv", 3: "established", 4: "fin_wait",
              5: "close_wait", 6: "last_ack", 7: "time_wait", 8: "close", 9: "syn_sent2"}
"""ctnetlink's TCP conntrack states (``enum tcp_conntrack``)."""
GONE = frozenset({"time_wait", "close"})
"""States of a connection that is over: its translation may be an old pod's."""


class ConntrackError(Exception):
    """conntrack could not be asked (no privilege, no conntrack in this kernel, ...)."""


@dataclass(frozen=True, slots=True)
class Translation:
    """One conntrack entry towards the asked destination."""

    destination: str
    """Where the packets really go: the reply tuple's source (the pod address after a
    DNAT; the asked address itself when nothing translated it)."""
    port: int | None
    state: str
    """The TCP state (``established``, ``time_wait``, ...) or ``""`` for other protocols."""

    @property
    def live(self) -> bool:
        return self.state not in GONE


def _attr(msg: Any, *path: str) -> Any:
    for name in path:
        if msg is None:
            return None
        try:
            msg = msg.get_attr(name)
        except Exception:  # an entry without that attribute
            return None
    return msg


async def destinations(address: str, port: int | None = None, *,
                       netns: str | None = None) -> list[Translation]:
    """The translations conntrack holds for TCP connections to ``address`` (``:port``)."""
    ip = ipaddress.ip_address(address)
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    field = "CTA_IP_V4" if ip.version == 4 else "CTA_IP_V6"
    _pyroute2.light()
    ct = None
    try:
        from pyroute2.netlink.nfnetlink.nfctsocket import (  # lazy: only when asked
            AsyncNFCTSocket,
            NFCTAttrTuple,
        )

        ct = AsyncNFCTSocket(family, **({"netns": netns, "flags": 0} if netns else {}))
        wanted = NFCTAttrTuple(family=family, daddr=str(ip), proto=socket.IPPROTO_TCP,
                               dport=port)
        found = []
        async for msg in await ct.dump(tuple_orig=wanted):
            dst = _attr(msg, "CTA_TUPLE_ORIG", "CTA_TUPLE_IP", f"{field}_DST")
            dport = _attr(msg, "CTA_TUPLE_ORIG", "CTA_TUPLE_PROTO", "CTA_PROTO_DST_PORT")
            proto = _attr(msg, "CTA_TUPLE_ORIG", "CTA_TUPLE_PROTO", "CTA_PROTO_NUM")
            if dst is None or ipaddress.ip_address(dst) != ip or proto != socket.IPPROTO_TCP \
                    or (port is not None and dport != port):
                continue  # a kernel before 5.8 ignores the filter: match here
            real = _attr(msg, "CTA_TUPLE_REPLY", "CTA_TUPLE_IP", f"{field}_SRC")
            rport = _attr(msg, "CTA_TUPLE_REPLY", "CTA_TUPLE_PROTO", "CTA_PROTO_SRC_PORT")
            state = _attr(msg, "CTA_PROTOINFO", "CTA_PROTOINFO_TCP",
                          "CTA_PROTOINFO_TCP_STATE")
            if real is not None:
                found.append(Translation(str(real), None if rport is None else int(rport),
                                         TCP_STATES.get(int(state or 0), "")))
    except PermissionError as err:
        raise ConntrackError(f"reading conntrack needs CAP_NET_ADMIN: {err}") from err
    except ConntrackError:
        raise
    except Exception as err:
        raise ConntrackError(f"cannot read conntrack for {address}: {err}") from err
    finally:
        if ct is not None:
            ct.close()
    return found
