"""Check ``pmtu``: do full-size packets get through the tunnel, or only small ones?

Why: a path-MTU black hole — the underlay's MTU (private LTE, PPPoE, a carrier's own
tunnel) is smaller than the WireGuard device assumes and the ICMP "fragmentation needed"
never comes back — lets handshakes, keepalives, pings and the small MQTT probe through
while TLS and the collectors' larger publishes hang. ``/readyz`` said ready; a Flannel
restart cannot cure it (flannel-io/flannel PR#1567, k3s-io/k3s#5101, siderolabs/talos
PR#6647). This check probes the collectors' own path
(:mod:`edgeheal.boundaries.kernel.segment_probe`: one TCP connection to the tunnel-path
target whose one data segment fills the tunnel device's MTU, Don't Fragment set) and,
when that segment is lost, searches for the largest size that passes
(:mod:`edgeheal.checks.pmtu.search`).

When it probes: at its ``interval`` (1 h: one connection of about 2.7 kB through the
tunnel), quickly again while in doubt (``retry_interval``), and on *suspicion*: the
WireGuard check sees a watched peer's data leave unanswered (``detail.suspect``) while
every tunnel-path MQTT target still serves — the black hole's signature, since those
probes are small — or, which the WireGuard check's own rule cannot see (the small packets
that still pass keep "answering"), its watched peers' counters are lopsided: 12 kB or
more sent in 20 s and under 1.5 % of it received (a healthy upload's ACKs are 3.3 %).
The check's ``serve`` task follows the snapshot for that and asks for a run at once
(``Context.hasten``), at most once per ``suspect_spacing``.

Reasons (closed table; each maps to one state)::

    reason             state     meaning
    ok                 ok        a full-size segment (the device's MTU) was acknowledged
    pmtu_blackhole     failed    the full size is lost while a smaller one passes;
                                 detail.largest_passed and detail.smallest_lost bound it
    clamped            degraded  a black hole, and the opt-in MSS clamp (``clamp``) holds
                                 new TCP connections in and out of the device under it
    no_size_passed     unknown   the handshake passed, no segment did, not even ``floor``:
                                 not an MTU verdict (the tunnel and broker checks own it)
    unreachable        unknown   the probe's TCP connection failed: the same
    interface_missing  unknown   the tunnel device does not exist (the wireguard check
                                 reports it)

Failed is for readiness: ``required`` defaults to true for this check, so ``/readyz`` is
not ready while the collectors' large publishes would hang; ``clamped`` serves (new
connections fit). It is never a reason to restart Flannel: the check has no role the
ladders read, and the path verdict is the MQTT targets' only.

The remedy (``clamp = true``, off by default) installs one nftables table edgeheal owns
(:mod:`edgeheal.boundaries.kernel.nftables`, ``inet edgeheal_mss``) that lowers the MSS
option of SYNs in and out of the device to the largest size that passed; it is removed
when a full-size probe passes again (the probe's own connection is exempt: ``mark``) and
when the agent stops. Connections made before the clamp keep their MSS until they
reconnect.

Metrics: ``edgeheal_pmtu_passed_bytes`` (the largest size the last run saw pass; 0: none)
and ``edgeheal_pmtu_clamp_bytes`` (the size the clamp holds; 0: no clamp).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from typing import TYPE_CHECKING, Any

from edgeheal import checks
from edgeheal.checks.pmtu.search import REASONS, Result, judge, next_size
from edgeheal.model import CheckResult, CheckStatus, Context, Kind, Snapshot, State

if TYPE_CHECKING:
    from edgeheal.config import CheckSettings, Config, PmtuSettings

log = logging.getLogger(__name__)

NAME = "pmtu"
CONNECT_TIMEOUT = 4.0
"""Seconds the probe's TCP handshake may take (a lost SYN is re-sent at 1 s and 3 s)."""


def target(config: Config) -> tuple[str, int] | None:
    """The probe's ``(host, port)``: ``[pmtu] target``, else the first enabled tunnel-path
    MQTT target's; None when there is neither."""
    from edgeheal.config import split_hostport

    if config.pmtu.target:
        return split_hostport(config.pmtu.target)
    for t in config.mqtt.targets:
        if t.enabled and t.path == "tunnel":
            return t.host, t.port
    return None


def counters(snapshot: Snapshot, config: Config) -> tuple[int, int] | None:
    """(tx, rx) bytes of the tunnel check's watched peers together, from its detail."""
    found = None
    for name in checks.role("tunnel").names(config):
        status = snapshot.checks.get(name)
        for peer in (status.detail.get("peers") or []) if status is not None else []:
            if peer.get("watched") and isinstance(peer.get("tx_bytes"), int):
                tx, rx = found or (0, 0)
                found = (tx + int(peer["tx_bytes"]), rx + int(peer.get("rx_bytes") or 0))
    return found


