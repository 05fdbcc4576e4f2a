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

Why the monotonic bookkeeping: the device reports the last handshake as *wall-clock* time.
An edge box's clock steps at NTP sync (often minutes, after a cold boot years), so
``time.time() - last_handshake`` can fake a dead tunnel or hide one. The check therefore
notes, on ``ctx.clock``, *when the reported timestamp changed* and measures ages from
that; the wall clock is used once, to place a handshake within the interval in which it was
first seen (clamped into that interval, so a step moves nothing by more than one interval).
rx/tx growth windows are kept the same way.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgeheal import checks
from edgeheal.model import CheckResult, CheckStatus, Context, Kind, State
from edgeheal.wg.model import (
    DeviceStats,
    NoSuchDevice,
    PeerStats,
    PermissionDenied,
    WireGuardError,
    is_public_key,
)

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from edgeheal.config import CheckSettings, WireguardSettings

log = logging.getLogger(__name__)

NAME = "wireguard"

# WireGuard protocol constants (wireguard-go device/constants.go, Linux messages.h).
REKEY_AFTER_TIME = 120.0
REJECT_AFTER_TIME = 180.0
REKEY_TIMEOUT = 5.0
KEEPALIVE_TIMEOUT = 10.0
"""Passive keepalive: without persistent keepalive, a peer answers data within 10 s."""
STALL_FACTOR = 2.5
STALL_SLACK = 5.0
"""Seconds added to ``STALL_FACTOR x K`` (REKEY_TIMEOUT): late timers are not a stall."""
UNANSWERED_ATTEMPTS = 3
"""Rekey attempts (5 s apart) that must go unanswered before ``rekey_failing``."""

REASONS: Mapping[str, State] = {
    "ok": State.OK,
    "rekey_failing": State.DEGRADED,
    "stalled": State.FAILED,
    "dead": State.FAILED,
    "never_connected": State.FAILED,
    "connecting": State.UNKNOWN,
    "interface_missing": State.FAILED,
    "no_peers": State.FAILED,
    "permission_denied": State.UNKNOWN,
    "read_error": State.UNKNOWN,
}
PEER_REASONS = ("ok", "rekey_failing", "stalled", "dead", "never_connected", "connecting")


# --- thresholds -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Thresholds:
    """The numbers one peer is judged by (seconds)."""

    rekey_failing_after: float
    dead_after: float
    rx_stall_after: float | None
    """None: the peer has no persistent keepalive, so a silent peer proves nothing."""
    connect_grace: float


def thresholds(settings: WireguardSettings, keepalive: int) -> Thresholds:
    """Resolve ``"auto"`` from the protocol constants and the peer's keepalive interval.

    A healthy keepalive-only tunnel rekeys on the initiator's first send after 120 s, so its
    handshake age peaks near 120 s + K; three unanswered 5 s retries past that is
    ``rekey_failing``. Past 180 s the session is refused, + K for the last keepalive that
    would have proved otherwise. Both ends send at least every K, so rx flat for 2.5 x K is
    two missed keepalives plus jitter; + REKEY_TIMEOUT of slack, because on a loaded box
    (the test machines under a parallel suite) keepalive timers run seconds late.
    """
    k = float(keepalive) if keepalive > 0 else KEEPALIVE_TIMEOUT
    rekey = settings.rekey_failing_after
    dead = settings.dead_after
    stall = settings.rx_stall_after
    return Thresholds(
        rekey_failing_after=(REKEY_AFTER_TIME + k + UNANSWERED_ATTEMPTS * REKEY_TIMEOUT
                             if rekey == "auto" else float(rekey)),
        dead_after=REJECT_AFTER_TIME + k if dead == "auto" else float(dead),
        rx_stall_after=(None if keepalive <= 0
                        else STALL_FACTOR * keepalive + STALL_SLACK if stall == "auto"
                        else float(stall)),
        connect_grace=settings.connect_grace,
    )


# --- per-peer history (pure) ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PeerHistory:
    """What we remember of one peer between runs. All times are monotonic seconds."""

    first_seen: float
    last_seen: float
    reported_handshake: float | None
    """The device's last value (wall clock), compared only for *change*."""
    handshake_at: float | None
    """Monotonic estimate of the latest handshake; None = never."""
    rx: int
    tx: int
    rx_grew_at: float
    tx_at_rx_growth: int
    tx_at_handshake: int
    keepalive: int

    def handshake_age(self, now: float) -> float | None:
        return None if self.handshake_at is None else max(0.0, now - self.handshake_at)


