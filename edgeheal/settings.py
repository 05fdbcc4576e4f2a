"""The loader for real use: parse + generic rules, then every check's and remedy's own rules.

The config package sits at the bottom of the house and may not know which checks and
remedies exist, so it checks only what holds for all of them (:mod:`edgeheal.config`).
A rule that belongs to one module (an MQTT target's TLS files, a WireGuard peer key, the
unit the ``k3s-service`` remedy may restart) is that module's registered ``validate``
hook. This module runs both stages, in that order, and is what the CLI, the commands, the
lab and the benches call; loading with :func:`edgeheal.config.loads_generic` alone would accept a
config the agent then cannot run.

A hook raises :class:`~edgeheal.config.ConfigError` with the key path only; the file name
is added here, so ``check-config`` and ``run`` report it exactly like a parse error.

``check_files=True`` (what ``edgeheal check-config`` asks for) adds a third stage, the
environment: every setting marked ``file`` (``password_file``, ``ca_file``, ``cert_file``,
``key_file``, ``kubeconfig``) must name an existing, readable regular file, and the
kubeconfig must hold usable credentials (:func:`edgeheal.boundaries.kube.check_kubeconfig`: a token
on one line of printable ASCII, the files it names). ``edgeheal run`` does not refuse to start
over these: a file that appears later, or vanishes while the agent runs, is the using
check's runtime problem (``/status``, alerts), and the node's probes keep being served.
"""

from __future__ import annotations

import os
import stat

from edgeheal import checks, config, remedies
from edgeheal.config import Config, ConfigError


def load(path: str | os.PathLike[str] | None = None, *, check_files: bool = False) -> Config:
    """Read ``path`` (default: ``$EDGEHEAL_CONFIG``, then the system path) and validate it
    fully; raise :class:`ConfigError`."""
    text, source = config.read(path)
    return loads(text, source=source, check_files=check_files)


def loads(text: str, *, source: str = "<string>", check_files: bool = False) -> Config:
    """Parse and validate ``text`` fully; raise :class:`ConfigError` naming ``source``."""
    settings = config.loads_generic(text, source=source)
    validate(settings)
    if check_files:
        validate_files(settings)
    return settings


def validate(settings: Config) -> None:
    """The registered checks' and remedies' own rules, for an already parsed config."""
    try:
        checks.validate(settings)
        remedies.validate(settings)
    except ConfigError as err:
        raise err.located(settings.source) from None


def validate_files(settings: Config) -> None:
    """Every file setting names a readable regular file; the kubeconfig's credentials are
    well-formed. Raise :class:`ConfigError` naming the key and the path, never a content."""
    for key, path in config.file_settings(settings):
        problem = unreadable(path)
        if problem:
            raise ConfigError(key, f"{path}: {problem}", file=settings.source)
    kube = settings.kubernetes
    if kube is not None and kube.kubeconfig:
        from edgeheal.boundaries.kube import KubeError, check_kubeconfig

        try:
            check_kubeconfig(kube.kubeconfig, kube.context)
        except KubeError as err:
            raise ConfigError("kubernetes.kubeconfig", str(err),
                              file=settings.source) from None


def unreadable(path: str) -> str:
    """Why ``path`` is not a readable regular file, or ``""`` (opened, never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return "no such file"
    except OSError as err:
        return f"cannot be opened: {err.strerror}"
    try:
        mode = os.fstat(fd).st_mode
    finally:
        os.close(fd)
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    return "" if stat.S_ISREG(mode) else "not a regular file"


__all__ = ["ConfigError", "load", "loads", "validate", "validate_files"]