def suspected(snapshot: Snapshot, config: Config, lopsided_now: bool = False) -> bool:
    """The black hole's signature in a snapshot: the tunnel check holds a watched peer
    suspect (or its counters are lopsided: :func:`~edgeheal.checks.pmtu.search.lopsided`)
    while every tunnel-path MQTT target that has a result serves (and one has)."""
    tunnel = checks.role("tunnel").names(config)
    if not lopsided_now and not any(snapshot.checks[n].detail.get("suspect")
                                    for n in tunnel if n in snapshot.checks):
        return False
    probes = [snapshot.checks[t.name] for t in config.mqtt.targets
              if t.enabled and t.path == "tunnel" and t.name in snapshot.checks
              and snapshot.checks[t.name].completed]
    return bool(probes) and all(s.state.serving for s in probes)


class _Metrics:
    def __init__(self, ctx: Context) -> None:
        from prometheus_client import Gauge

        self.passed = Gauge("edgeheal_pmtu_passed_bytes", "Largest IP packet size the last "
                            "pmtu run saw acknowledged through the tunnel (0: none).",
                            registry=ctx.registry)
        self.clamp = Gauge("edgeheal_pmtu_clamp_bytes", "IP packet size the MSS clamp holds "
                           "TCP connections through the tunnel to (0: no clamp).",
                           registry=ctx.registry)


class PmtuCheck:
    """Probes the tunnel path at its full size; see the module docstring."""

    name = NAME

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.settings: CheckSettings = ctx.config.pmtu
        self.pmtu: PmtuSettings = ctx.config.pmtu
        self.metrics = _Metrics(ctx)
        self._hint: int | None = None
        self._clamp: int | None = None
        self._swept = False
        """Whether a clamp a killed agent may have left behind has been swept (once)."""
        self._suspected_at: float | None = None

    async def run(self) -> CheckResult:
        from edgeheal.boundaries.kernel import segment_probe

        s = self.pmtu
        full = segment_probe.device_mtu(s.interface)
        if full is None:
            return CheckResult(State.UNKNOWN, "interface_missing",
                               f"the tunnel device {s.interface} does not exist",
                               {"interface": s.interface})
        host_port = target(self.ctx.config)
        if host_port is None:  # the settings rules refuse a [pmtu] without one
            raise RuntimeError("pmtu: no target")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                *host_port, type=socket.SOCK_STREAM)
        except OSError as err:  # an unresolvable name: not an MTU matter either
            verdict = judge(full, [], connect_error=f"cannot resolve {host_port[0]}: {err}",
                            clamp=self._clamp)
            return CheckResult(verdict.state, verdict.reason, verdict.message,
                               {**verdict.detail, "interface": s.interface})
        family, _, _, _, address = infos[0]
        results: list[Result] = []
        error = ""
        mark = s.mark if s.clamp else None
        client = f"edgeheal-{self.ctx.config.node}-pmtu"
        while (size := next_size(full, s.floor, results, self._hint)) is not None:
            outcome = await segment_probe.probe(
                (str(address[0]), int(address[1])), family, size, wait=s.wait,
                connect_timeout=min(CONNECT_TIMEOUT, s.timeout), mark=mark, client_id=client)
            if outcome.kind == "connect_failed":
                error = outcome.message
                break
            if not results and outcome.size < full:  # the peer's MSS is the limit
                full = outcome.size
            results.append((outcome.size, outcome.kind == "passed"))
        clamp_error = await self._act(full, results, error)
        verdict = judge(full, results, connect_error=error, clamp=self._clamp,
                        clamp_error=clamp_error)
        if verdict.reason in ("pmtu_blackhole", "clamped"):
            self._hint = verdict.detail["largest_passed"]
        elif verdict.reason == "ok":
            self._hint = None
        self.metrics.passed.set(verdict.detail["largest_passed"] or 0)
        self.metrics.clamp.set(self._clamp or 0)
        detail: dict[str, Any] = {**verdict.detail, "interface": s.interface,
                                  "target": f"{host_port[0]}:{host_port[1]}"}
        return CheckResult(verdict.state, verdict.reason, verdict.message, detail)

    async def _act(self, full: int, results: list[Result], error: str) -> str:
        """The opt-in clamp: on at the largest size that passed, off once the full size
        passes. Returns nftables' refusal, if any (the black hole then stays failed)."""
        if not self.pmtu.clamp or error:
            return ""
        from edgeheal.boundaries.kernel import nftables

        passed = max((size for size, ok in results if ok), default=None)
        full_passed = any(ok and size >= full for size, ok in results)
        try:
            if full_passed and (self._clamp is not None or not self._swept):
                await asyncio.to_thread(nftables.remove)
                self._clamp, self._swept = None, True
            elif not full_passed and passed is not None and passed != self._clamp:
                clamp = nftables.Clamp(self.pmtu.interface, passed, self.pmtu.mark)
                await asyncio.to_thread(nftables.apply, clamp)
                self._clamp, self._swept = passed, True
        except nftables.NftablesError as err:
            log.warning("MSS clamp: %s", err, extra={"check": NAME})
            return str(err)
        return ""

    async def serve(self) -> None:
        """Follow the snapshot; on the black hole's signature, run the probe now."""
        from edgeheal.checks.pmtu.search import LOPSIDED_WINDOW, Sample, lopsided

        seen, samples = -1, collections.deque[Sample]()
        while True:
            snap = self.ctx.snapshot()
            if snap.version != seen:
                seen = snap.version
                now = self.ctx.clock()
                moved = counters(snap, self.ctx.config)
                if moved is not None and (not samples or moved != samples[-1][1:]):
                    samples.append((now, *moved))
                while samples and now - samples[0][0] > 2 * LOPSIDED_WINDOW:
                    samples.popleft()
                if suspected(snap, self.ctx.config, lopsided(samples, now)) and (
                        self._suspected_at is None
                        or now - self._suspected_at >= self.pmtu.suspect_spacing):
                    self._suspected_at = now
                    log.info("tunnel suspect while its small probes pass: probing the "
                             "path MTU now", extra={"check": NAME})
                    self.ctx.hasten(NAME)
            await self.ctx.changed(seen, None)

    async def close(self) -> None:
        """The agent's shutdown: the clamp goes with the agent."""
        if self._clamp is None:
            return
        from edgeheal.boundaries.kernel import nftables

        try:
            nftables.remove()
            self._clamp = None
        except nftables.NftablesError as err:
            log.warning("MSS clamp not removed: %s", err, extra={"check": NAME})


