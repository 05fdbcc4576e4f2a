"""The generic cross-field rules, run once after defaults are applied.

Only rules that hold whatever checks and remedies exist live here: the agent's cadence, the
listen addresses, the common keys of *every* check section, the alert outbox, the shared
remediation budget and the Kubernetes client. Check sections are found by type (any
:class:`~edgeheal.config.schema.CheckSettings` in the settings tree, lists included), so a
new check gets ``fail_after``/``timeout``/... checked without being named here. A rule that
concerns one check or one remedy (an MQTT target's port, a WireGuard peer key, the unit the
``k3s-service`` remedy may restart) is that module's ``validate`` hook, run by
:mod:`edgeheal.validation`; this package knows nothing of them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgeheal.config.parse import ConfigError, split_hostport
from edgeheal.config.schema import CheckSettings, Config


def validate(config: Config) -> None:
    """Raise :class:`ConfigError` (without a file; the loader adds it) on the first broken rule."""
    if config.agent.check_interval <= 0:
        raise ConfigError("agent.check_interval", "must be greater than zero")
    if not config.http.listen:
        raise ConfigError("http.listen", "needs at least one address")
    for i, addr in enumerate(config.http.listen):
        try:
            split_hostport(addr)
        except ValueError as err:
            raise ConfigError(f"http.listen[{i}]", str(err)) from None
    for key, check in check_sections(config):
        _validate_check(key, check)
    _validate_alerts(config)
    _validate_remediation(config)


def check_sections(config: Config) -> Iterator[tuple[str, CheckSettings]]:
    """(key path, settings) of every check section, in file order (``mqtt.targets[1]``)."""
    yield from _walk(config, "")


def _walk(value: Any, path: str) -> Iterator[tuple[str, CheckSettings]]:
    if isinstance(value, CheckSettings):
        yield path, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _walk(getattr(value, f.name), f"{path}.{f.name}" if path else f.name)
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]")


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
    if config.alerts.outbox_max_count < 1:
        raise ConfigError("alerts.outbox_max_count", "must be at least 1")
    for key in ("outbox_max_age", "reminder_interval", "reconnect_max"):
        if getattr(config.alerts, key) <= 0:
            raise ConfigError(f"alerts.{key}", "must be greater than zero")
    if not re.fullmatch(r"[^#+\x00]+", config.alerts.topic_prefix.strip("/")):
        raise ConfigError("alerts.topic_prefix",
                          "must be a non-empty MQTT topic without '#', '+' or NUL")


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
    kube = config.kubernetes
    if kube is not None:
        if kube.request_timeout <= 0:
            raise ConfigError("kubernetes.request_timeout", "must be greater than zero")
        if not 0 <= kube.retries <= 10:
            raise ConfigError("kubernetes.retries", f"expected 0-10, got {kube.retries}")
        if kube.kubeconfig and not Path(kube.kubeconfig).is_absolute():
            raise ConfigError("kubernetes.kubeconfig",
                              f"must be an absolute path, got {kube.kubeconfig!r}")
