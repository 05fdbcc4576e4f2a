"""Check ``control``: does this node's K3s agent still reach its server?

Why: the data path (the tunnel, the broker over it) and the uplink can be fine while the
K3s agent has lost its server: after an outage its load balancer never reconnects and the
node stays NotReady until someone restarts ``k3s-agent`` (k3s-io/k3s#11349, #10506), the
kubelet stops renewing its Lease, or the node's address changed under it (PPPoE, LAN to
4G: k3s-io/k3s#2827). ``kubectl`` then shows the node NotReady and nothing on the node
says why. This check tells those apart from the one case that is not the agent's —
the server cannot be reached at all — cheaply (45 kB a healthy day; docs/control.md):

1. **Free local evidence, every run** (``interval``, 10 s): the kernel's TCP table
   (:mod:`edgeheal.boundaries.kernel.tcp_sockets`: two proc reads) — the connections to
   each of ``servers`` with their state, unacknowledged bytes and consecutive
   retransmits, the clients of the agent's local load balancer (``balancer``) — and the
   kubelet's ``/healthz`` on loopback (:mod:`edgeheal.boundaries.kube.kubelet`). No
   packet leaves the node.
2. **On suspicion** (the kubelet not healthy, no established connection to a server, or
   every one stalled: :func:`~edgeheal.checks.control.verdict.suspicious`) one TCP
   handshake to the servers, directly: none answers -> ``server_unreachable``, and no API
   read (it could not arrive).
3. **One API read** — the node's Lease in ``kube-node-lease`` and the Node
   (:mod:`edgeheal.boundaries.kube`, one TLS connection, closed after) — on suspicion, at
   most every ``api_spacing`` while in doubt, and at ``api_interval`` (3 h) otherwise.
   A Lease is stale as the node lifecycle controller judges it: the same ``renewTime``
   seen for longer than its ``leaseDurationSeconds`` by this agent's monotonic clock
   (never by comparing wall clocks).

Reasons (closed table; first match wins)::

    reason              state    meaning
    server_unreachable  failed   no server answers a direct TCP handshake: the path is
                                 down (the uplink's business; never a reason to restart
                                 the agent)
    node_ip_changed     failed   the Node's InternalIP (or Flannel's public-ip annotation,
                                 unless overridden) is no address of this node
    balancer_stuck      failed   the Lease is stale, the agent's load balancer has
                                 clients but no healthy connection to a server, and a
                                 server answers directly
    heartbeat_stale     failed   the Lease is stale while a server answers directly
    confirming          unknown  the local evidence is suspicious and the Lease was not
                                 yet seen renewed within its duration: reading again
    not_ready           failed   the Node's Ready is False/Unknown while its Lease is
                                 renewed
    api_unreadable      unknown  the API could not be read (timeout, 5xx, transport)
    forbidden           unknown  the agent's account may not read the Lease or the Node
                                 (k3s-manifests/rbac.yaml)
    not_found           unknown  no Lease (or Node) of this node's name
    no_evidence         unknown  suspicious, and the API not read yet, or not configured
                                 (without ``[kubernetes]`` the check has its local
                                 evidence and the handshake only: ``server_unreachable``
                                 or this)
    ok                  ok       healthy connections, or the Lease renewed and Ready

``ExternalIP`` is not compared: behind a carrier's NAT it is an address no interface
holds. ``tunnel_stuck`` (the server's node proxy answering remotedialer's "failed to find
Session") is not told: it needs ``nodes/proxy``, which also grants exec into every pod on
the node. Off unless configured (``[control]`` with ``servers``); not ``required``: the
control path does not gate the collectors' readiness.

Metrics: ``edgeheal_control_api_reads_total{result}`` (``ok``, ``error``) and
``edgeheal_control_server_connections{state}`` (``established``, ``stalled``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from typing import TYPE_CHECKING

from edgeheal import checks
from edgeheal.checks.control.verdict import (
    HEALABLE,
    REASONS,
    Local,
    Reading,
    judge,
    renewed,
    suspicious,
)
from edgeheal.model import CheckResult, CheckStatus, Context, Kind

if TYPE_CHECKING:
    from edgeheal.boundaries.kube import KubeClient
    from edgeheal.config import CheckSettings, Config, ControlSettings

log = logging.getLogger(__name__)

NAME = "control"
HEALTHZ_PATH = "/healthz"
HEALTHZ_TIMEOUT = 2.0


class _Metrics:
    def __init__(self, ctx: Context) -> None:
        from prometheus_client import Counter, Gauge

        self.reads = Counter("edgeheal_control_api_reads", "API reads (the node's Lease "
                             "and Node) the control check made, by result.", ["result"],
                             registry=ctx.registry)
        self.connections = Gauge("edgeheal_control_server_connections", "The K3s "
                                 "agent's TCP connections to its servers at the last run, "
                                 "by state (stalled: established, unacknowledged data "
                                 "retransmitted in a row).", ["state"], registry=ctx.registry)
        for result in ("ok", "error"):
            self.reads.labels(result)
        for state in ("established", "stalled"):
            self.connections.labels(state)


class ControlCheck:
    """The control path's observer; see the package docstring."""

    name = NAME

    def __init__(self, ctx: Context, *, proc_net: str = "/proc/self/net",
                 kube: KubeClient | None = None, exclude_uid: int | None = -1) -> None:
        """``proc_net``: whose TCP table (a test reads its namespace's through a process
        in it); ``kube``: the API client (default: one made from ``[kubernetes]``, never
        retrying: the check runs again anyway); ``exclude_uid``: sockets of this owner
        are not the agent's (default: the agent's own user, unless root — edgeheal runs as
        ``edgeheal``, K3s as root, so the remedies' and this check's own API connections
        never pass for the K3s agent's)."""
        from edgeheal.config import split_hostport

        self.ctx = ctx
        self.settings: CheckSettings = ctx.config.control
        self.control: ControlSettings = ctx.config.control
        self.metrics = _Metrics(ctx)
        self._proc_net = proc_net
        self._kube = kube
        if exclude_uid == -1:
            exclude_uid = os.getuid() or None
        self._exclude_uid = exclude_uid
        self._servers = [split_hostport(s) for s in self.control.servers]
        self._balancer = split_hostport(self.control.balancer)
        self._healthz = (split_hostport(self.control.kubelet_healthz)
                         if self.control.kubelet_healthz else None)
        self._endpoints: set[tuple[str, int]] = set()
        self._resolved_at: float | None = None
        self._reading: Reading | None = None
        self._seen: tuple[float, str] | None = None
        self._spacing = self.control.api_spacing
        self._basis: tuple[str, str] = ("", "")
        self._last_reason = ""

    # --- evidence -----------------------------------------------------------------------

    async def _resolve(self) -> None:
        """The servers' addresses (a name is resolved at start and at each API read, not
        every run: a DNS query every 10 s would cost more than the whole check)."""
        loop = asyncio.get_running_loop()
        found: set[tuple[str, int]] = set()
        for host, port in self._servers:
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as err:
                log.debug("cannot resolve %s: %s", host, err, extra={"check": NAME})
                continue
            found |= {(str(info[4][0]), port) for info in infos}
        if found:
            self._endpoints = found
        self._resolved_at = self.ctx.clock()

    async def _local(self) -> Local:
        from edgeheal.boundaries.kernel import tcp_sockets
        from edgeheal.boundaries.kube import kubelet

        kubelet_said = ""
        if self._healthz is not None:
            kubelet_said = await kubelet.healthz(*self._healthz, HEALTHZ_PATH,
                                                 min(HEALTHZ_TIMEOUT, self.control.timeout))
        try:
            ports = {port for _, port in self._endpoints} | {self._balancer[1]}
            rows = await asyncio.to_thread(tcp_sockets.table, self._proc_net, ports)
        except tcp_sockets.TcpTableError as err:
            return Local((), False, 0, kubelet_said, self.control.stall_retransmits,
                         table_error=str(err))
        if self._exclude_uid is not None:
            rows = [r for r in rows if r.uid != self._exclude_uid]
        balancer = self._balancer
        anywhere = ("0.0.0.0", "::")  # noqa: S104 - matching a listener, not binding
        listening = any(r.state == "listen" and r.local[1] == balancer[1]
                        and r.local[0] in (balancer[0], *anywhere) for r in rows)
        clients = sum(1 for r in rows if r.state == "established" and r.remote == balancer)
        return Local(tuple(tcp_sockets.to(rows, self._endpoints)), listening, clients,
                     kubelet_said, self.control.stall_retransmits)

    async def _direct(self) -> str:
        """One handshake to each server in turn until one answers."""
        from edgeheal.boundaries.kernel import tcp_sockets

        said = "no server configured"
        for host, port in self._servers:
            said = await tcp_sockets.handshake(host, port, self.control.connect_timeout)
            if said == "ok":
                return said
        return said

    def _client(self) -> KubeClient | None:
        if self._kube is None and self.ctx.config.kubernetes is not None:
            from edgeheal.boundaries.kube import KubeClient
            from edgeheal.boundaries.kube.client import ATTEMPT_FACTOR

            settings = self.ctx.config.kubernetes
            # no retry, and each call short enough that two fit in the run's timeout
            # (a call may take ATTEMPT_FACTOR request_timeouts)
            bound = self.control.timeout / (2 * ATTEMPT_FACTOR + 1)
            self._kube = KubeClient(dataclasses.replace(
                settings, retries=0,
                request_timeout=max(1.0, min(settings.request_timeout, bound))),
                wall=self.ctx.wall)
        return self._kube

    async def _read(self, now: float) -> Reading:
        from edgeheal.boundaries.kernel import tcp_sockets
        from edgeheal.boundaries.kube import KubeError, KubeNotFound, KubePermissionError

        node_name = self.ctx.config.node
        kube = self._client()
        if kube is None:
            return Reading(now, error="no [kubernetes] section: the Lease and the Node "
                           "cannot be read (the local evidence and the handshake only)",
                           error_reason="no_evidence")
        previous = self._reading
        try:
            lease = await kube.get_lease(node_name)
            node = await kube.get_node(node_name)
        except KubePermissionError as err:
            self.metrics.reads.labels("error").inc()
            return Reading(now, error=str(err), error_reason="forbidden")
        except KubeNotFound as err:
            self.metrics.reads.labels("error").inc()
            return Reading(now, error=str(err), error_reason="not_found")
        except KubeError as err:
            self.metrics.reads.labels("error").inc()
            return Reading(now, error=str(err), error_reason="api_unreadable")
        finally:
            await kube.close()  # the next read is minutes away: no idle TLS session
        self.metrics.reads.labels("ok").inc()
        self._seen, unchanged, moved = renewed(self._seen, now, lease.renew_time)
        fresh = moved and previous is not None and now - previous.at <= lease.duration
        try:
            local = await asyncio.to_thread(tcp_sockets.local_addresses, self._proc_net)
        except tcp_sockets.TcpTableError as err:
            return Reading(now, lease, node, unchanged, fresh,
                           error=f"cannot read this node's addresses: {err}",
                           error_reason="api_unreadable")
        return Reading(now, lease, node, unchanged, fresh, local_addresses=local)

    def _due(self, now: float, suspicion: str) -> bool:
        last = self._reading
        if last is None:
            return True
        age = now - last.at
        if age >= self.control.api_interval:
            return True
        doubt = bool(suspicion) or self._last_reason not in ("", "ok")
        spacing = self._spacing if suspicion == self._basis[1] else self.control.api_spacing
        return doubt and age >= spacing  # the local evidence changed: no backed-off wait

    def _space(self, reason: str, suspicion: str) -> None:
        """The next doubtful read's spacing: ``api_spacing`` while the picture changes;
        doubled (up to ``api_interval``) each time a read finds the same verdict on the
        same local evidence — a suspicion that keeps proving harmless, or a fault that
        persists (an hour of lost heartbeat costs 10 reads, not 180) — except while
        confirming, which needs its second read."""
        basis = (reason, suspicion)
        if reason != "confirming" and (basis == self._basis or (reason == "ok" and suspicion)):
            self._spacing = min(2 * self._spacing, self.control.api_interval)
        else:
            self._spacing = self.control.api_spacing
        self._basis = basis

    # --- the run ------------------------------------------------------------------------

    async def run(self) -> CheckResult:
        now = self.ctx.clock()
        if self._resolved_at is None or not self._endpoints:
            await self._resolve()
        local = await self._local()
        suspicion = suspicious(local)
        direct = ""
        due = self._due(now, suspicion)
        if suspicion and due:
            direct = await self._direct()
        if due and direct in ("", "ok"):
            await self._resolve()
            self._reading = await self._read(now)
        result = judge(local, direct, self._reading, suspicion=suspicion)
        if due:
            self._space(result.reason, suspicion)
        self._last_reason = result.reason
        self.metrics.connections.labels("established").set(len(local.established))
        self.metrics.connections.labels("stalled").set(len(local.stalled))
        return result

    async def close(self) -> None:
        if self._kube is not None:
            await self._kube.close()