def factory(ctx: Context) -> list[checks.Check]:
    return [PmtuCheck(ctx)]


KINDS: dict[str, Kind] = {
    "pmtu.blackhole": Kind(
        "critical", "Path-MTU black hole: full-size packets through the tunnel are lost "
        "while small ones pass, so large publishes and TLS hang; `detail.largest_passed` "
        "is the largest size that got through. A Flannel restart does not cure it.",
        problem=True),
    "pmtu.clamped": Kind(
        "warning", "Path-MTU black hole, worked around: the MSS clamp holds new TCP "
        "connections through the tunnel under `detail.clamp` bytes.", problem=True),
    "pmtu.recovered": Kind("info", "Full-size packets pass the tunnel again (clears the "
                           "problem; the clamp, if any, is removed)."),
}


def _alert(status: CheckStatus) -> tuple[str, str]:
    if status.reason == "pmtu_blackhole":
        return "pmtu.blackhole", "pmtu.recovered"
    if status.reason == "clamped":
        return "pmtu.clamped", "pmtu.recovered"
    return "check.failed", "check.recovered"


def _validate(config: Config) -> None:
    from edgeheal.checks.pmtu.search import MAX_PROBES
    from edgeheal.config import ConfigError, split_hostport

    if NAME not in config.sections or not config.pmtu.enabled:
        return
    settings = config.pmtu
    if settings.target:
        try:
            split_hostport(settings.target)
        except ValueError as err:
            raise ConfigError("pmtu.target", str(err)) from None
    elif target(config) is None:
        raise ConfigError("pmtu.target", "is required when no enabled [[mqtt.targets]] "
                          "entry has path = \"tunnel\"")
    if not settings.interface:
        raise ConfigError("pmtu.interface", "is required (the tunnel device)")
    if not 576 <= settings.floor <= 9000:
        raise ConfigError("pmtu.floor", f"expected 576 to 9000 bytes, got {settings.floor}")
    if not 0 < settings.mark <= 0xFFFFFFFF:
        raise ConfigError("pmtu.mark", f"expected 1 to 0xffffffff, got {settings.mark}")
    least = MAX_PROBES * (settings.wait + 0.5)
    if settings.timeout < least:
        raise ConfigError("pmtu.timeout", f"must cover a whole search: at least "
                          f"{least:g}s ({MAX_PROBES} probes of `wait` = {settings.wait:g}s)")


def _names(config: Config) -> tuple[str, ...]:
    return (NAME,) if NAME in config.sections else ()


checks.register(checks.Registration(
    NAME, factory, names=_names, doc=__doc__ or "", kinds=KINDS, alert=_alert,
    validate=_validate, reasons=tuple(REASONS), reason_states=REASONS))

__all__ = ["KINDS", "NAME", "PmtuCheck", "counters", "suspected", "target"]
