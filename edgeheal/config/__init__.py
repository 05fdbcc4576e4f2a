"""TOML configuration -> frozen, typed, documented settings, validated once at start-up.

The bottom of the house: every layer reads settings, so this package imports nothing of
edgeheal's but the standard library. Its jobs, one module each:

- :mod:`~edgeheal.config.schema`: the settings dataclasses, each field documenting its
  unit, default and reason;
- :mod:`~edgeheal.config.parse`: strict TOML -> dataclasses, durations, ``host:port``;
- :mod:`~edgeheal.config.validate`: the generic cross-field rules;
- :mod:`~edgeheal.config.render`: the redacted effective config and the reference that
  ``docs/configuration.md`` is generated from.

:func:`load`/:func:`loads` here parse and apply the generic rules only. Each check and
remedy module has rules of its own (an MQTT target's port, the unit a remedy may restart);
they sit above this layer, so the loader that also runs them is
:func:`edgeheal.validation.load`, which everything that loads a config for real use calls.
Every problem is a :class:`ConfigError` naming the file and the key path; the CLI turns it
into exit status 2, which the systemd unit's ``RestartPreventExitStatus=2`` honours, so a
bad config never loops.
"""

from __future__ import annotations

import os
from pathlib import Path

from edgeheal.config import parse, validate
from edgeheal.config.parse import ConfigError, format_duration, parse_duration, split_hostport
from edgeheal.config.render import REDACTED, redacted, reference
from edgeheal.config.schema import (
    OFFLOAD_DEFAULT_FEATURES,
    AgentSettings,
    AlertSettings,
    CheckSettings,
    Config,
    HttpSettings,
    KubernetesSettings,
    MqttSettings,
    MqttTarget,
    OffloadSettings,
    PodRemedySettings,
    RemediationSettings,
    ServiceSettings,
    WireguardSettings,
    doc,
    setting,
)
from edgeheal.config.validate import check_sections

DEFAULT_PATH = Path("/etc/edgeheal/edgeheal.toml")
ENV_VAR = "EDGEHEAL_CONFIG"


def read(path: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """(text, file name) of the configuration: ``path``, else ``$EDGEHEAL_CONFIG``, else
    :data:`DEFAULT_PATH`."""
    file = Path(path or os.environ.get(ENV_VAR) or DEFAULT_PATH)
    try:
        return file.read_text(encoding="utf-8"), str(file)
    except FileNotFoundError:
        raise ConfigError("", "no such configuration file", file=file) from None
    except OSError as err:
        raise ConfigError("", f"cannot read: {err.strerror}", file=file) from None


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """Read, parse and apply the generic rules; raise :class:`ConfigError`."""
    text, source = read(path)
    return loads(text, source=source)


def loads(text: str, *, source: str = "<string>") -> Config:
    """Parse ``text`` and apply the generic rules (not the checks' and remedies' own)."""
    config = parse.parse(text, source=source)
    try:
        validate.validate(config)
    except ConfigError as err:
        raise err.located(source) from None
    return config


__all__ = [
    "DEFAULT_PATH", "ENV_VAR", "OFFLOAD_DEFAULT_FEATURES", "REDACTED", "AgentSettings",
    "AlertSettings", "CheckSettings", "Config", "ConfigError", "HttpSettings",
    "KubernetesSettings", "MqttSettings", "MqttTarget", "OffloadSettings", "PodRemedySettings",
    "RemediationSettings", "ServiceSettings", "WireguardSettings", "check_sections", "doc",
    "format_duration", "load", "loads", "parse_duration", "read", "redacted", "reference",
    "setting", "split_hostport",
]