def factory(ctx: Context) -> list[checks.Check]:
    return [ControlCheck(ctx)]


KINDS: dict[str, Kind] = {
    "control.heartbeat_stale": Kind(
        "critical", "The node's Lease is not renewed while its K3s server answers "
        "directly: the agent has lost its server (the node turns NotReady).", problem=True),
    "control.balancer_stuck": Kind(
        "critical", "The K3s agent's local load balancer accepts clients but reaches no "
        "server while the server answers directly (the stuck balancer of k3s-io/k3s#11349).",
        problem=True),
    "control.not_ready": Kind(
        "warning", "The Node's Ready condition is not True while its Lease is renewed "
        "(`detail.api.node.reason` says the kubelet's reason).", problem=True),
    "control.node_ip_changed": Kind(
        "critical", "The Node's InternalIP (or Flannel's public-ip) is no longer an address "
        "of this node: the agent must re-register (restart).", problem=True),
    "control.server_unreachable": Kind(
        "warning", "No K3s server answers a direct TCP handshake: the path to the control "
        "plane is down (an uplink matter; workloads keep running).", problem=True),
    "control.recovered": Kind("info", "The K3s agent reaches its server again and the node "
                              "heartbeats (clears the problem)."),
}


def _alert(status: CheckStatus) -> tuple[str, str]:
    kind = f"{NAME}.{status.reason}"
    if kind in KINDS:
        return kind, f"{NAME}.recovered"
    return "check.failed", "check.recovered"


def _validate(config: Config) -> None:
    from edgeheal.config import ConfigError, split_hostport

    if NAME not in config.sections or not config.control.enabled:
        return
    settings = config.control
    if not settings.servers:
        raise ConfigError("control.servers", "is required: the K3s servers' `host:port` "
                          "(the agent's --server, port 6443 by default)")
    for i, server in enumerate(settings.servers):
        try:
            split_hostport(server)
        except ValueError as err:
            raise ConfigError(f"control.servers[{i}]", str(err)) from None
    for key in ("balancer", "kubelet_healthz"):
        value = getattr(settings, key)
        if value or key == "balancer":
            try:
                split_hostport(value)
            except ValueError as err:
                raise ConfigError(f"control.{key}", str(err)) from None


def _names(config: Config) -> tuple[str, ...]:
    return (NAME,) if NAME in config.sections else ()


checks.register(checks.Registration(
    NAME, factory, names=_names, doc=__doc__ or "", kinds=KINDS, alert=_alert,
    validate=_validate, reasons=tuple(REASONS), reason_states=REASONS, role="control",
    vocabulary={"healable": HEALABLE}))

__all__ = ["KINDS", "NAME", "ControlCheck"]
