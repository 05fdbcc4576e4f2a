"""The check's one result from its peers' reasons, and the ``[wireguard]`` settings rules.

The result is the worst *watched* peer; a device-level problem (``interface_missing``,
``permission_denied``, ``read_error``), ``no_peers`` or ``target_unresolved`` when there is
no watched peer to judge (the table is in :mod:`edgeheal.checks.wireguard`).
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from edgeheal.boundaries.wg.health import REASONS
from edgeheal.boundaries.wg.readings import is_public_key
from edgeheal.model import CheckResult, State

if TYPE_CHECKING:
    from edgeheal.boundaries.wg.readings import DeviceStats
    from edgeheal.checks.wireguard.collector import PeerView
    from edgeheal.config import Config, WireguardSettings


def verdict(config: Config, devices: list[DeviceStats], views: list[PeerView], *,
            problems: dict[str, tuple[str, str]], missing: list[str],
            unresolved: list[str] | None = None,
            targets: dict[str, Any] | None = None) -> CheckResult:
    """The check's result (see the module docstring)."""
    settings: WireguardSettings = config.wireguard
    detail: dict[str, Any] = {
        "interfaces": {d.interface: {"reader": d.reader, "listen_port": d.listen_port,
                                     "peers": len(d.peers)} for d in devices},
        "missing": missing,
        "errors": {i: msg for i, (_, msg) in problems.items()},
        "watch_peers": ("auto" if settings.watch_peers == "auto"
                        else list(settings.watch_peers)),
        "peers": [v.to_json() for v in views],
        **({"targets": targets} if targets else {}),
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
                           + ", ".join(settings.interfaces), detail)
    watched = [v for v in views if v.watched]
    candidates: list[tuple[State, str, str]] = [
        (REASONS[r], r, m) for r, m in problems.values()]
    if unresolved:
        # The peer that carries the target is not known: say why, judge no peer (every
        # peer is watched for its metrics and suspicion meanwhile).
        return CheckResult(
            REASONS["target_unresolved"], "target_unresolved",
            f"cannot tell which peer carries the tunnel-path MQTT target(s): "
            f"{'; '.join(unresolved)}; watching all {len(views)} peer(s) meanwhile",
            detail)
    if not watched:
        names = ", ".join(d.interface for d in devices)
        tunnel = [t.host for t in config.mqtt.targets if t.path == "tunnel"]
        if settings.watch_peers == "auto" and tunnel:
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


def validate(config: Config) -> None:
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
