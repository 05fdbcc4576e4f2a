"""The generic cross-field rules, run once after defaults are applied.

Only rules that hold whatever checks and remedies exist live here: the agent's identity and
state directory, the listen addresses, the common keys of *every* check section, the alert
outbox and its topics, the shared remediation budget, the Kubernetes client and every path
to a file. Check sections are found by type (any
:class:`~edgeheal.config.schema.checks.CheckSettings` in the settings tree, lists included), so a
new check gets ``fail_after``/``timeout``/... checked without being named here; file paths
are found by their ``file`` mark the same way. A rule that concerns one check or one remedy
(an MQTT target's port, a WireGuard peer key, the unit the ``k3s-service`` remedy may
restart) is that module's ``validate`` hook, run by :mod:`edgeheal.settings`; this package
knows nothing of them.

Why these rules (issue 17): ``node_name`` is a Kubernetes node name in API paths and field
selectors and a level of the alert and status topics, so a ``#`` or ``+`` in it made every
alert undeliverable behind a misleading ``protocol_error``; listen addresses are IP literals
because a host name costs a DNS look-up at every start and may resolve to several
addresses, and two entries for one socket made the second bind fail after start-up (exit 3
instead of 2); ``state_dir`` must be absolute, or the agent writes its outbox wherever it
happens to be started.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from edgeheal.config.parse import ConfigError, show, split_hostport
from edgeheal.config.schema import Config
from edgeheal.config.schema.checks import CheckSettings
from edgeheal.config.schema.remediation import UPLINK_RUNGS

NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A Kubernetes node name: an RFC 1123 DNS subdomain (at most 253 characters)."""
NODE_NAME_MAX = 253
TOPIC_MAX_BYTES = 65535
"""MQTT strings, topics included, are at most 65535 bytes of UTF-8."""
_MQTT_FORBIDDEN = re.compile(r"[#+\x00-\x1f\x7f-\x9f]")
"""Wildcards, NUL and the control characters MQTT strings should not hold (brokers such as
mosquitto refuse them)."""
UNIX_PATH_MAX = 107
"""Longest unix socket path, bytes (``sun_path`` is 108 with its NUL)."""
CONTROL_SOCKET = "/control.sock"
"""The control socket under ``state_dir`` (``edgeheal.boundaries.control_socket.SOCKET_NAME``; a
test keeps the two in step: this package may not import the control boundary)."""


def validate(config: Config) -> None:
    """Raise :class:`ConfigError` (without a file; the loader adds it) on the first broken rule."""
    _validate_agent(config)
    _validate_listen(config.http.listen)
    for key, check in check_sections(config):
        _validate_check(key, check)
    _validate_alerts(config)
    _validate_remediation(config)
    _validate_uplink_ladder(config)
    _validate_control_ladder(config)
    for key, path in file_settings(config):
        if not PurePosixPath(path).is_absolute():
            raise ConfigError(key, f"must be an absolute path, got {show(path)}")


def check_sections(config: Config) -> Iterator[tuple[str, CheckSettings]]:
    """(key path, settings) of every check section, in file order (``mqtt.targets[1]``)."""
    yield from _walk(config, "")


def file_settings(config: Config) -> Iterator[tuple[str, str]]:
    """(key path, path) of every non-empty setting marked ``file`` (``mqtt.targets[0].ca_file``,
    ``kubernetes.kubeconfig``): the files the agent will open."""
    for key, field, value in _leaves(config, ""):
        if field.metadata.get("file") and isinstance(value, str) and value:
            yield key, value


def _walk(value: Any, path: str) -> Iterator[tuple[str, CheckSettings]]:
    if isinstance(value, CheckSettings):
        yield path, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _walk(getattr(value, f.name), f"{path}.{f.name}" if path else f.name)
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")


def _leaves(value: Any, path: str) -> Iterator[tuple[str, dataclasses.Field[Any], Any]]:
    """(key path, field, value) of every setting that is not a table."""
    for f in dataclasses.fields(value):
        key, item = f"{path}.{f.name}" if path else f.name, getattr(value, f.name)
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            yield from _leaves(item, key)
        elif isinstance(item, tuple) and item and dataclasses.is_dataclass(item[0]):
            for i, entry in enumerate(item):
                yield from _leaves(entry, f"{key}[{i}]")
        else:
            yield key, f, item


