"""Check ``wireguard``: are the tunnel peers on the path to the cloud still handshaking?

Flannel never checks its WireGuard peers (its ``/healthz`` always says OK), and the usual
"handshake older than 3-5 minutes" alarm fires minutes after the tunnel died. This check
reads every peer of each configured interface (:mod:`edgeheal.boundaries.wg`, no ``wg`` subprocess),
keeps a little history per peer on the monotonic clock, and classifies each peer with the
protocol's own timers (REKEY_AFTER_TIME 120 s, REKEY_TIMEOUT 5 s, REJECT_AFTER_TIME 180 s)
and the peer's persistent-keepalive interval *K*.

Reasons (closed table; each maps to exactly one state)::

    reason             state     meaning
    ok                 ok        handshakes current, rx growing (or the peer is idle)
    rekey_failing      degraded  the rekey began (traffic moved once the handshake was
                                 120 s old) and 12 s later (3 attempts) no handshake; or,
                                 without such traffic, the handshake is older than
                                 rekey_failing_after (auto: 120 s + K + 3 x 5 s). The
                                 session still works; it dies at 180 s (the incident)
    stalled            failed    rx flat for rx_stall_after (auto: 2.5 x K + 5 s) while tx grows,
                                 on a peer with keepalive: nothing comes back (a stall
                                 that began once a rekey was due counts only after 180 s:
                                 the peer's rekey retries suppress its keepalives)
    send_failing       failed    on a peer with keepalive, nothing sent or received for
                                 send_fail_after (auto: K + 5 s), or tx flat that long
                                 while the peer's data went unanswered for 12 s, or tx
                                 flat for K + 15 s while only its keepalives arrive: a
                                 keepalive was due and could not leave; detail.cause says
                                 why (no_route, link_down, no_address, local,
                                 no_endpoint, unknown: edgeheal.boundaries.wg.egress)
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

Suspicion: the counters are read every run anyway, so a watched peer whose data got no
answer within 12 s (a peer answers data within KEEPALIVE_TIMEOUT), whose rx has been
silent, or whose tx has been flat, for K + 5 s, or whose rekey got no answer within 7 s,
is *suspect* (``detail.suspect``, each peer's ``suspicion``); so is a busy tunnel on which
nothing has moved either way for 4 s when rtnetlink, asked once per such silence, says the
uplink's address, route or link is gone (``uplink_gone``: a send failure leaves no other
trace in the counters before K + 5 s). The check then asks the
supervisor to run every enabled tunnel-path MQTT target now (``Context.hasten``): once when
the suspicion starts and again every :data:`HASTEN_EVERY` seconds while it lasts, at most
:data:`HASTEN_MAX` times per episode. A failed verdict (:data:`HASTEN_VERDICTS`:
``no_peers``, ``interface_missing``, ``dead``, ``stalled``, ``send_failing``,
``never_connected``) does the same, and starts a new episode when it follows a suspicion;
and the first ok result after such a verdict asks once more (the repair is confirmed, and
readiness and the remediator's verification follow at once).
A healthy tunnel is never suspect, so nothing extra happens in the steady state.

Metrics: per peer, ``edgeheal_wireguard_handshake_age_seconds``, ``..._receive_bytes_total``,
``..._transmit_bytes_total`` and ``..._peer_state{state}``, labelled ``interface``, ``peer``
(the key's first 8 characters) and ``watched``; only the watched peers unless
``[metrics] all_peers = true`` (a full mesh is N-1 peers on every node).

The per-peer judgement (history on the monotonic clock, thresholds, reasons) is the pure
health model in :mod:`edgeheal.boundaries.wg.health`, shared with ``edgeheal diagnose``; this module
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
from edgeheal.boundaries.wg.egress import UPLINK_CAUSES, Egress
from edgeheal.boundaries.wg.health import (
    REASONS,
    PeerHistory,
    classify,
    observe,
    quiet_after_data,
    suspicion,
    thresholds,
)
from edgeheal.boundaries.wg.readings import (
    DeviceStats,
    NoSuchDevice,
    PermissionDenied,
    WireGuardError,
    endpoint_address,
    is_public_key,
)
from edgeheal.model import CheckResult, CheckStatus, Context, Kind, State

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from edgeheal.config import CheckSettings, Config, WireguardSettings

log = logging.getLogger(__name__)

NAME = "wireguard"
HASTEN_EVERY = 5.0
"""Seconds between two requests to run the tunnel-path MQTT targets while a watched peer
stays suspect."""
HASTEN_MAX = 6
"""Requests per suspicion episode (the first included): 30 s of quick confirmations, then
the targets' own intervals (and their own re-probing while they fail) take over."""
LEARN_RETRY = 10.0
"""Seconds before the route lookup for an endpoint whose source address is still unknown
is tried again (the first found no route, as when the agent starts before the modem's
data session, or failed): without the source a later address loss reads as ``no_route``."""
UPLINK_GONE = frozenset({"no_address", "no_route", "link_down"})
"""Egress causes that make a busy tunnel's sudden silence a suspicion (``uplink_gone``)."""
HASTEN_VERDICTS = frozenset({"no_peers", "interface_missing", "dead", "stalled",
                             "send_failing", "never_connected"})
