"""Config: the file is valid (the agent's own loader; an invalid one stops the doctor with
exit status 2 before any check) and every file it names can be opened."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgeheal import config as config_mod
from edgeheal.settings import unreadable
from edgeheal.tools.doctor.finding import Finding, fail, ok

if TYPE_CHECKING:
    from edgeheal.config import Config


def valid(config: Config) -> Finding:
    targets = len(config.mqtt.targets)
    return ok("config", f"{config.source} is valid ({targets} MQTT target(s), remediation "
              f"mode {config.remediation.mode})", source=config.source)


def files(config: Config) -> Finding:
    """Password, CA, client certificate and key files, and the kubeconfig (with the
    credentials in it well-formed, :func:`edgeheal.boundaries.kube.check_kubeconfig`)."""
    name = "config.files"
    named = list(config_mod.file_settings(config))
    problems = [f"{key}: {path}: {why}" for key, path in named if (why := unreadable(path))]
    kube = config.kubernetes
    if kube is not None and kube.kubeconfig and not unreadable(kube.kubeconfig):
        from edgeheal.boundaries.kube import KubeError, check_kubeconfig

        try:
            check_kubeconfig(kube.kubeconfig, kube.context)
        except KubeError as err:
            problems.append(f"kubernetes.kubeconfig: {err}")
    keys = [key for key, _ in named]
    if problems:
        return fail(name, "; ".join(problems),
                    "create the file or correct the key (an absolute path, a regular file "
                    "readable by the service's user edgeheal)", keys=keys)
    if not named:
        return ok(name, "no file is referenced", keys=keys)
    return ok(name, f"{len(named)} referenced file(s) readable: {', '.join(keys)}", keys=keys)