def _validate_agent(config: Config) -> None:
    agent = config.agent
    if agent.check_interval <= 0:
        raise ConfigError("agent.check_interval", "must be greater than zero")
    state = agent.state_dir
    if not state.strip():
        raise ConfigError("agent.state_dir", "is empty: give an absolute directory such as "
                          "\"/var/lib/edgeheal\"")
    if not PurePosixPath(state).is_absolute():
        raise ConfigError("agent.state_dir", f"must be an absolute path, got {show(state)} "
                          "(a relative one would depend on where the agent is started)")
    if len((state.rstrip("/") + CONTROL_SOCKET).encode()) > UNIX_PATH_MAX:
        raise ConfigError("agent.state_dir", f"is too long: {CONTROL_SOCKET[1:]} in it must "
                          f"fit a unix socket address ({UNIX_PATH_MAX} bytes)")
    if agent.node_name:
        if len(agent.node_name) > NODE_NAME_MAX or not NODE_NAME.fullmatch(agent.node_name):
            raise ConfigError("agent.node_name", f"not a Kubernetes node name: "
                              f"{show(agent.node_name)} (lower-case letters, digits, '-' "
                              "and '.', starting and ending with a letter or digit, at most "
                              "253 characters; it is the node's name in API calls and a "
                              "level of the MQTT alert topics)")
    else:
        problem = topic_level_problem(config.node)
        if problem:
            raise ConfigError("agent.node_name", f"is not set, and this machine's host name "
                              f"{show(config.node)} cannot stand in for it ({problem}); set "
                              "node_name as in `kubectl get nodes`")


def topic_level_problem(text: str) -> str:
    """Why ``text`` cannot be (part of) an MQTT topic name we publish to, or ``""``."""
    if not text:
        return "it is empty"
    if bad := _MQTT_FORBIDDEN.search(text):
        return (f"it contains {bad.group()!r}: MQTT topic names cannot hold the wildcards "
                "'#' and '+', NUL or control characters")
    if len(text.encode("utf-8", "surrogatepass")) > TOPIC_MAX_BYTES:
        return f"it is longer than MQTT's {TOPIC_MAX_BYTES} bytes"
    return ""


def _validate_listen(listen: tuple[str, ...]) -> None:
    if not listen:
        raise ConfigError("http.listen", "needs at least one address")
    bound: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]] = []
    for i, addr in enumerate(listen):
        key = f"http.listen[{i}]"
        try:
            host, port = split_hostport(addr)
        except ValueError as err:
            raise ConfigError(key, str(err)) from None
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(key, f"expected an IP address, got the host name {show(host)} "
                              "(a name costs a DNS look-up at every start and may stand for "
                              f"several addresses): e.g. \"127.0.0.1:{port}\" or "
                              f"\"[::1]:{port}\"") from None
        for j, (other, other_port) in enumerate(bound):
            if port and port == other_port and ip.version == other.version and (
                    ip == other or ip.is_unspecified or other.is_unspecified):
                how = "repeats" if ip == other else "overlaps"
                raise ConfigError(key, f"{addr} {how} http.listen[{j}] ({listen[j]}): the "
                                  "same port cannot be bound twice")
        bound.append((ip, port))


def _validate_check(key: str, check: CheckSettings) -> None:
    if check.fail_after < 1:
        raise ConfigError(f"{key}.fail_after", "must be at least 1")
    if check.recover_after < 1:
        raise ConfigError(f"{key}.recover_after", "must be at least 1")
    if check.timeout <= 0:
        raise ConfigError(f"{key}.timeout", "must be greater than zero")
    if check.interval is not None and check.interval <= 0:
        raise ConfigError(f"{key}.interval", "must be greater than zero")


def _validate_alerts(config: Config) -> None:
    """The outbox and topic rules; which target alerts go through is the MQTT check's rule."""
    alerts = config.alerts
    if alerts.outbox_max_count < 1:
        raise ConfigError("alerts.outbox_max_count", "must be at least 1")
    for key in ("outbox_max_age", "reminder_interval", "reconnect_max"):
        if getattr(alerts, key) <= 0:
            raise ConfigError(f"alerts.{key}", "must be greater than zero")
    prefix = alerts.topic_prefix.strip("/")
    problem = topic_level_problem(prefix)
    if problem:
        raise ConfigError("alerts.topic_prefix", f"is not a usable MQTT topic: {problem}")
    if prefix.startswith("$"):
        raise ConfigError("alerts.topic_prefix", "cannot start with '$': such topics are the "
                          "broker's own ($SYS)")
    if config.fleet.hold and not alerts.target:
        raise ConfigError("fleet.hold", "needs [alerts] target: the hold is heard on the "
                          "alert connection")
    longest = f"{prefix}/{config.node}/alerts"  # as the alert engine builds its topics
    if len(longest.encode("utf-8", "surrogatepass")) > TOPIC_MAX_BYTES:
        raise ConfigError("alerts.topic_prefix", f"the alert topic <prefix>/<node>/alerts "
                          f"is longer than MQTT's {TOPIC_MAX_BYTES} bytes")