"""Failed verdicts that ask for the tunnel-path MQTT targets at once, like a suspicion:
the tunnel cannot carry them, so readiness should not wait for the probes' own interval."""


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
    suspicion: tuple[str, str] | None = None
    send_failure: dict[str, Any] | None = None

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
            "suspect": self.suspicion is not None,
            "suspicion": None if self.suspicion is None else {
                "signal": self.suspicion[0], "message": self.suspicion[1]},
            **({"send_failure": self.send_failure} if self.send_failure is not None else {}),
        }


Reader = Callable[[str], Any]
"""``async (ifname) -> DeviceStats`` raising :class:`edgeheal.boundaries.wg.WireGuardError`."""


class WireguardCheck:
    """Observes the configured WireGuard interfaces; see the module docstring."""

    name = NAME

    def __init__(self, ctx: Context, *, reader: Reader | None = None,
                 wall: Callable[[], float] | None = None,
                 resolve: Callable[[str], Awaitable[list[str]]] | None = None,
                 egress: Egress | None = None) -> None:
        self.ctx = ctx
        self._egress = egress or Egress()
        self._sources: dict[tuple[str, str], tuple[str | None, str | None, float]] = {}
        """(interface, peer) -> (endpoint, the source address the kernel chose for it, when
        asked), learned once per endpoint (retried while unknown): the evidence for
        ``no_address`` later."""
        self._suspect_since: float | None = None
        self._hastened: tuple[float, int] = (0.0, 0)
        self._verdict = False
        self._was_failed = False
        self._uplink: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}
        self._resolve = resolve or _resolve
        self.settings: CheckSettings = ctx.config.wireguard
        self._settings: WireguardSettings = ctx.config.wireguard
        self._reader = reader
        # Epoch seconds, only to place a reported handshake (see edgeheal.boundaries.wg.health).
        self._wall = wall or (lambda: ctx.wall().timestamp())
        self._history: dict[tuple[str, str], PeerHistory] = {}
        self._views: tuple[PeerView, ...] = ()
        self._resolved: tuple[float, list[Any]] | None = None
        self._reasons: dict[tuple[str, str], str] = {}

    # metrics ---------------------------------------------------------------------------
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (  # only on scrape
            CounterMetricFamily,
            GaugeMetricFamily,
        )

        labels = ["interface", "peer", "watched"]
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
        every = self.ctx.config.metrics.all_peers
        views = self._views  # on the render thread: the tuple run() replaces whole, read once
        for v in views:
            if not (v.watched or every):
                continue  # the rest of Flannel's mesh: in /status, not in the metrics
            key = [v.interface, v.peer, "true" if v.watched else "false"]
            if v.handshake_age is not None:
                age.add_metric(key, v.handshake_age)
            rx.add_metric(key, float(v.rx_bytes))
            tx.add_metric(key, float(v.tx_bytes))
            for state in State:
                st.add_metric([*key, state.value], 1.0 if v.state is state else 0.0)
        yield from (age, rx, tx, st)

    # observing -------------------------------------------------------------------------
    async def _read(self, ifname: str) -> DeviceStats:
        if self._reader is not None:
            result: DeviceStats = await self._reader(ifname)
            return result
        from edgeheal.boundaries.wg import read_device

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
                limits = thresholds(self._settings, peer.persistent_keepalive)
                if peer.persistent_keepalive > 0:
                    await self._learn(key, peer.endpoint)
                reason, message = classify(hist, now, limits)
                failure = None
                if reason == "send_failing":
                    failure = await self._why_not_sending(key, peer.endpoint)
                    message = f"{message}: {failure['cause']} ({failure['message']})"
                suspect = suspicion(hist, now, limits)
                if (suspect is None and reason == "ok" and peer.public_key in watched
                        and quiet_after_data(hist, now)):
                    suspect = await self._uplink_gone(key, peer.endpoint, hist)
                views.append(PeerView(
                    interface=device.interface, peer=peer.fingerprint,
                    endpoint=peer.endpoint, allowed_ips=peer.allowed_ips,
                    handshake_age=hist.handshake_age(now), rx_bytes=peer.rx_bytes,
                    tx_bytes=peer.tx_bytes, keepalive=peer.persistent_keepalive,
                    watched=peer.public_key in watched, reason=reason, message=message,
                    suspicion=suspect, send_failure=failure))
                self._log_change(key, views[-1])
        for key in set(self._history) - seen:
            del self._history[key]
            self._reasons.pop(key, None)
            self._sources.pop(key, None)
            self._uplink.pop(key, None)
        self._views = tuple(views)
        result = self._result(devices, views, problems, missing)
        doubts = [f"peer {v.peer} on {v.interface} is suspect ({v.suspicion[1]})"
                  for v in views if v.watched and v.suspicion is not None]
        if result.state is State.FAILED and result.reason in HASTEN_VERDICTS:
            doubts.insert(0, f"the tunnel is {result.reason}")
        self._confirm(doubts, now, verdict=result.reason in HASTEN_VERDICTS)
        failed = result.state is State.FAILED and result.reason in HASTEN_VERDICTS
        if self._was_failed and result.state is State.OK:
            # Back from a failed verdict (a repair, a Flannel restart): confirm over the
            # tunnel path now, so readiness and the remediator's verification follow at
            # once rather than at the probes' next interval. One request per recovery.
            log.info("the tunnel is back: confirming over the tunnel path",
                     extra={"check": NAME})
            self._hasten_tunnel()
        self._was_failed = failed or (self._was_failed and result.state is not State.OK)
        return result

    def _hasten_tunnel(self) -> None:
        for target in self.ctx.config.mqtt.targets:
            if target.enabled and target.path == "tunnel":
                self.ctx.hasten(target.name)

    async def _learn(self, key: tuple[str, str], endpoint: str | None) -> None:
        """Remember the source address for a new endpoint (one route lookup per endpoint,
        none in the steady state; every :data:`LEARN_RETRY` seconds while unknown)."""
        known = self._sources.get(key)
        now = self.ctx.clock()
        if known is not None and known[0] == endpoint and (
                known[1] is not None or now - known[2] < LEARN_RETRY):
            return
        address = endpoint_address(endpoint)
        source = await self._egress.learn(address) if address is not None else None
        self._sources[key] = (endpoint, source, now)

    async def _uplink_gone(self, key: tuple[str, str], endpoint: str | None,
                           hist: PeerHistory) -> tuple[str, str] | None:
        """A busy tunnel fell silent at once: is the uplink's address, route or link gone?
        One rtnetlink question per silence (the answer is kept until a counter moves)."""
        moved = max(hist.rx_grew_at, hist.tx_grew_at)
        asked = self._uplink.get(key)
        if asked is None or asked[0] != moved:
            found = await self._why_not_sending(key, endpoint)
            asked = (moved, found if found["cause"] in UPLINK_GONE else None)
            self._uplink[key] = asked
        if asked[1] is None:
            return None
        return "uplink_gone", (f"a busy tunnel fell silent and the uplink is gone: "
                               f"{asked[1]['cause']} ({asked[1]['message']})")

    async def _why_not_sending(self, key: tuple[str, str], endpoint: str | None,
                               ) -> dict[str, Any]:
        """The egress diagnosis of a ``send_failing`` peer (only then: rtnetlink asks)."""
        known = self._sources.get(key)
        found = await self._egress.diagnose(
            endpoint_address(endpoint),
            source=known[1] if known is not None and known[0] == endpoint else None)
        return {"cause": found.cause, "message": found.message, **found.detail}

    def _confirm(self, doubts: list[str], now: float, *, verdict: bool) -> None:
        """Ask for the tunnel-path MQTT targets now while a watched peer is suspect or the
        tunnel has failed (bounded: see :data:`HASTEN_EVERY`, :data:`HASTEN_MAX`). A failed
        verdict that follows a suspicion starts a new episode: it is stronger evidence."""
        if not doubts:
            if self._suspect_since is not None:
                log.debug("suspicion over", extra={"check": NAME})
            self._suspect_since, self._hastened, self._verdict = None, (0.0, 0), False
            return
        last, count = self._hastened
        if self._suspect_since is None or (verdict and not self._verdict):
            self._suspect_since, self._verdict = now, verdict
            last, count = now, 0
            log.info("%s: confirming over the tunnel path", doubts[0], extra={"check": NAME})
        elif count >= HASTEN_MAX or now - last < HASTEN_EVERY:
            return
        self._hasten_tunnel()
        self._hastened = (now, count + 1)

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
            "suspect": any(v.watched and v.suspicion is not None for v in views),
            "suspicion": [f"peer {v.peer} on {v.interface}: {v.suspicion[1]}" for v in views
                          if v.watched and v.suspicion is not None],
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
        if worst[1] == "send_failing":
            # The policy's evidence: why the worst watched peer's sends fail.
            first = next(v for v in watched if v.reason == "send_failing")
            detail["cause"] = (first.send_failure or {}).get("cause", "unknown")
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
    "wireguard.send_failing": Kind(
        "critical", "The device cannot send to its peer (a keepalive was due and did not "
        "leave); the message and `detail.observed.cause` say why: `no_route`, `link_down`, "
        "`no_address` (the uplink is gone) or `local` (e.g. a local firewall drop).",
        problem=True),
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
    from edgeheal.config import ConfigError, format_duration

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
    for key in ("rekey_failing_after", "dead_after", "rx_stall_after", "send_fail_after",
                "connect_grace"):
        value = getattr(wg, key)
        if isinstance(value, float) and value <= 0:
            raise ConfigError(f"wireguard.{key}", "must be greater than zero")
    if (isinstance(wg.rekey_failing_after, float) and isinstance(wg.dead_after, float)
            and wg.rekey_failing_after >= wg.dead_after):
        raise ConfigError("wireguard.rekey_failing_after",
                          f"must be less than dead_after ({format_duration(wg.dead_after)})")


checks.register(checks.Registration(
    NAME, factory, names=lambda config: (NAME,) if config.wireguard.interfaces else (),
    doc=__doc__ or "", kinds=KINDS, alert=_alert, validate=_validate,
    reasons=tuple(REASONS), role="tunnel", reason_states=REASONS,
    vocabulary={"send_failing": frozenset({"send_failing"}),
                "uplink_causes": UPLINK_CAUSES}))

__all__ = ["HASTEN_VERDICTS", "KINDS", "NAME", "PeerView", "WireguardCheck", "listed_peers",
           "route_peers"]

