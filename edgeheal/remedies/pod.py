"""The ``pod`` remedy: restart DaemonSet Flannel by deleting *this node's* Flannel pod.

Why deletion: with ``--flannel-backend=none`` and kube-flannel, Flannel runs as one pod per
node (namespace ``kube-flannel``, label ``app=flannel``); deleting it makes the DaemonSet
controller create a fresh one, which rebuilds ``flannel-wg`` from the cluster's data —
the manual fix of the incident, done through the API with the least privilege.

Safety: the pod is found with the label selector *and* ``fieldSelector=spec.nodeName=<this
node>``; exactly one must match (two means a rollout is in progress: refuse, the DaemonSet
is already replacing it). :meth:`edgeheal.boundaries.kube.KubeClient.delete_pod` re-reads the pod,
checks node and uid again and deletes with ``preconditions.uid``; a pod already Terminating
(a graceful deletion lists it for its grace period) is never deleted again: when it is the
node's only one, the remedy just waits for its replacement. Then the remedy waits
(watch, re-list on interruption) for a pod with a *different* uid on this node to be Running
and Ready within ``[remediation.pod] ready_timeout``. Tunnel recovery is the caller's to
verify. 401/403 become :class:`RemedyError` with ``config_problem=True``.

Registered (at the bottom) as mode ``pod``: it exists only with ``[kubernetes]``, owns the
``[remediation.pod]`` rules, and one restart may take ``ready_timeout`` (plus the actor's
margin for the API calls around the wait).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from edgeheal.boundaries.kube import KubeConflict, KubeError, KubeNotFound, KubePermissionError
from edgeheal.remedies import (
    Availability,
    Needs,
    RemedyError,
    RemedyOutcome,
    RemedyRegistration,
    register,
)

if TYPE_CHECKING:
    from edgeheal.boundaries.kube import KubeClient, Pod
    from edgeheal.config import Config, PodRemedySettings

MODE = "pod"
NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class PodRemedy:
    mode = MODE

    def __init__(self, kube: KubeClient, settings: PodRemedySettings, *, node: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube, self.settings, self.node, self.clock = kube, settings, node, clock

    async def _pods(self) -> list[Pod]:
        try:
            pods, _ = await self.kube.list_pods(self.settings.namespace,
                                                self.settings.label_selector, self.node)
        except KubePermissionError as err:
            raise RemedyError(str(err), config_problem=True) from err
        except KubeError as err:
            raise RemedyError(f"cannot list Flannel pods: {err}") from err
        return pods

    async def _this_nodes_pod(self, pods: list[Pod] | None = None) -> Pod:
        if pods is None:
            pods = await self._pods()
        live = [p for p in pods if not p.deleting]
        where = (f"{self.settings.label_selector} in namespace {self.settings.namespace} "
                 f"on node {self.node}")
        if not live:
            raise RemedyError(f"no Flannel pod {where}")
        if len(live) > 1:
            names = ", ".join(p.name for p in live)
            raise RemedyError(f"{len(live)} Flannel pods {where} ({names}): a rollout is in "
                              "progress; not deleting any")
        return live[0]

    async def probe(self) -> Availability:
        try:
            pods = await self._pods()
            if (going := _terminating_only(pods)) is not None:
                return Availability(True, f"Flannel pod {going.ref} on node {self.node} is "
                                          "terminating; the DaemonSet is replacing it")
            pod = await self._this_nodes_pod(pods)
        except RemedyError as err:
            return Availability(False, str(err))
        return Availability(True, f"Flannel pod {pod.ref} is on node {self.node}")

    async def restart(self) -> RemedyOutcome:
        pods = await self._pods()
        began = self.clock()
        if (going := _terminating_only(pods)) is not None:
            # Deleted already (kubectl, or our own attempt cut short): deleting it again
            # would change nothing; wait for the replacement instead.
            new = await self._wait_replacement(going, deleted=False)
            return RemedyOutcome(target=f"pod {going.ref}",
                           detail=f"was already terminating; replaced by {new.name} (Ready "
                                  f"after {self.clock() - began:.1f}s)")
        pod = await self._this_nodes_pod(pods)
        try:
            await self.kube.delete_pod(pod, self.node)
        except KubePermissionError as err:
            raise RemedyError(str(err), config_problem=True) from err
        except KubeNotFound:
            pass  # already gone: the DaemonSet is replacing it; wait for that
        except KubeConflict as err:
            raise RemedyError(f"not deleting {pod.ref}: {err}") from err
        except KubeError as err:
            raise RemedyError(f"cannot delete {pod.ref}: {err}") from err
        new = await self._wait_replacement(pod, deleted=True)
        return RemedyOutcome(target=f"pod {pod.ref}",
                       detail=f"replaced by {new.name} (Ready after "
                              f"{self.clock() - began:.1f}s)")

    async def _wait_replacement(self, pod: Pod, *, deleted: bool) -> Pod:
        try:
            return await self.kube.wait_replacement(
                self.settings.namespace, self.settings.label_selector, self.node,
                old_uid=pod.uid, within=self.settings.ready_timeout, clock=self.clock)
        except KubePermissionError as err:
            raise RemedyError(str(err), config_problem=True) from err
        except KubeError as err:
            done = "deleted" if deleted else "waited for the replacement of"
            raise RemedyError(f"{done} {pod.ref}, but {err}") from err


def _terminating_only(pods: list[Pod]) -> Pod | None:
    """The Terminating pod when it is this node's only one (the replacement not yet made)."""
    if any(not p.deleting for p in pods):
        return None
    return next(iter(pods), None)


# --- registration -------------------------------------------------------------------------

def _build(needs: Needs) -> PodRemedy:
    return PodRemedy(needs.kube(), needs.config.remediation.pod, node=needs.config.node)


def _unavailable(config: Config) -> str:
    return "" if config.kubernetes is not None else "not configured"


def _restart_bound(config: Config) -> float:
    return config.remediation.pod.ready_timeout


def _validate(config: Config) -> None:
    from edgeheal.config import ConfigError  # config loading calls this

    pod = config.remediation.pod
    if pod.ready_timeout <= 0:
        raise ConfigError("remediation.pod.ready_timeout", "must be greater than zero")
    if not NAMESPACE_NAME.fullmatch(pod.namespace):
        raise ConfigError("remediation.pod.namespace",
                          f"not a Kubernetes namespace name: {pod.namespace!r}")
    if not pod.label_selector.strip():
        raise ConfigError("remediation.pod.label_selector",
                          "is required (it selects Flannel's pods, e.g. \"app=flannel\")")
    if config.remediation.mode == MODE and config.kubernetes is None:
        raise ConfigError("remediation.mode",
                          "\"pod\" needs a [kubernetes] section (kubeconfig or in-cluster)")


register(RemedyRegistration(
    mode=MODE, module="pod", factory=_build, restart_bound=_restart_bound,
    unavailable=_unavailable, settings="remediation.pod", validate=_validate,
    doc="Deletes this node's Flannel pod through the Kubernetes API and waits for the "
        "DaemonSet's replacement to be Ready (DaemonSet Flannel; needs `[kubernetes]`)."))
