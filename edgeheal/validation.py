"""The loader for real use: parse + generic rules, then every check's and remedy's own rules.

The config package sits at the bottom of the house and may not know which checks and
remedies exist, so it checks only what holds for all of them (:mod:`edgeheal.config`).
A rule that belongs to one module (an MQTT target's TLS files, a WireGuard peer key, the
unit the ``k3s-service`` remedy may restart) is that module's registered ``validate``
hook. This module runs both stages, in that order, and is what the CLI, the commands, the
lab and the benches call; loading with :func:`edgeheal.config.loads` alone would accept a
config the agent then cannot run.

A hook raises :class:`~edgeheal.config.ConfigError` with the key path only; the file name
is added here, so ``check-config`` and ``run`` report it exactly like a parse error.
"""

from __future__ import annotations

import os

from edgeheal import checks, config, remedies
from edgeheal.config import Config, ConfigError


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """Read ``path`` (default: ``$EDGEHEAL_CONFIG``, then the system path) and validate it
    fully; raise :class:`ConfigError`."""
    text, source = config.read(path)
    return loads(text, source=source)


def loads(text: str, *, source: str = "<string>") -> Config:
    """Parse and validate ``text`` fully; raise :class:`ConfigError` naming ``source``."""
    settings = config.loads(text, source=source)
    validate(settings)
    return settings


def validate(settings: Config) -> None:
    """The registered checks' and remedies' own rules, for an already parsed config."""
    try:
        checks.validate(settings)
        remedies.validate(settings)
    except ConfigError as err:
        raise err.located(settings.source) from None


__all__ = ["ConfigError", "load", "loads", "validate"]
