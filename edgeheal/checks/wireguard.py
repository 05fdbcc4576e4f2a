"""Check ``wireguard``: are the tunnel peers on the path to the cloud still handshaking?

Flannel never checks its WireGuard peers (its ``/healthz`` always says OK), and the usual
"handshake older than 3-5 minutes" alarm fires minutes after the tunnel died. This check
reads every peer of each configured interface (:mod:`edgeheal.wg`, no ``wg`` subprocess),
keeps a little history per peer on the monotonic clock, and classifies each peer with the
protocol's own timers (REKEY_AFTER_TIME 120 s, REKEY_TIMEOUT 5 s, REJECT_AFTER_TIME 180 s)
and the peer's persistent-keepalive interval *K*.

Reasons (closed table; each maps to exactly one state)::

    reason             state     meaning
    ok                 ok        handshakes current, rx growing (or the peer is idle)
    rekey_failing      degraded  handshake older than rekey_failing_after (auto:
                                 120 s + K + 3 x 5 s): rekey attempts go unanswered while
                                 the session still works; it dies at 180 s (the incident)
    stalled            failed    rx flat for rx_stall_after (auto: 2.5 x K + 5 s) while tx grows,
                                 on a peer with keepalive: nothing comes back (a stall
                                 that began once a rekey was due counts only after 180 s:
                                 the peer's rekey retries suppress its keepalives)
    dead               failed    handshake older than dead_after (auto: 180 s + K): the
                                 session is refused by both ends
    never_connected    failed    no handshake ever, connect_grace after the peer appeared
    connecting         unknown   no handshake yet, still within connect_grace
    interface_missing  failed    none of the configured interfaces exists
    no_peers           failed    no watched peer is configured on the device(s)
    permission_denied  unknown   the reader lacks the privilege (CAP_NET_ADMIN / root)
    read_error         unknown   a device answered something unparseable, or not in time

The check's result is the worst *watched* peer (see ``watch_peers``); every peer, watched
or not, is listed in ``detail`` with its own reason, so a powered-off edge box elsewhere in
Flannel's full mesh is visible but never makes this node restart its Flannel.

The per-peer judgement (history on the monotonic clock, thresholds, reasons) is the pure
health model in :mod:`edgeheal.wg.health`, shared with ``edgeheal diagnose``; this module
reads the devices, chooses the watched peers, keeps the history between runs, and turns
the peers' reasons into one result, log lines and metrics.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeheal import checks
from edgeheal.model import CheckResult, CheckStatus, Context, Kind, State
from edgeheal.wg.health import REASONS, PeerHistory, classify, observe, thresholds
from edgeheal.wg.model import (
    DeviceStats,
    NoSuchDevice,
    PermissionDenied,
    WireGuardError,
    endpoint_address,
    is_public_key,
)

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from edgeheal.config import CheckSettings, Config, WireguardSettings

log = logging.getLogger(__name__)

NAME = "wireguard"


# --- which peers matter -----------------------------------------------------------------

def _networks(cidrs: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = []
    for cidr in cidrs:
        try:
            nets.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            log.debug("ignoring unparseable allowed IP %r", cidr)
    return nets


def route_peers(device: DeviceStats,
                addresses: Iterable[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> set[str]:
    """Public keys of the peers WireGuard would send ``addresses`` to (longest prefix
    match over all peers' allowed IPs: cryptokey routing)."""
    tables = [(p.public_key, _networks(p.allowed_ips)) for p in device.peers]
    chosen = set()
    for addr in addresses:
        best: tuple[int, str] | None = None
        for key, nets in tables:
            for net in nets:
                if addr.version == net.version and addr in net and (
                        best is None or net.prefixlen > best[0]):
                    best = (net.prefixlen, key)
        if best is not None:
            chosen.add(best[1])
    return chosen


def listed_peers(device: DeviceStats, entries: Iterable[str]) -> set[str]:
    """Public keys of peers named by key, or whose endpoint address is in a listed CIDR."""
    keys = {e for e in entries if is_public_key(e)}
    nets = _networks(e for e in entries if e not in keys)
    chosen = set()
    for peer in device.peers:
        ip = endpoint_address(peer.endpoint)
        if peer.public_key in keys or (ip is not None and any(
                ip.version == n.version and ip in n for n in nets)):
            chosen.add(peer.public_key)
    return chosen


# --- the check --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PeerView:
    """One peer's row in ``detail`` and in the metrics."""

    interface: str
    peer: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    handshake_age: float | None
    rx_bytes: int
    tx_bytes: int
    keepalive: int
    watched: bool
    reason: str
    message: str

    @property
    def state(self) -> State:
        return REASONS[self.reason]

    def to_json(self) -> dict[str, Any]:
        return {
            "interface": self.interface, "peer": self.peer, "endpoint": self.endpoint,
            "allowed_ips": list(self.allowed_ips),
            "handshake_age_seconds": (None if self.handshake_age is None
                                      else round(self.handshake_age, 1)),
            "rx_bytes": self.rx_bytes, "tx_bytes": self.tx_bytes,
            "persistent_keepalive": self.keepalive, "watched": self.watched,
            "reason": self.reason, "state": self.state.value, "message": self.message,
        }


Reader = Callable[[str], Any]
"""``async (ifname) -> DeviceStats`` raising :class:`edgeheal.wg.WireGuardError`."""


class WireguardCheck:
    """Observes the configured WireGuard interfaces; see the module docstring."""

    name = NAME

    def __init__(self, ctx: Context, *, reader: Reader | None = None,
                 wall: Callable[[], float] | None = None,
                 resolve: Callable[[str], Awaitable[list[str]]] | None = None) -> None:
        self.ctx = ctx
        self._resolve = resolve or _resolve
        self.settings: CheckSettings = ctx.config.wireguard
        self._settings: WireguardSettings = ctx.config.wireguard
        self._reader = reader
        # Epoch seconds, only to place a reported handshake (see edgeheal.wg.health).
        self._wall = wall or (lambda: ctx.wall().timestamp())
        self._history: dict[tuple[str, str], PeerHistory] = {}
        self._views: tuple[PeerView, ...] = ()
        self._resolved: tuple[float, list[Any]] | None = None
        self._reasons: dict[tuple[str, str], str] = {}

    # metrics ---------------------------------------------------------------------------
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (  # noqa: PLC0415 - only on scrape
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        labels = ["interface", "peer"]
        age = GaugeMetricFamily(
            "edgeheal_wireguard_handshake_age_seconds",
            "Seconds since the peer's latest handshake (monotonic; absent: never).", labels=labels)
        rx = CounterMetricFamily("edgeheal_wireguard_receive_bytes",
                                 "Bytes received from the peer, as the device counts them.",
                                 labels=labels)
        tx = CounterMetricFamily("edgeheal_wireguard_transmit_bytes",
                                 "Bytes sent to the peer, as the device counts them.",
                                 labels=labels)
        st = GaugeMetricFamily("edgeheal_wireguard_peer_state",
                               "1 for the peer's current state, 0 for the others.",
                               labels=[*labels, "state"])
        for v in self._views:
            if v.handshake_age is not None:
                age.add_metric([v.interface, v.peer], v.handshake_age)
            rx.add_metric([v.interface, v.peer], float(v.rx_bytes))
            tx.add_metric([v.interface, v.peer], float(v.tx_bytes))
            for state in State:
                st.add_metric([v.interface, v.peer, state.value],
                              1.0 if v.state is state else 0.0)
        yield from (age, rx, tx, st)

    # observing -------------------------------------------------------------------------
    async def _read(self, ifname: str) -> DeviceStats:
        if self._reader is not None:
            result: DeviceStats = await self._reader(ifname)
            return result
        from edgeheal.wg import read_device  # noqa: PLC0415

        return await read_device(ifname)

    async def _target_addresses(self) -> list[Any] | None:
        """Addresses of the tunnel-path MQTT targets; None when there are none."""
        hosts = [t.host for t in self.ctx.config.mqtt.targets if t.path == "tunnel"]
        if not hosts:
            return None
        now = self.ctx.clock()
        if self._resolved is not None and now - self._resolved[0] < 60.0:
            return self._resolved[1]
        addrs: list[Any] = []
        for host in hosts:
            try:
                addrs.append(ipaddress.ip_address(host))
                continue
            except ValueError:
                pass
            try:
                found = await self._resolve(host)
            except OSError as err:
                log.warning("cannot resolve tunnel target %s: %s", host, err,
                            extra={"check": NAME})
                continue
            addrs.extend(ipaddress.ip_address(a.split("%")[0]) for a in found)
        self._resolved = (now, addrs)
        return addrs

    async def _watched(self, device: DeviceStats) -> set[str]:
        spec = self._settings.watch_peers
        if isinstance(spec, tuple):
            return listed_peers(device, spec)
        addrs = await self._target_addresses()
        if not addrs:  # no tunnel-path target, or none resolvable (logged): all peers
            return {p.public_key for p in device.peers}
        return route_peers(device, addrs)

    async def run(self) -> CheckResult:
        now, wall = self.ctx.clock(), self._wall()
        devices: list[DeviceStats] = []
        problems: dict[str, tuple[str, str]] = {}
        missing: list[str] = []
        for ifname in self._settings.interfaces:
            try:
                devices.append(await self._read(ifname))
            except NoSuchDevice as err:
                log.debug("skipping %s: %s", ifname, err.problem,
                          extra={"check": NAME, "interface": ifname})
                missing.append(ifname)
            except PermissionDenied as err:
                problems[ifname] = ("permission_denied", str(err))
            except WireGuardError as err:
                problems[ifname] = ("read_error", str(err))

        views: list[PeerView] = []
        seen: set[tuple[str, str]] = set()
        for device in devices:
            watched = await self._watched(device)
            for peer in device.peers:
                key = (device.interface, peer.public_key)
                seen.add(key)
                hist = observe(self._history.get(key), peer, now=now, wall=wall)
                self._history[key] = hist
                reason, message = classify(hist, now, thresholds(
                    self._settings, peer.persistent_keepalive))
                views.append(PeerView(
                    interface=device.interface, peer=peer.fingerprint,
                    endpoint=peer.endpoint, allowed_ips=peer.allowed_ips,
                    handshake_age=hist.handshake_age(now), rx_bytes=peer.rx_bytes,
                    tx_bytes=peer.tx_bytes, keepalive=peer.persistent_keepalive,
                    watched=peer.public_key in watched, reason=reason, message=message))
                self._log_change(key, views[-1])
        for key in set(self._history) - seen:
            del self._history[key]
            self._reasons.pop(key, None)
        self._views = tuple(views)
        return self._result(devices, views, problems, missing)

    def _log_change(self, key: tuple[str, str], view: PeerView) -> None:
        """One log line when a peer's reason changes (a new healthy peer: debug only)."""
        previous = self._reasons.get(key)
        if previous == view.reason:
            return
        self._reasons[key] = view.reason
        if view.state is not State.OK:
            level = logging.WARNING
        else:
            level = logging.DEBUG if previous is None else logging.INFO
        log.log(level, "peer %s on %s: %s (%s)", view.peer, view.interface, view.reason,
                view.message,
                extra={"check": NAME, "interface": view.interface, "peer": view.peer})

    def _result(self, devices: list[DeviceStats], views: list[PeerView],
                problems: dict[str, tuple[str, str]], missing: list[str]) -> CheckResult:
        detail: dict[str, Any] = {
            "interfaces": {d.interface: {"reader": d.reader, "listen_port": d.listen_port,
                                         "peers": len(d.peers)} for d in devices},
            "missing": missing,
            "errors": {i: msg for i, (_, msg) in problems.items()},
            "watch_peers": ("auto" if self._settings.watch_peers == "auto"
                            else list(self._settings.watch_peers)),
            "peers": [v.to_json() for v in views],
        }
        if not devices:
            if problems:
                reason, _ = max(problems.values(), key=lambda p: p[0] == "permission_denied")
                text = "; ".join(msg for _, msg in problems.values())
                return CheckResult(REASONS[reason], reason, text, detail)
            return CheckResult(State.FAILED, "interface_missing",
                               "none of the WireGuard interfaces exists: "
                               + ", ".join(self._settings.interfaces), detail)
        watched = [v for v in views if v.watched]
        candidates: list[tuple[State, str, str]] = [
            (REASONS[r], r, m) for r, m in problems.values()]
        if not watched:
            names = ", ".join(d.interface for d in devices)
            tunnel = [t.host for t in self.ctx.config.mqtt.targets if t.path == "tunnel"]
            if self._settings.watch_peers == "auto" and tunnel:
                text = (f"no peer on {names} routes the tunnel-path MQTT target(s) "
                        f"{', '.join(tunnel)}")
            else:
                text = f"no watched peer is configured on {names}"
            candidates.append((State.FAILED, "no_peers",
                               f"{text} ({len(views)} other peer(s))"))
        for v in watched:
            where = f"peer {v.peer} ({v.endpoint or 'no endpoint'}) on {v.interface}"
            candidates.append((v.state, v.reason, f"{where}: {v.message}"))
        worst = max(candidates, key=lambda c: c[0].rank)
        if worst[0] is State.OK:
            n = len(watched)
            return CheckResult(State.OK, "ok", f"{n} watched peer(s) handshaking "
                               f"({len(views) - n} other(s))", detail)
        bad = [c for c in candidates if c[0] is worst[0]]
        extra = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        return CheckResult(worst[0], worst[1], worst[2] + extra, detail)


async def _resolve(host: str) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def factory(ctx: Context) -> list[checks.Check]:
    settings = ctx.config.wireguard
    if not settings.interfaces:
        return []
    check = WireguardCheck(ctx)
    if settings.enabled:
        ctx.registry.register(check)
    return [check]


KINDS: dict[str, Kind] = {
    "wireguard.rekey_failing": Kind(
        "warning", "Handshakes are not being answered; the session still works for now.",
        problem=True),
    "wireguard.stalled": Kind(
        "critical", "Data is sent through the tunnel but nothing comes back.", problem=True),
    "wireguard.dead": Kind(
        "critical", "No handshake for longer than REJECT_AFTER_TIME: the tunnel carries "
        "nothing.", problem=True),
    "wireguard.failed": Kind(
        "critical", "The tunnel failed for a reason of Flannel's own state: `no_peers` (the "
        "device lost its peers), `never_connected` or `interface_missing`; `detail.reason` "
        "says which.", problem=True),
    "wireguard.recovered": Kind("info", "The tunnel works again (clears the problem)."),
}


def _alert(status: CheckStatus) -> tuple[str, str]:
    kind = f"wireguard.{status.reason}"
    if kind in KINDS and KINDS[kind].problem:
        return kind, "wireguard.recovered"
    if status.state is State.FAILED:
        return "wireguard.failed", "wireguard.recovered"
    return "check.failed", "check.recovered"


def _validate(config: Config) -> None:
    """``[wireguard]``: interface names, the peers to watch, and threshold order."""
    from edgeheal.config import ConfigError, format_duration  # noqa: PLC0415

    wg = config.wireguard
    if isinstance(wg.watch_peers, str) and wg.watch_peers != "auto":
        raise ConfigError("wireguard.watch_peers",
                          "expected \"auto\" or a list of public keys and/or CIDRs")
    for i, name in enumerate(wg.interfaces):
        if not name or len(name) > 15 or "/" in name or any(c.isspace() for c in name):
            raise ConfigError(f"wireguard.interfaces[{i}]", f"not an interface name: {name!r}")
    if isinstance(wg.watch_peers, tuple):
        if not wg.watch_peers:
            raise ConfigError("wireguard.watch_peers",
                              "an empty list watches nothing; use \"auto\" or name peers")
        for i, entry in enumerate(wg.watch_peers):
            if is_public_key(entry):
                continue
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ConfigError(f"wireguard.watch_peers[{i}]",
                                  f"expected a base64 public key (44 characters) or an "
                                  f"endpoint CIDR, got {entry!r}") from None
    for key in ("rekey_failing_after", "dead_after", "rx_stall_after", "connect_grace"):
        value = getattr(wg, key)
        if isinstance(value, float) and value <= 0:
            raise ConfigError(f"wireguard.{key}", "must be greater than zero")
    if (isinstance(wg.rekey_failing_after, float) and isinstance(wg.dead_after, float)
            and wg.rekey_failing_after >= wg.dead_after):
        raise ConfigError("wireguard.rekey_failing_after",
                          f"must be less than dead_after ({format_duration(wg.dead_after)})")


checks.register(checks.Registration(
    NAME, factory, names=lambda config: (NAME,) if config.wireguard.interfaces else (),
    doc=__doc__ or "", kinds=KINDS, alert=_alert, validate=_validate))

__all__ = ["KINDS", "NAME", "PeerView", "WireguardCheck", "listed_peers", "route_peers"]