def observe(prev: PeerHistory | None, peer: PeerStats, *, now: float,
            wall: float) -> PeerHistory:
    """Fold one reading of a peer into its history (pure: ``now``/``wall`` are passed in)."""
    reported = peer.last_handshake
    if prev is None or (prev.reported_handshake is not None and reported is None):
        # New peer, or the device was re-created (handshake back to "never"): start over.
        return PeerHistory(
            first_seen=now, last_seen=now, reported_handshake=reported,
            handshake_at=None if reported is None else now - max(0.0, wall - reported),
            rx=peer.rx_bytes, tx=peer.tx_bytes, rx_grew_at=now,
            tx_at_rx_growth=peer.tx_bytes, tx_at_handshake=peer.tx_bytes,
            keepalive=peer.persistent_keepalive)
    handshake_at, tx_at_handshake = prev.handshake_at, prev.tx_at_handshake
    if reported != prev.reported_handshake and reported is not None:
        # A new handshake happened since the last run: place it by the wall clock but
        # never outside (last run, now], so a clock step cannot move it further.
        estimate = now - max(0.0, wall - reported)
        handshake_at = min(now, max(prev.last_seen, estimate))
        tx_at_handshake = peer.tx_bytes
    rx_grew_at, tx_at_rx_growth = prev.rx_grew_at, prev.tx_at_rx_growth
    if peer.rx_bytes != prev.rx or peer.tx_bytes < prev.tx:
        # rx grew (or the counters were reset with the device): the window restarts.
        rx_grew_at, tx_at_rx_growth = now, peer.tx_bytes
    tx_at_handshake = min(tx_at_handshake, peer.tx_bytes)
    return PeerHistory(
        first_seen=prev.first_seen, last_seen=now, reported_handshake=reported,
        handshake_at=handshake_at, rx=peer.rx_bytes, tx=peer.tx_bytes,
        rx_grew_at=rx_grew_at, tx_at_rx_growth=tx_at_rx_growth,
        tx_at_handshake=tx_at_handshake, keepalive=peer.persistent_keepalive)


def classify(hist: PeerHistory, now: float, limits: Thresholds) -> tuple[str, str]:
    """(reason, human explanation) for one peer. Pure; the table is in the module doc."""
    age = hist.handshake_age(now)
    if age is None:
        waited = now - hist.first_seen
        if waited < limits.connect_grace:
            return "connecting", (f"no handshake yet ({waited:.0f}s of "
                                  f"{limits.connect_grace:g}s grace)")
        return "never_connected", f"no handshake in {waited:.0f}s since the peer appeared"
    # Without persistent keepalive an idle peer legitimately stops handshaking: its age
    # only means something while we are trying to send to it.
    trying = hist.keepalive > 0 or hist.tx > hist.tx_at_handshake
    if trying and age >= limits.dead_after:
        return "dead", (f"last handshake {age:.0f}s ago (> {limits.dead_after:g}s): "
                        "the session has expired")
    silent = now - hist.rx_grew_at
    # While a rekey is due, the initiator's handshake retries (every 5 s) re-arm its
    # persistent-keepalive timer, so it sends no keepalives: on the responder rx goes flat
    # although the session still works. Until the session expires, a stall that began
    # once the rekey was due is the rekey's problem, reported by the age rules below.
    rekeying = (hist.handshake_at is not None and age < REJECT_AFTER_TIME
                and hist.rx_grew_at - hist.handshake_at >= REKEY_AFTER_TIME - REKEY_TIMEOUT)
    if (limits.rx_stall_after is not None and silent >= limits.rx_stall_after
            and hist.tx > hist.tx_at_rx_growth and not rekeying):
        return "stalled", (f"nothing received for {silent:.0f}s while sending "
                           f"(> {limits.rx_stall_after:g}s)")
    if trying and age >= limits.rekey_failing_after:
        return "rekey_failing", (
            f"last handshake {age:.0f}s ago (> {limits.rekey_failing_after:g}s): rekey "
            f"attempts unanswered; the session expires at {REJECT_AFTER_TIME:g}s")
    if not trying:
        return "ok", f"idle; last handshake {age:.0f}s ago"
    return "ok", f"last handshake {age:.0f}s ago"


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


def _endpoint_ip(endpoint: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not endpoint:
        return None
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return None


def listed_peers(device: DeviceStats, entries: Iterable[str]) -> set[str]:
    """Public keys of peers named by key, or whose endpoint address is in a listed CIDR."""
    keys = {e for e in entries if is_public_key(e)}
    nets = _networks(e for e in entries if e not in keys)
    chosen = set()
    for peer in device.peers:
        ip = _endpoint_ip(peer.endpoint)
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
                 wall: Callable[[], float] = time.time,
                 resolve: Callable[[str], Awaitable[list[str]]] | None = None) -> None:
        self.ctx = ctx
        self._resolve = resolve or _resolve
        self.settings: CheckSettings = ctx.config.wireguard
        self._settings: WireguardSettings = ctx.config.wireguard
        self._reader = reader
        self._wall = wall
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


checks.register(checks.Registration(
    NAME, factory, names=lambda config: (NAME,) if config.wireguard.interfaces else (),
    doc=__doc__ or "", kinds=KINDS, alert=_alert))

__all__ = ["REASONS", "PeerHistory", "Thresholds", "WireguardCheck", "classify", "observe",
           "route_peers", "thresholds"]

