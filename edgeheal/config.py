"""TOML configuration -> frozen, typed, documented settings, validated once at start-up.

Every setting is a field of a frozen dataclass whose ``doc`` metadata gives its unit,
default and reason; ``docs/configuration.md`` is the rendering of these docstrings and a
test keeps the two in step. Parsing is strict: an unknown key (usually a typo), a wrong
type, a bad duration or a duplicate check name is a :class:`ConfigError` that names the
file, the key path (``wireguard.rekey_failing_after``) and what was expected. The CLI turns
it into exit status 2, which the systemd unit's ``RestartPreventExitStatus=2`` honours, so
a bad config never loops.

Defaults are applied by the dataclasses, then :func:`_validate` runs the cross-field rules.
Fields marked ``secret`` are redacted by :func:`redacted` (``check-config`` prints that).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import json
import os
import re
import socket
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

DEFAULT_PATH = Path("/etc/edgeheal/edgeheal.toml")
ENV_VAR = "EDGEHEAL_CONFIG"
REDACTED = "<redacted>"


class ConfigError(Exception):
    """A configuration problem, with the file and key path it concerns."""

    def __init__(self, key: str, problem: str, *, file: str | os.PathLike[str] = "") -> None:
        self.key, self.problem, self.file = key, problem, str(file)
        where = f"{self.file}: " if self.file else ""
        super().__init__(f"{where}{key}: {problem}" if key else f"{where}{problem}")


def doc(text: str, *, secret: bool = False, duration: bool = False) -> dict[str, Any]:
    return {"doc": text, "secret": secret, "duration": duration}


def setting(default: Any, text: str, **kw: Any) -> Any:
    if isinstance(default, list | dict | set):
        raise TypeError("use a tuple for sequence defaults")
    return field(default=default, metadata=doc(text, **kw))


# --- durations --------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: object) -> float:
    """``"20s"``, ``"2m"``, ``"1h"``, ``"500ms"`` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as \"20s\", \"2m\", \"1h\" or seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    else:
        raise ValueError(
            f"expected a duration such as \"20s\", \"2m\", \"1h\" or seconds, got {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# --- the settings -----------------------------------------------------------------------

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
        "with `interval`.", duration=True)
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
class CheckSettings:
    """The keys every check section accepts, with the same meaning everywhere."""

    enabled: bool = setting(True, "Run this check.")
    interval: float | None = setting(
        None, "Cadence of this check, seconds. Default: `agent.check_interval`.",
        duration=True)
    timeout: float = setting(
        5.0, "A run that takes longer is abandoned and counts as `unknown` (reason "
        "`check_timeout`).", duration=True)
    fail_after: int = setting(
        2, "Consecutive results at least as bad as a new, worse state before it becomes "
        "effective. 2 means one lost packet never flips a probe.")
    recover_after: int = setting(
        2, "Consecutive better results before a bad state clears.")
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
        duration=True)


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
        "`rekey_failing`. auto: 120 s + keepalive + 3 x REKEY_TIMEOUT.", duration=True)
    dead_after: float | Literal["auto"] = setting(
        "auto", "Handshake age that means `dead`. auto: REJECT_AFTER_TIME (180 s) + "
        "keepalive: past it the session is refused.", duration=True)
    rx_stall_after: float | Literal["auto"] = setting(
        "auto", "rx not growing this long while tx grows means `stalled`. auto: 2.5 x the "
        "peer's keepalive interval.", duration=True)
    connect_grace: float = setting(
        30.0, "How long a new interface or peer may take for its first handshake.",
        duration=True)
    required: bool = setting(True, "The check gates `/readyz`.")