def _validate_remediation(config: Config) -> None:
    """[remediation]'s shared budget and [kubernetes]; each remedy checks its own table."""
    rem = config.remediation
    for key, value in (("cooldown", rem.cooldown), ("startup_grace", rem.startup_grace)):
        if value < 0:
            raise ConfigError(f"remediation.{key}", "cannot be negative")
    if rem.max_per_hour < 1:
        raise ConfigError("remediation.max_per_hour",
                          "must be at least 1 (use mode = \"none\" to never restart)")
    if rem.give_up_after < 1:
        raise ConfigError("remediation.give_up_after", "must be at least 1")
    if rem.verify_timeout <= 0:
        raise ConfigError("remediation.verify_timeout", "must be greater than zero")
    _validate_kubernetes(config)


def _validate_uplink_ladder(config: Config) -> None:
    """[remediation.uplink]: known rungs, each once; its budget; and, when enabled, the
    evidence it needs (the ``uplink`` check and a direct-path target to confirm it)."""
    ladder, key = config.remediation.uplink, "remediation.uplink"
    for rung in ladder.rungs:
        if rung not in UPLINK_RUNGS:
            raise ConfigError(f"{key}.rungs", "expected a subset of "
                              + ", ".join(map(repr, UPLINK_RUNGS)) + f", got {show(rung)}")
    if len(set(ladder.rungs)) != len(ladder.rungs):
        raise ConfigError(f"{key}.rungs", "names a rung twice")
    if ladder.max_per_hour < 1:
        raise ConfigError(f"{key}.max_per_hour", "must be at least 1 (use enabled = false)")
    if ladder.give_up_after < 1:
        raise ConfigError(f"{key}.give_up_after", "must be at least 1")
    if ladder.reboot and "reboot" not in ladder.rungs:
        raise ConfigError(f"{key}.reboot", "is true but \"reboot\" is not in rungs")
    if not ladder.enabled:
        return
    if not config.uplink.interfaces or not config.uplink.enabled:
        raise ConfigError(f"{key}.enabled", "the uplink ladder needs the uplink check: set "
                          "[uplink] interfaces")
    if not any(t.path == "direct" and t.enabled for t in config.mqtt.targets):
        raise ConfigError(f"{key}.enabled", "the uplink ladder acts only when every "
                          "direct-path MQTT target fails too: configure one "
                          "([[mqtt.targets]] with path = \"direct\")")


def _validate_control_ladder(config: Config) -> None:
    """[remediation.control]: its budget, an absolute ``balancer_state``, and, when enabled,
    the ``control`` check it acts on."""
    ladder, key = config.remediation.control, "remediation.control"
    if ladder.max_per_hour < 1:
        raise ConfigError(f"{key}.max_per_hour", "must be at least 1 (use enabled = false)")
    if ladder.give_up_after < 1:
        raise ConfigError(f"{key}.give_up_after", "must be at least 1")
    if ladder.balancer_state and not PurePosixPath(ladder.balancer_state).is_absolute():
        raise ConfigError(f"{key}.balancer_state",
                          f"must be an absolute path, got {show(ladder.balancer_state)}")
    if ladder.enabled and ("control" not in config.sections or not config.control.enabled):
        raise ConfigError(f"{key}.enabled", "the control ladder acts on the control check: "
                          "configure [control] (its servers)")


def _validate_kubernetes(config: Config) -> None:
    kube = config.kubernetes
    if kube is not None:
        if kube.request_timeout <= 0:
            raise ConfigError("kubernetes.request_timeout", "must be greater than zero")
        if not 0 <= kube.retries <= 10:
            raise ConfigError("kubernetes.retries", f"expected 0-10, got {kube.retries}")
