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
    no_peers           failed    no watched peer is configured on the device(s): no peer
                                 carries the tunnel-path target's address (after following
                                 kube-proxy's DNAT) any more, or conntrack shows it sent
                                 untranslated to an address no peer holds
    target_unresolved  unknown   no peer's allowed IPs hold the tunnel-path target and
                                 conntrack knows no translation for it yet (a ClusterIP
                                 before its first connection, or conntrack unreadable):
                                 every peer is watched meanwhile, nothing restarts Flannel
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

import logging
from collections.abc import Awaitable, Callable, Iterator
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
)
from edgeheal.checks.wireguard.collector import PeerView, collect
from edgeheal.checks.wireguard.egress_memo import EgressMemo
from edgeheal.checks.wireguard.episodes import HASTEN_EVERY, HASTEN_MAX, HASTEN_VERDICTS, Episodes
from edgeheal.checks.wireguard.peers import Conntrack, Targets, listed_peers, route_peers
from edgeheal.checks.wireguard.switch_follower import Forget, SwitchFollower
from edgeheal.checks.wireguard.verdict import validate, verdict
from edgeheal.model import CheckResult, CheckStatus, Context, Kind, State

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from edgeheal.config import CheckSettings, WireguardSettings

log = logging.getLogger(__name__)

NAME = "wireguard"


# --- the check --------------------------------------------------------------------------

Reader = Callable[[str], Any]
"""``async (ifname) -> DeviceStats`` raising :class:`edgeheal.boundaries.wg.WireGuardError`."""


class WireguardCheck:
    """Observes the configured WireGuard interfaces; see the module docstring."""

    name = NAME

    def __init__(self, ctx: Context, *, reader: Reader | None = None,
                 wall: Callable[[], float] | None = None,
                 resolve: Callable[[str], Awaitable[list[str]]] | None = None,
                 egress: Egress | None = None, conntrack: Conntrack | None = None,
                 forget: Forget | None = None) -> None:
        self.ctx = ctx
        self._memo = EgressMemo(egress or Egress(), ctx.clock)
        self._episodes = Episodes(self._hasten_tunnel)
        self._targets = Targets(ctx.config, ctx.clock, resolve=resolve, conntrack=conntrack)
        self.settings: CheckSettings = ctx.config.wireguard
        self._settings: WireguardSettings = ctx.config.wireguard
        self._reader = reader
        # Epoch seconds, only to place a reported handshake (see edgeheal.boundaries.wg.health).
        self._wall = wall or (lambda: ctx.wall().timestamp())
        self._history: dict[tuple[str, str], PeerHistory] = {}
        self._views: tuple[PeerView, ...] = ()
        self._reasons: dict[tuple[str, str], str] = {}
        self._switches = SwitchFollower(ctx, self._settings, forget)

    # metrics ---------------------------------------------------------------------------
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from collect(self._views,  # read once: run() replaces the tuple whole
                           all_peers=self.ctx.config.metrics.all_peers)

    # observing -------------------------------------------------------------------------
    async def _read(self, ifname: str) -> DeviceStats:
        if self._reader is not None:
            result: DeviceStats = await self._reader(ifname)
            return result
        from edgeheal.boundaries.wg import read_device

        return await read_device(ifname)

    async def _watched(self, devices: list[DeviceStats]) -> tuple[dict[str, set[str]],
                                                                 list[str], dict[str, Any]]:
        """Interface -> watched peers; why a target's peer cannot be found (empty: it
        can); ``detail.targets``."""
        spec = self._settings.watch_peers
        if isinstance(spec, tuple):
            return {d.interface: listed_peers(d, spec) for d in devices}, [], {}
        choice = await self._targets.choose(devices)
        every = {d.interface: {p.public_key for p in d.peers} for d in devices}
        if choice is None:  # no tunnel-path target, or none resolvable (logged): all peers
            return every, [], {}
        if not any(choice.watched.values()) and choice.unresolved:
            # never no_peers (which restarts Flannel) for a peer not found: watch them all
            return every, [e.message for e in choice.unresolved], choice.targets
        return choice.watched, [], choice.targets

    async def run(self) -> CheckResult:
        now, wall = self.ctx.clock(), self._wall()
        self._switches.follow(self._memo)
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
        chosen, unresolved, targets = await self._watched(devices)
        await self._switches.forget_sources(devices, chosen)
        for device in devices:
            watched = chosen.get(device.interface, set())
            for peer in device.peers:
                key = (device.interface, peer.public_key)
                seen.add(key)
                hist = observe(self._history.get(key), peer, now=now, wall=wall)
                self._history[key] = hist
                limits = thresholds(self._settings, peer.persistent_keepalive)
                if peer.persistent_keepalive > 0:
                    await self._memo.learn(key, peer.endpoint)
                reason, message = classify(hist, now, limits)
                failure = None
                if reason == "send_failing":
                    failure = await self._memo.why_not_sending(key, peer.endpoint)
                    message = f"{message}: {failure['cause']} ({failure['message']})"
                suspect = suspicion(hist, now, limits)
                if (suspect is None and reason == "ok" and peer.public_key in watched
                        and quiet_after_data(hist, now)):
                    suspect = await self._memo.uplink_gone(key, peer.endpoint, hist)
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
            self._memo.drop(key)
        self._views = tuple(views)
        result = verdict(self.ctx.config, devices, views, problems=problems,
                         missing=missing, unresolved=unresolved, targets=targets)
        doubts = [f"peer {v.peer} on {v.interface} is suspect ({v.suspicion[1]})"
                  for v in views if v.watched and v.suspicion is not None]
        if result.state is State.FAILED and result.reason in HASTEN_VERDICTS:
            doubts.insert(0, f"the tunnel is {result.reason}")
        if result.reason == "target_unresolved":  # the probe's connection shows the DNAT
            doubts.insert(0, "the tunnel-path target's peer is not known yet")
        self._episodes.confirm(doubts, now, verdict=result.reason in HASTEN_VERDICTS)
        self._episodes.settle(
            failed=result.state is State.FAILED and result.reason in HASTEN_VERDICTS,
            ok=result.state is State.OK)
        return result

    def _hasten_tunnel(self) -> None:
        for target in self.ctx.config.mqtt.targets:
            if target.enabled and target.path == "tunnel":
                self.ctx.hasten(target.name)

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


checks.register(checks.Registration(
    NAME, factory, names=lambda config: (NAME,) if config.wireguard.interfaces else (),
    doc=__doc__ or "", kinds=KINDS, alert=_alert, validate=validate,
    reasons=tuple(REASONS), default_enabled=True, role="tunnel", reason_states=REASONS,
    vocabulary={"send_failing": frozenset({"send_failing"}),
                "uplink_causes": UPLINK_CAUSES,
                # a watched peer that had a session and is no longer answered: what a
                # stale NAT mapping looks like (the ladder's rebind rung)
                "unanswered": frozenset({"stalled", "dead"})}))

__all__ = ["HASTEN_EVERY", "HASTEN_MAX", "HASTEN_VERDICTS", "KINDS", "NAME", "PeerView",
           "Targets", "WireguardCheck", "listed_peers",
           "route_peers"]