@dataclass(frozen=True, slots=True)
class MqttTarget(CheckSettings):
    name: str = setting("", "Target name; also the check's name (`/probe/<name>`).")
    host: str = setting("", "Broker host name or address.")
    port: int = setting(1883, "Broker TCP port.")
    path: Literal["tunnel", "direct"] = setting(
        "direct", "Which network path this target exercises: `tunnel` (through Flannel's "
        "WireGuard, like the collectors) or `direct` (the host's own route).")
    tls: bool = setting(False, "Use TLS (then `ca_file`, optional `cert_file`/`key_file`).")
    ca_file: str = setting("", "CA bundle for TLS. Empty: the system store.")
    cert_file: str = setting("", "Client certificate for TLS client authentication.")
    key_file: str = setting("", "Client key for `cert_file`.")
    server_name: str = setting("", "TLS server name to verify. Default: `host`.")
    protocol: Literal["3.1.1", "5"] = setting("3.1.1", "MQTT protocol version.")
    username: str = setting("", "User name; empty for anonymous.")
    password_file: str = setting(
        "", "File holding the password (never the password inline).")
    client_id: str = setting("", "Client id. Default: `edgeheal-<node>-<target>`.")
    keepalive: float = setting(
        20.0, "MQTT keepalive of the kept-open alert connection, seconds. It is the direct "
        "path's reachability signal, so it must notice an outage before the tunnel check "
        "blames the tunnel: keep it well below the tunnel's stall window (2.5 x Flannel's "
        "25 s WireGuard keepalive). 20 s costs about 0.7 MB a day.", duration=True)
    interval: float | None = setting(
        60.0, "Probe cadence. One probe is one CONNECT/CONNACK/DISCONNECT (~100 bytes "
        "plus TCP).", duration=True)
    timeout: float = setting(5.0, "A probe that takes longer is `timeout`.", duration=True)


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
        1800.0, "While a problem lasts, a reminder alert this often.", duration=True)
    outbox_max_count: int = setting(
        10000, "Most alerts kept while the broker is unreachable; the oldest are dropped.")
    outbox_max_age: float = setting(
        7 * 86400.0, "Alerts older than this are dropped from the outbox.", duration=True)
    reconnect_max: float = setting(
        60.0, "Cap of the jittered exponential backoff between reconnects of the alert "
        "connection (it starts at 1 s).", duration=True)


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
        duration=True)


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    kubeconfig: str = setting(
        "", "Kubeconfig file for the agent's own service account (client certificate or "
        "token, custom CA: K3s's format; `edgeheal kubeconfig` writes one). Empty: in-cluster "
        "service-account credentials. Never K3s's admin `k3s.yaml`. The section's presence "
        "enables the Kubernetes side (pods, Events on the Node, the Node condition).")
    context: str = setting("", "Kubeconfig context to use. Empty: the current context.")
    request_timeout: float = setting(
        10.0, "Timeout of every single API call.", duration=True)
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
        duration=True)


@dataclass(frozen=True, slots=True)
class RemediationSettings:
    mode: Literal["auto", "pod", "k3s-service", "none"] = setting(
        "auto", "`pod` deletes this node's Flannel pod (DaemonSet Flannel), `k3s-service` "
        "restarts the k3s/k3s-agent unit (embedded Flannel), `none` only alerts. `auto` "
        "picks `pod` when a Flannel pod runs on this node, else `k3s-service` when the unit "
        "exists, else `none`, and says why in /status and the log.")
    dry_run: bool = setting(False, "Log and alert what would be done; do nothing.")
    cooldown: float = setting(120.0, "Least time between two restarts.", duration=True)
    max_per_hour: int = setting(
        3, "Most restarts in any sliding hour, across agent restarts on the same boot.")
    startup_grace: float = setting(
        60.0, "No restart this soon after the agent or the node started.", duration=True)
    give_up_after: int = setting(
        3, "Restarts in a row that did not cure the tunnel before the circuit opens (no "
        "more restarts, a critical alert; it closes when the tunnel is healthy again or on "
        "`edgeheal remediation reset`).")
    verify_timeout: float = setting(
        60.0, "How long to wait for the tunnel to recover after a restart (fresh handshake, "
        "rx growing, tunnel-path MQTT ok).", duration=True)
    uplink_settle: float = setting(
        30.0, "After the direct path comes back from an outage, the tunnel gets this long to "
        "recover by itself before a restart is considered: an uplink outage stalls the "
        "tunnel too, and restarting Flannel the moment the uplink returns would 'heal' an "
        "outage that was never the tunnel's.", duration=True)
    pod: PodRemedySettings = field(default_factory=PodRemedySettings)
    service: ServiceSettings = field(default_factory=ServiceSettings)


@dataclass(frozen=True, slots=True)
class Config:
    agent: AgentSettings = field(default_factory=AgentSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    offload: OffloadSettings = field(default_factory=OffloadSettings)
    wireguard: WireguardSettings = field(default_factory=WireguardSettings)
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    kubernetes: KubernetesSettings | None = field(
        default=None, metadata=doc("The Kubernetes API ([kubernetes]); absent: not used."))
    remediation: RemediationSettings = field(default_factory=RemediationSettings)
    source: str = field(default="", metadata=doc("internal: the file this came from"))

    @property
    def node(self) -> str:
        return self.agent.node_name or socket.gethostname()


# --- parsing ----------------------------------------------------------------------------

def _type_name(tp: Any, duration: bool = False) -> str:
    if duration and tp is float:
        return 'a duration such as "20s", "2m", "1h" or seconds'
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(a, duration) for a in typing.get_args(tp)
                           if a is not type(None))
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, str(tp))


