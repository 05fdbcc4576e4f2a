"""The checks' sections: :class:`CheckSettings`, the keys every check section accepts,
and one subclass per check (``[offload]``, ``[wireguard]``, ``[uplink]``, ``[pmtu]``,
``[control]``, each ``[[mqtt.targets]]`` entry).

The generic rules (:mod:`edgeheal.config.validate`) find every :class:`CheckSettings` in the
tree by type, so a new check's section is a subclass here and nothing else in this package;
its own rules live with its registration (docs/architecture.md, "Settings stay typed at the
bottom").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edgeheal.config.schema.agent import AgentSettings
from edgeheal.config.schema.fields import setting


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
