"""TOML configuration -> frozen, typed, documented settings, validated once at start-up.

The bottom of the house: every layer reads settings, so this package imports nothing of
edgeheal's but the standard library. Its jobs, one module each:

- :mod:`~edgeheal.config.schema`: the settings dataclasses, each field documenting its
  unit, default and reason (a package: the agent's, the checks' and the remedies'
  sections, under :class:`Config`);
- :mod:`~edgeheal.config.parse`: strict TOML -> dataclasses, durations, ``host:port``;
- :mod:`~edgeheal.config.validate`: the generic cross-field rules;
- :mod:`~edgeheal.config.render`: the redacted effective config and the reference that
  ``docs/configuration.md`` is generated from.

:func:`load`/:func:`loads` here parse and apply the generic rules only. Each check and
remedy module has rules of its own (an MQTT target's port, the unit a remedy may restart);
they sit above this layer, so the loader that also runs them is
:func:`edgeheal.settings.load`, which everything that loads a config for real use calls.
Every problem is a :class:`ConfigError` naming the file and the key path; the CLI turns it
into exit status 2, which the systemd unit's ``RestartPreventExitStatus=2`` honours, so a
bad config never loops.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from edgeheal.config import parse, validate
from edgeheal.config.parse import ConfigError, format_duration, parse_duration, split_hostport
from edgeheal.config.render import REDACTED, redacted, reference
from edgeheal.config.schema import Config
from edgeheal.config.schema.agent import (
    AgentSettings,
    AlertSettings,
    FleetSettings,
    HttpSettings,
    KubernetesSettings,
    MetricsSettings,
)
from edgeheal.config.schema.checks import (
    OFFLOAD_DEFAULT_FEATURES,
    CheckSettings,
    ControlSettings,
    MqttSettings,
    MqttTarget,
    OffloadSettings,
    PmtuSettings,
    UplinkCost,
    UplinkSettings,
    WireguardSettings,
)
from edgeheal.config.schema.fields import doc, setting
from edgeheal.config.schema.remediation import (
    ControlLadderSettings,
    PodRemedySettings,
    RebindSettings,
    RemediationSettings,
    ServiceSettings,
    UplinkLadderSettings,
)
from edgeheal.config.validate import check_sections, file_settings

DEFAULT_PATH = Path("/etc/edgeheal/edgeheal.toml")
ENV_VAR = "EDGEHEAL_CONFIG"


MAX_SIZE = 1 << 20
"""Largest configuration file read, bytes (the example is about 2 KB)."""


def read(path: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """(text, file name) of the configuration: ``path``, else ``$EDGEHEAL_CONFIG``, else
    :data:`DEFAULT_PATH` (an empty ``$EDGEHEAL_CONFIG`` counts as unset; an empty ``path``,
    i.e. ``--config ""``, is an error, never a fall-back to another file).

    Only a regular file of at most :data:`MAX_SIZE` bytes of UTF-8 is read: a FIFO, a
    device (``/dev/zero``), a socket or a directory is refused at once, without a read
    that could block or never end."""
    if path is not None and not os.fspath(path):
        raise ConfigError("", "--config: the path is empty (leave --config out for "
                          f"${ENV_VAR} or {DEFAULT_PATH})")
    file = Path(path or os.environ.get(ENV_VAR) or DEFAULT_PATH)
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError("", "no such configuration file", file=file) from None
    except ValueError:  # a NUL in the path
        raise ConfigError("", f"not a usable path: {str(file)!r}") from None
    except OSError as err:
        raise ConfigError("", f"cannot read: {err.strerror}", file=file) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError("", "is a directory, not a configuration file", file=file)
        if not stat.S_ISREG(mode):
            raise ConfigError("", "not a regular file (a FIFO, device or socket); give the "
                              "configuration file itself", file=file)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_SIZE and (chunk := os.read(fd, MAX_SIZE + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise ConfigError("", f"cannot read: {err.strerror}", file=file) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_SIZE:
        raise ConfigError("", f"larger than {MAX_SIZE >> 20} MiB: not a configuration "
                          "file", file=file)
    try:
        return data.decode("utf-8"), str(file)
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError("", f"not UTF-8 text (an invalid byte on line {line}, at offset "
                          f"{err.start}); save the file as UTF-8", file=file) from None


def load_generic(path: str | os.PathLike[str] | None = None) -> Config:
    """Read, parse and apply the generic rules; raise :class:`ConfigError`."""
    text, source = read(path)
    return loads_generic(text, source=source)


def loads_generic(text: str, *, source: str = "<string>") -> Config:
    """Parse ``text`` and apply the generic rules (not the checks' and remedies' own)."""
    config = parse.parse(text, source=source)
    try:
        validate.validate(config)
    except ConfigError as err:
        raise err.located(source) from None
    return config


__all__ = [
    "DEFAULT_PATH", "ENV_VAR", "MAX_SIZE", "OFFLOAD_DEFAULT_FEATURES", "REDACTED",
    "AgentSettings", "AlertSettings", "CheckSettings", "Config", "ConfigError",
    "ControlLadderSettings", "ControlSettings",
    "FleetSettings",
    "HttpSettings",
    "KubernetesSettings", "MetricsSettings", "MqttSettings", "MqttTarget", "OffloadSettings",
    "PmtuSettings", "PodRemedySettings", "RebindSettings", "RemediationSettings",
    "ServiceSettings", "UplinkCost", "UplinkLadderSettings", "UplinkSettings",
    "WireguardSettings", "check_sections", "doc", "file_settings",
    "format_duration", "load_generic", "loads_generic", "parse_duration", "read", "redacted",
    "reference", "setting", "split_hostport",
]
