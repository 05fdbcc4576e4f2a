"""The agent's own sections: ``[agent]``, ``[http]``, ``[metrics]``, ``[alerts]``,
``[kubernetes]`` and ``[fleet]`` (what the running agent, its endpoints, its alert engine
and its Kubernetes side are set with; the checks' sections are in
:mod:`~edgeheal.config.schema.checks`, the remedies' in
:mod:`~edgeheal.config.schema.remediation`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edgeheal.config.schema.fields import setting


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node_name: str = setting(
        "", "This node's name, as in `kubectl get nodes`. Default: the hostname.")
    state_dir: str = setting(
        "/var/lib/edgeheal",
        "Directory for durable state (alert outbox, remediation history, control socket). "
        "systemd's StateDirectory= creates it.")
    check_interval: float = setting(
        5.0, "Default cadence of every check, seconds. A check section may override it "
        "with `interval`.", duration=True, bounds=(0.1, 86400.0))
    log_level: Literal["debug", "info", "warning", "error"] = setting(
        "info", "Log threshold.")


@dataclass(frozen=True, slots=True)
class HttpSettings:
    listen: tuple[str, ...] = setting(
        ("127.0.0.1:9917",),
        "Addresses (`host:port`, IPv6 as `[::1]:9917`) for the probe and metrics server. A "
        "list, so a node IP can be added for the cluster's Prometheus. The server is "
        "read-only; operator commands use the control socket instead.")


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    all_peers: bool = setting(
        False, "Export the per-peer WireGuard series (`edgeheal_wireguard_*{peer}`) for "
        "every peer of the device, not only the watched ones. Flannel's full mesh gives "
        "every node a peer per other node, so the whole mesh costs 7 series per peer on "
        "every node and one dead neighbour shows on every node that peers with it; the "
        "watched peers (`wireguard.watch_peers`) are the ones this node's health depends "
        "on. Every per-peer series says which it is (`watched=\"true\"|\"false\"`).")


@dataclass(frozen=True, slots=True)
class AlertSettings:
    target: str = setting(
        "", "The `[[mqtt.targets]]` entry alerts are published through (usually the "
        "direct path). Empty: alerts are kept in the outbox and logged only.")
    topic_prefix: str = setting("edgeheal", "Topics are `<prefix>/<node>/alerts|status`.")
    reminder_interval: float = setting(
        1800.0, "While a problem lasts, a reminder alert this often.", duration=True,
        bounds=(60.0, 7 * 86400.0))
    outbox_max_count: int = setting(
        10000, "Most alerts kept while the broker is unreachable; the oldest are dropped.")
    outbox_max_age: float = setting(
        7 * 86400.0, "Alerts older than this are dropped from the outbox.", duration=True,
        bounds=(60.0, 365 * 86400.0))
    reconnect_max: float = setting(
        60.0, "Cap of the jittered exponential backoff between reconnects of the alert "
        "connection (it starts at 1 s).", duration=True, bounds=(1.0, 3600.0))


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    kubeconfig: str = setting(
        "", "Kubeconfig file for the agent's own service account (client certificate or "
        "token, custom CA: K3s's format; `edgeheal kubeconfig` writes one). Empty: in-cluster "
        "service-account credentials. Never K3s's admin `k3s.yaml`. The section's presence "
        "enables the Kubernetes side (pods, Events on the Node, the Node condition).", file=True)
    context: str = setting("", "Kubeconfig context to use. Empty: the current context.")
    request_timeout: float = setting(
        10.0, "Timeout of every single API call.", duration=True, bounds=(1.0, 600.0))
    retries: int = setting(
        4, "Retries of a call answered 429 (after `Retry-After`) or 5xx, or that timed out, "
        "with exponential backoff and jitter.")
    node_condition: bool = setting(
        True, "Keep the `EdgeTunnelHealthy` Node condition current (needs `patch` on "
        "`nodes/status`; a 403 turns it off with one warning).")
    events: bool = setting(
        True, "Record each remediation as an Event on the Node (needs `create` on `events`).")


@dataclass(frozen=True, slots=True)
class FleetSettings:
    """`[fleet]`: what the fleet says to every agent at once (docs/remediation.md)."""

    hold: bool = setting(
        False, "Subscribe to `<topic_prefix>/fleet/hold` on the alert connection (one "
        "subscription, retained; needs `[alerts] target`) and obey a valid hold: while it "
        "holds, the Flannel and the control ladders skip with `fleet_hold` (the uplink "
        "ladder is unaffected). Set and released by `edgeheal fleet hold` / `release`. "
        "Costs nothing between holds; ~200 bytes per hold set or released. Off by default.")
    max_hold: float = setting(
        43200.0, "A hold whose `until` is further ahead than this is refused (and alerted): "
        "a hold that outlives its incident is a fleet that no longer heals itself.",
        duration=True, bounds=(60.0, 7 * 86400.0))