def _convert(tp: Any, value: Any, key: str, duration: bool) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise ValueError(f"expected {_type_name(tp)}, got {value!r}")
    if origin in (types.UnionType, typing.Union):
        errors = []
        for alt in typing.get_args(tp):
            if alt is type(None):
                continue
            try:
                return _convert(alt, value, key, duration)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(f"expected {_type_name(tp, duration)}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError(f"expected {_type_name(tp)}, got {value!r}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_convert(item, v, f"{key}[{i}]", duration) for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"expected a table, got {value!r}")
        return _parse(tp, value, key)  # type: ignore[arg-type]
    if tp is float and duration:
        return parse_duration(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ValueError(f"expected {_type_name(tp)}, got {value!r}")


class _KeyError(Exception):
    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key, self.problem = key, problem


def _parse(cls: type[Any], table: Mapping[str, Any], path: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    hints = typing.get_type_hints(cls)
    for key in table:
        if key not in fields:
            near = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            known = ", ".join(sorted(fields))
            raise _KeyError(_join(path, key), f"unknown key{hint} (known keys: {known})")
    kwargs = {}
    for name, value in table.items():
        key = _join(path, name)
        try:
            kwargs[name] = _convert(hints[name], value, key,
                                    bool(fields[name].metadata.get("duration")))
        except _KeyError:
            raise
        except ValueError as err:
            raise _KeyError(key, str(err)) from None
    return cls(**kwargs)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """Read, parse and validate the configuration; raise :class:`ConfigError`."""
    file = Path(path or os.environ.get(ENV_VAR) or DEFAULT_PATH)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("", "no such configuration file", file=file) from None
    except OSError as err:
        raise ConfigError("", f"cannot read: {err.strerror}", file=file) from None
    return loads(text, source=str(file))


def loads(text: str, *, source: str = "<string>") -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError("", f"not valid TOML: {err}", file=source) from None
    try:
        config: Config = _parse(Config, data, "")
    except _KeyError as err:
        raise ConfigError(err.key, err.problem, file=source) from None
    config = dataclasses.replace(config, source=source)
    try:
        _validate(config)
    except _KeyError as err:
        raise ConfigError(err.key, err.problem, file=source) from None
    return config


def _validate(config: Config) -> None:
    """Cross-field rules, after defaults are applied."""
    _validate_remediation(config)
    _validate_service(config.remediation.service)
    if config.agent.check_interval <= 0:
        raise _KeyError("agent.check_interval", "must be greater than zero")
    if not config.http.listen:
        raise _KeyError("http.listen", "needs at least one address")
    for i, addr in enumerate(config.http.listen):
        try:
            split_hostport(addr)
        except ValueError as err:
            raise _KeyError(f"http.listen[{i}]", str(err)) from None
    checks: list[tuple[str, CheckSettings]] = [
        ("offload", config.offload), ("wireguard", config.wireguard)]
    seen = {"offload": "offload", "wireguard": "wireguard"}
    for i, target in enumerate(config.mqtt.targets):
        key = f"mqtt.targets[{i}]"
        if not target.name:
            raise _KeyError(f"{key}.name", "is required")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", target.name):
            raise _KeyError(f"{key}.name",
                            "use letters, digits, '-', '_' and '.' (it is a URL path part)")
        if target.name in seen:
            raise _KeyError(f"{key}.name",
                            f"duplicate check name {target.name!r} (also {seen[target.name]})")
        seen[target.name] = key
        if not target.host:
            raise _KeyError(f"{key}.host", "is required")
        if not 0 < target.port < 65536:
            raise _KeyError(f"{key}.port", f"expected 1-65535, got {target.port}")
        if target.tls is False and (target.ca_file or target.cert_file or target.key_file):
            raise _KeyError(f"{key}.tls", "ca_file/cert_file/key_file are set but tls = false")
        if bool(target.cert_file) != bool(target.key_file):
            raise _KeyError(f"{key}.key_file", "cert_file and key_file go together")
        checks.append((key, target))
    for key, check in checks:
        if check.fail_after < 1:
            raise _KeyError(f"{key}.fail_after", "must be at least 1")
        if check.recover_after < 1:
            raise _KeyError(f"{key}.recover_after", "must be at least 1")
        if check.timeout <= 0:
            raise _KeyError(f"{key}.timeout", "must be greater than zero")
        if check.interval is not None and check.interval <= 0:
            raise _KeyError(f"{key}.interval", "must be greater than zero")
    if config.alerts.target and config.alerts.target not in {
            t.name for t in config.mqtt.targets}:
        names = ", ".join(t.name for t in config.mqtt.targets) or "none configured"
        raise _KeyError("alerts.target",
                        f"no [[mqtt.targets]] entry named {config.alerts.target!r} ({names})")
    _validate_mqtt_alerts(config)
    for i, pattern in enumerate(config.offload.interfaces):
        if not pattern or "/" in pattern:
            raise _KeyError(f"offload.interfaces[{i}]", f"not an interface name: {pattern!r}")
    _validate_features(config.offload.features)
    if isinstance(config.wireguard.watch_peers, str) and config.wireguard.watch_peers != "auto":
        raise _KeyError("wireguard.watch_peers",
                        "expected \"auto\" or a list of public keys and/or CIDRs")
    _validate_wireguard(config.wireguard)


def _validate_remediation(config: Config) -> None:
    """[kubernetes], [remediation] and [remediation.pod] rules (Remediation I)."""
    rem = config.remediation
    for key, value in (("cooldown", rem.cooldown), ("startup_grace", rem.startup_grace)):
        if value < 0:
            raise _KeyError(f"remediation.{key}", "cannot be negative")
    if rem.max_per_hour < 1:
        raise _KeyError("remediation.max_per_hour",
                        "must be at least 1 (use mode = \"none\" to never restart)")
    if rem.give_up_after < 1:
        raise _KeyError("remediation.give_up_after", "must be at least 1")
    if rem.verify_timeout <= 0:
        raise _KeyError("remediation.verify_timeout", "must be greater than zero")
    if rem.pod.ready_timeout <= 0:
        raise _KeyError("remediation.pod.ready_timeout", "must be greater than zero")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", rem.pod.namespace):
        raise _KeyError("remediation.pod.namespace",
                        f"not a Kubernetes namespace name: {rem.pod.namespace!r}")
    if not rem.pod.label_selector.strip():
        raise _KeyError("remediation.pod.label_selector",
                        "is required (it selects Flannel's pods, e.g. \"app=flannel\")")
    if rem.mode == "pod" and config.kubernetes is None:
        raise _KeyError("remediation.mode",
                        "\"pod\" needs a [kubernetes] section (kubeconfig or in-cluster)")
    kube = config.kubernetes
    if kube is not None:
        if kube.request_timeout <= 0:
            raise _KeyError("kubernetes.request_timeout", "must be greater than zero")
        if not 0 <= kube.retries <= 10:
            raise _KeyError("kubernetes.retries", f"expected 0-10, got {kube.retries}")
        if kube.kubeconfig and not Path(kube.kubeconfig).is_absolute():
            raise _KeyError("kubernetes.kubeconfig",
                            f"must be an absolute path, got {kube.kubeconfig!r}")


def _validate_wireguard(wg: WireguardSettings) -> None:
    import base64  # noqa: PLC0415
    import binascii  # noqa: PLC0415
    import ipaddress  # noqa: PLC0415

    for i, name in enumerate(wg.interfaces):
        if not name or len(name) > 15 or "/" in name or any(c.isspace() for c in name):
            raise _KeyError(f"wireguard.interfaces[{i}]", f"not an interface name: {name!r}")
    if isinstance(wg.watch_peers, tuple):
        if not wg.watch_peers:
            raise _KeyError("wireguard.watch_peers",
                            "an empty list watches nothing; use \"auto\" or name peers")
        for i, entry in enumerate(wg.watch_peers):
            try:
                if len(base64.b64decode(entry, validate=True)) == 32:
                    continue
            except (binascii.Error, ValueError):
                pass
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise _KeyError(f"wireguard.watch_peers[{i}]",
                                f"expected a base64 public key (44 characters) or an "
                                f"endpoint CIDR, got {entry!r}") from None
    for key in ("rekey_failing_after", "dead_after", "rx_stall_after", "connect_grace"):
        value = getattr(wg, key)
        if isinstance(value, float) and value <= 0:
            raise _KeyError(f"wireguard.{key}", "must be greater than zero")
    if (isinstance(wg.rekey_failing_after, float) and isinstance(wg.dead_after, float)
            and wg.rekey_failing_after >= wg.dead_after):
        raise _KeyError("wireguard.rekey_failing_after",
                        f"must be less than dead_after ({format_duration(wg.dead_after)})")


def _validate_mqtt_alerts(config: Config) -> None:
    """The [[mqtt.targets]] and [alerts] rules beyond names, hosts and ports."""
    for i, target in enumerate(config.mqtt.targets):
        if target.keepalive < 1 or target.keepalive > 65535:
            raise _KeyError(f"mqtt.targets[{i}].keepalive", "expected 1s to 65535s")
        if target.password_file and not target.username and target.protocol == "3.1.1":
            raise _KeyError(f"mqtt.targets[{i}].username",
                            "MQTT 3.1.1 sends a password only with a user name")
    if config.alerts.outbox_max_count < 1:
        raise _KeyError("alerts.outbox_max_count", "must be at least 1")
    for key in ("outbox_max_age", "reminder_interval", "reconnect_max"):
        if getattr(config.alerts, key) <= 0:
            raise _KeyError(f"alerts.{key}", "must be greater than zero")
    if not re.fullmatch(r"[^#+\x00]+", config.alerts.topic_prefix.strip("/")):
        raise _KeyError("alerts.topic_prefix",
                        "must be a non-empty MQTT topic without '#', '+' or NUL")


def _validate_features(features: tuple[str, ...]) -> None:
    from edgeheal.features import KERNEL_FEATURES  # noqa: PLC0415 - small, pure table

    for i, name in enumerate(features):
        if name not in KERNEL_FEATURES:
            near = difflib.get_close_matches(name, KERNEL_FEATURES, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            valid = ", ".join(sorted(KERNEL_FEATURES))
            raise _KeyError(f"offload.features[{i}]",
                            f"unknown feature {name!r}{hint}; valid names: {valid}")


K3S_UNIT_PATTERN = re.compile(r"k3s[A-Za-z0-9:_.\\-]{0,200}\.service")
"""The units the `k3s-service` remedy may restart: K3s's own (`k3s`, `k3s-agent`,
`k3s-<INSTALL_K3S_NAME>`), never an arbitrary unit."""


def _validate_service(service: ServiceSettings, key: str = "remediation.service") -> None:
    if service.unit != "auto" and not K3S_UNIT_PATTERN.fullmatch(service.unit):
        raise _KeyError(f"{key}.unit",
                        f"expected \"auto\" or a K3s service unit such as "
                        f"\"k3s-agent.service\" or \"k3s.service\", got {service.unit!r}")
    if service.timeout <= 0:
        raise _KeyError(f"{key}.timeout", "must be greater than zero")


def split_hostport(addr: str) -> tuple[str, int]:
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", addr)
    if not m:
        raise ValueError(f"expected host:port or [v6]:port, got {addr!r}")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if not 0 <= int(port) < 65536:
        raise ValueError(f"port out of range in {addr!r}")
    return host, int(port)


def matches(patterns: tuple[str, ...], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


# --- rendering --------------------------------------------------------------------------

def redacted(obj: Any) -> Any:
    """A JSON-ready copy with secret fields replaced; what ``check-config`` prints."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if f.name == "source":
                continue
            value = getattr(obj, f.name)
            if f.metadata.get("secret") and value:
                out[f.name] = REDACTED
            elif f.metadata.get("duration") and isinstance(value, float):
                out[f.name] = format_duration(value)
            else:
                out[f.name] = redacted(value)
        return out
    if isinstance(obj, tuple):
        return [redacted(v) for v in obj]
    return obj


def reference() -> list[tuple[str, str, str]]:
    """(key path, default, doc) for every key: the source of docs/configuration.md."""
    rows: list[tuple[str, str, str]] = []

    def walk(cls: type[Any], path: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name == "source":
                continue
            tp, key = hints[f.name], _join(path, f.name)
            if typing.get_origin(tp) in (types.UnionType, typing.Union):
                tables = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
                tp = tables[0] if tables else tp  # an optional section: document its keys
            sub = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
            if dataclasses.is_dataclass(sub):
                walk(sub, key + ("[]" if sub is not tp else ""))  # type: ignore[arg-type]
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            shown = (format_duration(default) if f.metadata.get("duration")
                     and isinstance(default, float) else default)
            rows.append((key, json.dumps(shown), f.metadata.get("doc", "")))

    walk(Config, "")
    return rows
