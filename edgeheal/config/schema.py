"""The settings: frozen dataclasses whose fields document their unit, default and reason.

This is the one place a setting is declared. ``docs/configuration.md`` is rendered from the
``doc`` metadata (:func:`edgeheal.config.render.reference`), parsing reads the type hints
(:mod:`edgeheal.config.parse`), and ``secret``/``duration`` marks decide redaction and how a
value is printed. A check section subclasses :class:`CheckSettings`, so every check takes the
same common keys and the generic rules (:mod:`edgeheal.config.validate`) find it by type.
Rules that belong to one check or one remedy live with that module's registration, not here.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any, Literal


def doc(text: str, *, secret: bool = False, duration: bool = False,
        bounds: tuple[float, float] | None = None, file: bool = False) -> dict[str, Any]:
    """Field metadata. ``bounds``: the accepted (least, most) value of a number, shown in
    the reference and enforced by the parser (a duration without bounds gets
    :data:`edgeheal.config.parse.DURATION_BOUNDS`). ``file``: a path that must be absolute
    and, for ``check-config``, an existing readable regular file."""
    return {"doc": text, "secret": secret, "duration": duration, "bounds": bounds,
            "file": file}


def setting(default: Any, text: str, **kw: Any) -> Any:
    if isinstance(default, list | dict | set):
        raise TypeError("use a tuple for sequence defaults")
    return field(default=default, metadata=doc(text, **kw))


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
class CheckSettings:
    """The keys every check section accepts, with the same meaning everywhere."""

    enabled: bool = setting(True, "Run this check.")
    interval: float | None = setting(
        None, "Cadence of this check, seconds. Default: `agent.check_interval`.",
        duration=True, bounds=(0.1, 86400.0))
    timeout: float = setting(
        5.0, "A run that takes longer is abandoned and counts as `unknown` (reason "
        "`check_timeout`).", duration=True, bounds=(0.1, 600.0))
    fail_after: int = setting(
        2, "Consecutive results at least as bad as a new, worse state before it becomes "
        "effective. 2 means one lost packet never flips a probe.")
    recover_after: int = setting(
        2, "Consecutive better results before a bad state clears.")
    retry_interval: float | None = setting(
        None, "Quick re-check while in doubt: after a result that is not ok, or while the "
        "effective state is not ok, the next run starts this long after the last one ended "
        "instead of after `interval` (never later), for the first 5 minutes of the doubt. "
        "So `fail_after` and `recover_after` are reached in seconds, and a healthy check "
        "costs nothing extra. Default: none (a failure is re-checked at `interval`).",
        duration=True, bounds=(0.1, 86400.0))
    required: bool = setting(
        False, "The check gates `/readyz` (and nothing else).")

    def effective_interval(self, agent: AgentSettings) -> float:
        return self.interval if self.interval is not None else agent.check_interval


OFFLOAD_DEFAULT_FEATURES = ("tx-checksum-ipv4", "tx-checksum-ip-generic", "tx-checksum-ipv6")


@dataclass(frozen=True, slots=True)
class OffloadSettings(CheckSettings):
    interfaces: tuple[str, ...] = setting(
        (), "Interface names or shell-style globs (`wwan*`) whose TX checksum offload is "
        "kept off. Empty: the offload check and enforcer do nothing.")
    features: tuple[str, ...] = setting(
        OFFLOAD_DEFAULT_FEATURES,
        "Kernel feature names (as `ethtool -k` prints them) to turn off; e.g. add "
        "`tx-udp_tnl-csum-segmentation`.")
    require_interface: bool = setting(
        False, "A matching interface must exist; when none does, the check fails.")
    enforce: bool = setting(
        True, "Turn features off. false: observe and report only.")
    interval: float | None = setting(
        60.0, "Re-verify cadence (safety net; link events are acted on at once).",
        duration=True, bounds=(0.1, 86400.0))


@dataclass(frozen=True, slots=True)
class WireguardSettings(CheckSettings):
    interfaces: tuple[str, ...] = setting(
        ("flannel-wg", "flannel-wg-v6"), "WireGuard interfaces to watch; absent ones are "
        "skipped.")
    watch_peers: str | tuple[str, ...] = setting(
        "auto", "`auto`: the peers whose allowed IPs route the tunnel-path MQTT targets "
        "(or, with none configured, all peers); or a list of public keys and/or endpoint "
        "CIDRs. Other peers are reported but never drive the check's state.")
    rekey_failing_after: float | Literal["auto"] = setting(
        "auto", "Handshake age past which unanswered rekey attempts count as "
        "`rekey_failing`. auto: 120 s + keepalive + 3 x REKEY_TIMEOUT.", duration=True,
        bounds=(1.0, 86400.0))
    dead_after: float | Literal["auto"] = setting(
        "auto", "Handshake age that means `dead`. auto: REJECT_AFTER_TIME (180 s) + "
        "keepalive: past it the session is refused.", duration=True, bounds=(1.0, 86400.0))
    rx_stall_after: float | Literal["auto"] = setting(
        "auto", "rx not growing this long while tx grows means `stalled`. auto: 2.5 x the "
        "peer's keepalive interval.", duration=True, bounds=(1.0, 86400.0))
    send_fail_after: float | Literal["auto"] = setting(
        "auto", "On a peer with persistent keepalive, nothing sent or received this long "
        "means `send_failing` (a keepalive was due and could not leave), as does tx flat this "
        "long while the peer's data went unanswered for 12 s. auto: keepalive + 5 s, and "
        "keepalive + 15 s for tx flat while only the peer's keepalives arrive (one end of an "
        "idle tunnel may skip a round). An explicit value sets both.",
        duration=True, bounds=(1.0, 86400.0))
    interval: float | None = setting(
        2.0, "Cadence of the counter reads. The check reads the devices' counters only (no "
        "traffic, no subprocess), so it runs every 2 s: a blackhole on a busy tunnel is "
        "suspect 12 s after the first unanswered data and a rekey that goes unanswered is "
        "seen within 10 s (docs/wireguard.md, \"Why these thresholds\").", duration=True,
        bounds=(0.1, 86400.0))
    connect_grace: float = setting(
        30.0, "How long a new interface or peer may take for its first handshake.",
        duration=True, bounds=(0.0, 86400.0))
    required: bool = setting(True, "The check gates `/readyz`.")
    forget_source: bool = setting(
        True, "After an uplink failover (the `uplink` check's active interface changed), "
        "set each watched peer's endpoint again on a userspace device (wireguard-go, "
        "boringtun), so it stops sending from the old uplink's address (docs/failover.md). "
        "A kernel device drops a stale source by itself and is never written to.")


@dataclass(frozen=True, slots=True)
class UplinkCost:
    """One `[[uplink.costs]]` entry: what using an uplink costs (LF EVE's port cost)."""

    interface: str = setting(
        "", "The uplink interface (a name or glob of `[uplink] interfaces`).")
    cost: int = setting(
        0, "0 (free: Ethernet, Wi-Fi) to 255 (the dearest: a metered LTE plan), as LF EVE "
        "orders its ports. edgeheal never moves the default route: the network manager's "
        "route metrics do; the cost ranks interfaces whose default routes tie and is "
        "exported with the active uplink, so metered accounting charges the right link.")


@dataclass(frozen=True, slots=True)
class UplinkSettings(CheckSettings):
    interfaces: tuple[str, ...] = setting(
        (), "Uplink interfaces (names or shell-style globs: `wwan*`) whose link, carrier, "
        "addresses, default route and rx counter the `uplink` check reads. Empty: no "
        "`uplink` check (the feature is off).")
    probe: str = setting(
        "", "Optional second direct-path probe, `host:port`: a TCP connect over the host's "
        "own route, so one broker's outage is not taken for the uplink's (an answer means "
        "the uplink passes traffic). Empty: the rx counter of the interfaces is the "
        "evidence of silence.")
    window: float = setting(
        60.0, "Nothing passing this long (the probe failing, or without a probe the rx "
        "counter flat) while link, address, route and the modem are fine means `stuck`.",
        duration=True, bounds=(5.0, 86400.0))
    modem_manager: bool = setting(
        True, "Read the modem's registration, signal and bearer from ModemManager over "
        "D-Bus. Without it (or without ModemManager) silence is `unknown`: no coverage "
        "and a stuck modem cannot be told apart.")
    dbus_address: str = setting(
        "", "D-Bus address of ModemManager's bus. Empty: the system bus (lab and tests "
        "set a private one).")
    modem_absent_after: float = setting(
        120.0, "The uplink's modem (seen since the agent started, or its interface unplugged "
        "or re-enumerated) missing from ModemManager (or ModemManager not answering) this "
        "long is `modem_absent`: longer "
        "than a USB re-enumeration and ModemManager's probing of the new device take "
        "(tens of seconds), so a modem that resets by itself is not taken for a lost one.",
        duration=True, bounds=(10.0, 86400.0))
    events: bool = setting(
        True, "Listen to rtnetlink link and default-route events (one idle socket, no "
        "polling) and run the check at once when one of the uplinks moves: a failover "
        "is seen within a second, not at the next `interval`.")
    plan: str = setting(
        "", "The uplink's data plan per billing period, e.g. `\"1GB\"`, `\"500MB\"` "
        "(decimal kB, MB, GB, TB; or KiB, MiB, GiB, TiB). The uplink interfaces' rx + tx bytes "
        "are counted either way (kept in the state directory across restarts, reboots and "
        "counter resets: `detail.data` in `/status`, `edgeheal_uplink_bytes_total`); with a "
        "plan, `uplink.plan_forecast` and `uplink.plan_exceeded` are raised. Empty: no plan.")
    plan_start_day: int = setting(
        1, "Day of the month (UTC) the billing period starts on, 1 to 28.", bounds=(1.0, 28.0))
    plan_warn: float = setting(
        80.0, "Percent of `plan`: `uplink.plan_forecast` once the period's usage reaches it, "
        "or once the last 24 h's rate would use up the plan before the period ends.",
        bounds=(1.0, 100.0))
    plan_exceeded: float = setting(
        100.0, "Percent of `plan` at which `uplink.plan_exceeded` is raised (once a period).",
        bounds=(1.0, 1000.0))
    interval: float | None = setting(
        10.0, "Cadence: reads kernel state and, with ModemManager, a handful of D-Bus "
        "properties; the probe is one TCP handshake.", duration=True, bounds=(0.1, 86400.0))
    retry_interval: float | None = setting(
        2.0, "Quick re-check while in doubt (see the common keys).", duration=True,
        bounds=(0.1, 86400.0))
    costs: tuple[UplinkCost, ...] = setting(
        (), "The cost of each uplink (`[[uplink.costs]]`, `interface` and `cost`); an "
        "interface not listed costs 0. The check follows the interface that carries the "
        "default route (docs/failover.md) and reports a switch as `uplink.failover`.")


@dataclass(frozen=True, slots=True)
class PmtuSettings(CheckSettings):
    """`[pmtu]`: the path-MTU black-hole check (docs/pmtu.md). Ships off: its section turns
    it on, because it sends traffic a fleet never asked for."""

    target: str = setting(
        "", "`host:port` of a TCP listener reached through the tunnel (a broker: the "
        "probe's full-size segment is a valid MQTT CONNECT, so an MQTT broker sees a client "
        "that connects and leaves). Empty: the first enabled tunnel-path `[[mqtt.targets]]` "
        "entry's host and port, the collectors' own path.")
    interface: str = setting(
        "flannel-wg", "The tunnel device: its MTU is the full size the probe must get "
        "through, and the MSS clamp (`clamp`) matches traffic in and out of it.")
    floor: int = setting(
        1200, "Smallest IP packet size the search tries, bytes. A path that loses even "
        "this (but completes a TCP handshake) is `no_size_passed`, not an MTU verdict.",
        bounds=(576.0, 9000.0))
    wait: float = setting(
        3.0, "How long one probe segment may take to be acknowledged (TCP retransmits it "
        "meanwhile, so one lost packet does not lose a size) before its size counts as lost.",
        duration=True, bounds=(0.2, 30.0))
    suspect_spacing: float = setting(
        600.0, "Least time between two probes started by a suspicion (the WireGuard check "
        "sees data leaving unanswered, or its counters show bulk data out and under 1.5 % "
        "back, while the small tunnel-path MQTT probes pass).",
        duration=True, bounds=(10.0, 86400.0))
    clamp: bool = setting(
        False, "The opt-in remedy: on `pmtu_blackhole`, clamp TCP MSS of connections in and "
        "out of `interface` to the largest size that passed, with an nftables table of "
        "edgeheal's own (`inet edgeheal_mss`); removed when a full-size probe passes again "
        "and when the agent stops. Never a restart. Needs CAP_NET_ADMIN.")
    mark: int = setting(
        0x00E40000, "Packet mark of the probe's own connection while the clamp is on, so "
        "the clamp leaves it alone and a full-size probe can see the path heal. Pick one "
        "that no other mark user on the node (kube-proxy: 0x4000, 0x8000) matches.",
        bounds=(1.0, 4294967295.0))
    interval: float | None = setting(
        3600.0, "Cadence of the probe while healthy: one TCP connection with one "
        "full-size segment, about 2.7 kB through the tunnel (66 kB a day; bench/pmtu_cost.py).",
        duration=True, bounds=(10.0, 86400.0))
    timeout: float = setting(
        60.0, "Bound of one run (a search of up to 9 sizes, each up to `wait`).",
        duration=True, bounds=(1.0, 600.0))
    retry_interval: float | None = setting(
        10.0, "Quick re-check while in doubt (see the common keys).", duration=True,
        bounds=(1.0, 86400.0))
    recover_after: int = setting(
        1, "Consecutive better results before a bad state clears: one full-size segment "
        "acknowledged proves the path (and readiness does not wait a second probe after "
        "the tunnel comes up).")
    required: bool = setting(
        True, "The check gates `/readyz`: with a black hole the collectors' large "
        "publishes hang although the small probes pass.")


@dataclass(frozen=True, slots=True)
class ControlSettings(CheckSettings):
    """`[control]`: the K3s agent's path to its server (docs/control.md). Ships off: its
    section turns it on. Reads the node's Lease and Node through `[kubernetes]`; without
    that section it has its local evidence and the direct handshake only."""

    servers: tuple[str, ...] = setting(
        (), "`host:port` of each K3s server the agent's load balancer may forward to (the "
        "supervisor/API port, 6443 by default: the agent's `--server` and the servers it "
        "learnt). The agent's connections to these are the cheap evidence; one TCP "
        "handshake to them, only on suspicion, tells `server_unreachable`. Required.")
    balancer: str = setting(
        "127.0.0.1:6444", "`host:port` of the agent's local load balancer (K3s "
        "`--lb-server-port`, 6444 by default): clients connected to it while the agent "
        "holds no healthy connection to a server is the `balancer_stuck` evidence.")
    kubelet_healthz: str = setting(
        "127.0.0.1:10248", "`host:port` of the kubelet's local health endpoint (GET "
        "`/healthz`, plain HTTP on loopback). Empty: not asked.")
    stall_retransmits: int = setting(
        3, "A connection to a server whose oldest unacknowledged segment has been "
        "retransmitted this many times in a row (or with as many unanswered probes) counts "
        "as stalled: 3 is about 3 s of silence at a 200 ms RTO, well past one lost packet.",
        bounds=(1.0, 15.0))
    api_interval: float = setting(
        10800.0, "Cadence of the one confirming API read (the node's Lease and the Node) "
        "while the local evidence is fine: about 5.6 kB each with its TLS handshake, "
        "45 kB a day (docs/control.md); any suspicion reads at once. Every 3 h and not "
        "every hour so that the agent with every check on stays under 1 MB a day.",
        duration=True, bounds=(60.0, 86400.0))
    api_spacing: float = setting(
        20.0, "Least time between two API reads while the local evidence is suspicious or "
        "the verdict is not ok (a stale lease is told by two reads at least the lease's "
        "duration apart seeing the same renewTime).", duration=True, bounds=(5.0, 3600.0))
    connect_timeout: float = setting(
        4.0, "How long the direct TCP handshake to a server may take (a lost SYN is re-sent "
        "at 1 s and 3 s).", duration=True, bounds=(0.5, 30.0))
    interval: float | None = setting(
        10.0, "Cadence of the local evidence: two reads of the kernel's TCP table and one "
        "loopback GET of the kubelet's /healthz; no packet leaves the node.",
        duration=True, bounds=(1.0, 3600.0))
    retry_interval: float | None = setting(
        10.0, "Quick re-check while in doubt (see the common keys).", duration=True,
        bounds=(1.0, 3600.0))
    timeout: float = setting(
        30.0, "Bound of one run (a handshake and two API reads, each within "
        "`[kubernetes] request_timeout`, never retried here).", duration=True,
        bounds=(1.0, 600.0))


@dataclass(frozen=True, slots=True)
class MqttTarget(CheckSettings):
    name: str = setting("", "Target name; also the check's name (`/probe/<name>`).")
    host: str = setting("", "Broker host name or address.")
    port: int = setting(1883, "Broker TCP port.")
    path: Literal["tunnel", "direct"] = setting(
        "direct", "Which network path this target exercises: `tunnel` (through Flannel's "
        "WireGuard, like the collectors) or `direct` (the host's own route).")
    tls: bool = setting(False, "Use TLS (then `ca_file`, optional `cert_file`/`key_file`).")
    ca_file: str = setting("", "CA bundle for TLS. Empty: the system store.", file=True)
    cert_file: str = setting("", "Client certificate for TLS client authentication.",
                             file=True)
    key_file: str = setting("", "Client key for `cert_file`.", file=True)
    server_name: str = setting("", "TLS server name to verify. Default: `host`.")
    protocol: Literal["3.1.1", "5"] = setting("3.1.1", "MQTT protocol version.")
    username: str = setting("", "User name; empty for anonymous.")
    password_file: str = setting(
        "", "File holding the password (never the password inline).", file=True)
    client_id: str = setting("", "Client id. Default: `edgeheal-<node>-<target>`.")
    keepalive: float = setting(
        60.0, "MQTT keepalive of the kept-open alert connection, seconds: a PINGREQ after "
        "this long of silence, and no PINGRESP within as long again drops it. The direct "
        "path's reachability signal: when a tunnel-path probe fails, the link is asked at "
        "once (answer within `timeout`), so the paths are compared on fresh evidence "
        "whatever this is. Keep it under the carrier NAT's TCP idle timeout (minutes). "
        "60 s costs about 0.23 MB a day (20 s: 0.7 MB).", duration=True,
        bounds=(1.0, 65535.0))
    interval: float | None = setting(
        60.0, "Probe cadence while healthy. A probe is one PINGREQ/PINGRESP on a session kept "
        "open between probes (160 bytes with TCP; ~340 bytes through the tunnel), or a "
        "CONNECT when there is none. A suspicion raised by the WireGuard check runs the "
        "tunnel-path probe at once instead (docs/mqtt.md).",
        duration=True, bounds=(1.0, 86400.0))
    timeout: float = setting(
        4.0, "A probe that takes longer is `timeout`. 4 s still lets TCP retransmit a lost "
        "SYN twice (at 1 s and 3 s), so random loss alone rarely fails a probe, and a dead "
        "path is confirmed 2 s sooner than with 5 s. Also the connect deadline of the "
        "kept-open alert connection.", duration=True, bounds=(1.0, 600.0))
    retry_interval: float | None = setting(
        2.0, "After a failed probe (or while the target is not ok) the next probe starts "
        "this long after the last one ended, for the first 5 minutes: with `fail_after = 2` "
        "a dead path is reported 2 x `timeout` + 2 s after the first failing probe starts, "
        "and a recovery within a few seconds.", duration=True, bounds=(1.0, 86400.0))


@dataclass(frozen=True, slots=True)
class MqttSettings:
    targets: tuple[MqttTarget, ...] = setting(
        (), "Brokers to probe, each a check of its own (`[[mqtt.targets]]`).")


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
class ServiceSettings:
    """`[remediation.service]`: how the `k3s-service` remedy restarts K3s's embedded Flannel."""

    unit: str = setting(
        "auto", "The systemd unit restarted over D-Bus. `auto`: `k3s-agent.service` on "
        "agents, `k3s.service` on servers (whichever is loaded; the active one if both "
        "are). Or a K3s unit name (`k3s*.service`, e.g. from `INSTALL_K3S_NAME`; then "
        "list it in the polkit rule too). The agent restarts this unit and no other.")
    timeout: float = setting(
        120.0, "How long the restart job plus the unit becoming `active` again may take "
        "before the restart counts as failed (K3s's start includes containerd).",
        duration=True, bounds=(1.0, 3600.0))


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
class PodRemedySettings:
    namespace: str = setting("kube-flannel", "Namespace of the Flannel DaemonSet's pods.")
    label_selector: str = setting("app=flannel", "Label selector of Flannel's pods.")
    ready_timeout: float = setting(
        60.0, "How long the replacement pod may take to be Running and Ready.",
        duration=True, bounds=(1.0, 3600.0))


@dataclass(frozen=True, slots=True)
class RebindSettings:
    """`[remediation.rebind]`: the rung before a Flannel restart (docs/remediation.md)."""

    enabled: bool = setting(
        False, "Before restarting Flannel for a watched peer that is `stalled` or `dead` "
        "while the direct path is up (and the `uplink` check, if configured, is ok), move "
        "the WireGuard device to a fresh random UDP port once: the cloud learns the new "
        "endpoint from the next packet (WireGuard roaming), which a carrier NAT's stale "
        "mapping of port 51820 cannot follow and a restart (same port) does not change. "
        "Counts as an attempt for the circuit and the budget. Off by default.")
    verify_timeout: float = setting(
        45.0, "How long a rebind waits for the tunnel to recover (fresh handshake, rx "
        "growing, tunnel-path MQTT ok) before the ladder climbs to the restart: one "
        "keepalive (25 s on K3s) plus a handshake (5 s), plus the checks' cadence.",
        duration=True, bounds=(1.0, 600.0))


UPLINK_RUNGS = ("modem-reconnect", "radio-cycle", "link-bounce", "modemmanager-restart",
                "usb-reauthorize", "reboot")


@dataclass(frozen=True, slots=True)
class UplinkLadderSettings:
    """`[remediation.uplink]`: the uplink ladder (docs/remediation-uplink.md)."""

    enabled: bool = setting(
        False, "Run the uplink ladder: when the `uplink` check says `stuck`, "
        "`modem_absent`, `modem_failed` or `registration_denied` and every direct-path MQTT "
        "target fails too, try that verdict's rungs one by one. Off by default.")
    dry_run: bool = setting(False, "Log and alert what would be done; do nothing.")
    rungs: tuple[str, ...] = setting(
        UPLINK_RUNGS[:5], "The rungs, in escalation order (a subset of "
        "`modem-reconnect`, `radio-cycle`, `link-bounce`, `modemmanager-restart`, "
        "`usb-reauthorize`, `reboot`). Each verdict takes only its own (`stuck`: "
        "modem-reconnect, radio-cycle, link-bounce, usb-reauthorize, reboot; "
        "`modem_absent`/`modem_failed`: modemmanager-restart, usb-reauthorize, reboot; "
        "`registration_denied`: radio-cycle, at most once an hour). A rung that cannot act "
        "here (no ModemManager, `usb_device` empty, `reboot` false) is skipped. One rung up "
        "per attempt that did not cure.")
    act_after: float = setting(
        300.0, "How long the uplink must have been `stuck` or `registration_denied` (and "
        "every direct-path target failed) before the first rung (`modem_absent` already "
        "waited `[uplink] modem_absent_after`).", duration=True, bounds=(0.0, 86400.0))
    cooldown: float = setting(
        120.0, "Least time between two rungs.", duration=True, bounds=(0.0, 86400.0))
    max_per_hour: int = setting(4, "Most rungs in any sliding hour, across agent restarts.")
    startup_grace: float = setting(
        300.0, "No rung this soon after the agent or the node started (a modem needs "
        "minutes to register after a boot).", duration=True, bounds=(0.0, 86400.0))
    give_up_after: int = setting(
        4, "Rungs in a row that did not cure before the circuit opens (at most the number "
        "of usable rungs): a critical alert, no more rungs until the uplink is ok again or "
        "`edgeheal remediation reset --ladder uplink`.")
    verify_timeout: float = setting(
        90.0, "How long to wait after a rung for the uplink check and every direct-path "
        "target to be ok again (a modem re-registers in tens of seconds).",
        duration=True, bounds=(1.0, 3600.0))
    modemmanager_unit: str = setting(
        "ModemManager.service", "The `modemmanager-restart` rung: the unit restarted over "
        "systemd's D-Bus API (polkit grants exactly `restart` of this unit: "
        "49-edgeheal-uplink.rules).")
    modemmanager_timeout: float = setting(
        60.0, "How long the `modemmanager-restart` rung waits for the restart job and the "
        "unit active again (ModemManager re-probes its modems after that; the ladder's "
        "`verify_timeout` covers it).", duration=True, bounds=(1.0, 600.0))
    usb_device: str = setting(
        "", "The `usb-reauthorize` rung: `modem` (the USB device ModemManager reports for "
        "the modem) or a USB device name under /sys/bus/usb/devices (`1-1`). Empty: the "
        "rung is off (the agent writes to sysfs only where configured).")
    reboot: bool = setting(
        False, "Allow the `reboot` rung (logind's Reboot over D-Bus): at most once a day, "
        "never within `startup_grace` of boot, after its alert is in the outbox.")


BALANCER_STATE = "/var/lib/rancher/k3s/agent/etc/k3s-agent-load-balancer.json"
"""Where K3s's agent keeps its load balancer's server list (k3s-io/k3s#11349)."""


@dataclass(frozen=True, slots=True)
class ControlLadderSettings:
    """`[remediation.control]`: the control ladder (docs/control.md). Off by default; it
    needs the `control` check (`[control]`)."""

    enabled: bool = setting(
        False, "Run the control ladder: restart the K3s agent's unit (over D-Bus, the "
        "`[remediation.service]` unit and its timeout) when the `control` check says "
        "`heartbeat_stale`, `balancer_stuck`, `node_ip_changed` or `not_ready` while a "
        "server answers directly. Never for `server_unreachable`, never while a "
        "direct-path target or the uplink check fails, never while the Flannel or the "
        "uplink ladder acts. Off by default.")
    dry_run: bool = setting(False, "Log and alert what would be done; do nothing.")
    act_after: float = setting(
        60.0, "How long a healable verdict must hold (beyond the check's own debounce) "
        "before the restart.", duration=True, bounds=(0.0, 86400.0))
    not_ready_window: float = setting(
        300.0, "How long `not_ready` must hold before the restart: a node back from an "
        "outage turns Ready by itself.", duration=True, bounds=(0.0, 86400.0))
    cooldown: float = setting(
        600.0, "Least time between two agent restarts.", duration=True,
        bounds=(0.0, 86400.0))
    max_per_hour: int = setting(
        2, "Most agent restarts in any sliding hour, across agent restarts on the same "
        "boot.")
    startup_grace: float = setting(
        300.0, "No restart this soon after edgeheal or the node started (a K3s agent "
        "needs a minute or two to register after a boot).", duration=True,
        bounds=(0.0, 86400.0))
    give_up_after: int = setting(
        3, "Restarts in a row that did not cure before the circuit opens (a critical "
        "alert, no more restarts until the check is ok again or `edgeheal remediation "
        "reset --ladder control`).")
    verify_timeout: float = setting(
        180.0, "How long to wait after a restart for a fresh `ok` of the `control` check "
        "(the kubelet renews its Lease within 10 s of starting; the check confirms it "
        "with two API reads `[control] api_spacing` apart).", duration=True,
        bounds=(1.0, 3600.0))
    balancer_state: str = setting(
        BALANCER_STATE, "For `balancer_stuck`: the agent's load-balancer state file, "
        "removed before the restart when edgeheal may remove it (its directory writable "
        "by the agent's user); otherwise the restart goes ahead without and its alert "
        "says why (`detail.balancer_state`). Empty: never removed.")


@dataclass(frozen=True, slots=True)
class RemediationSettings:
    mode: str = setting(
        "auto", "`pod` deletes this node's Flannel pod (DaemonSet Flannel), `k3s-service` "
        "restarts the k3s/k3s-agent unit (embedded Flannel), `none` only alerts. `auto` "
        "picks `pod` when a Flannel pod runs on this node, else `k3s-service` when the unit "
        "exists, else `none`, and says why in /status and the log.")
    dry_run: bool = setting(False, "Log and alert what would be done; do nothing.")
    cooldown: float = setting(120.0, "Least time between two restarts.", duration=True,
                               bounds=(0.0, 86400.0))
    max_per_hour: int = setting(
        3, "Most restarts in any sliding hour, across agent restarts on the same boot.")
    startup_grace: float = setting(
        60.0, "No restart this soon after the agent or the node started.", duration=True,
        bounds=(0.0, 86400.0))
    give_up_after: int = setting(
        3, "Restarts in a row that did not cure the tunnel before the circuit opens (no "
        "more restarts, a critical alert; it closes when the tunnel is healthy again or on "
        "`edgeheal remediation reset`).")
    verify_timeout: float = setting(
        60.0, "How long to wait for the tunnel to recover after a restart (fresh handshake, "
        "rx growing, tunnel-path MQTT ok).", duration=True, bounds=(0.1, 3600.0))
    uplink_settle: float = setting(
        30.0, "After the direct path comes back from an outage, the tunnel gets this long to "
        "recover by itself before a restart is considered: an uplink outage stalls the "
        "tunnel too, and restarting Flannel the moment the uplink returns would 'heal' an "
        "outage that was never the tunnel's.", duration=True, bounds=(0.0, 3600.0))
    restart_jitter: float = setting(
        30.0, "The first restart of a failure episode waits a random fraction of this long "
        "(uniform, drawn once per episode) after every other safeguard has let it through: "
        "a hub fault fails every edge's tunnel in the same second, and this spreads their "
        "restarts instead of sending them to the K3s server at once. Later restarts of the "
        "same episode keep `cooldown` only. The control ladder's first K3s-agent restart "
        "waits the same way. 0 turns it off.", duration=True, bounds=(0.0, 3600.0))
    pod: PodRemedySettings = field(default_factory=PodRemedySettings)
    service: ServiceSettings = field(default_factory=ServiceSettings)
    rebind: RebindSettings = field(default_factory=RebindSettings)
    uplink: UplinkLadderSettings = field(default_factory=UplinkLadderSettings)
    control: ControlLadderSettings = field(default_factory=ControlLadderSettings)


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


@dataclass(frozen=True, slots=True)
class Config:
    agent: AgentSettings = field(default_factory=AgentSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    offload: OffloadSettings = field(default_factory=OffloadSettings)
    wireguard: WireguardSettings = field(default_factory=WireguardSettings)
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    uplink: UplinkSettings = field(default_factory=UplinkSettings)
    pmtu: PmtuSettings = field(default_factory=PmtuSettings)
    control: ControlSettings = field(default_factory=ControlSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    kubernetes: KubernetesSettings | None = field(
        default=None, metadata=doc("The Kubernetes API ([kubernetes]); absent: not used."))
    remediation: RemediationSettings = field(default_factory=RemediationSettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)
    source: str = field(default="", metadata=doc("internal: the file this came from"))
    sections: frozenset[str] = field(
        default=frozenset(), metadata=doc("internal: the top-level tables the file sets"))

    @property
    def node(self) -> str:
        return self.agent.node_name or socket.gethostname()
