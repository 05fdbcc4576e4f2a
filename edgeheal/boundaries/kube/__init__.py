"""The Kubernetes API boundary: this node's Flannel pods, Events on the Node, its condition.

Why a package: two jobs share the outside thing. Checking a kubeconfig's credentials is done
offline, without a client (``edgeheal check-config``, the doctor: :mod:`.credentials`); the
API client (:mod:`.client`, with :mod:`.pod`) makes the six calls the actor and the pod
remedy need, each bounded, retried politely and reported precisely. Both raise the
exceptions of :mod:`.errors` (:class:`KubeError`, :class:`KubePermissionError`,
:class:`KubeConflict`, :class:`KubeNotFound`; :class:`KubeShapeError` for an answer of the
wrong shape), whose messages never carry the token. :mod:`.answers` reads every answer
within its cap (:data:`BODY_MAX`, :data:`WATCH_LINE_MAX`) and checks its shape.

The names below are the boundary's interface, as they were when it was one module: import
them from here. lightkube stays out of it: the client imports it only when it first
connects (docs/footprint.md), so importing this package costs the standard library only.
"""

from __future__ import annotations

from edgeheal.boundaries.kube.answers import (
    BODY_MAX,
    LIST_LIMIT,
    LIST_PAGES_MAX,
    WATCH_LINE_MAX,
    KubeShapeError,
)
from edgeheal.boundaries.kube.client import (
    BACKOFF_BASE,
    BACKOFF_MAX,
    QUIET_LOGGERS,
    RETRY_AFTER_MAX,
    KubeClient,
)
from edgeheal.boundaries.kube.credentials import KUBECONFIG_MAX, check_kubeconfig, token_problem
from edgeheal.boundaries.kube.errors import (
    KubeConflict,
    KubeError,
    KubeNotFound,
    KubePermissionError,
    _status_message,
    _transport_problem,
)
from edgeheal.boundaries.kube.node import COMPONENT, EVENT_NAMESPACE
from edgeheal.boundaries.kube.pod import Pod

__all__ = [
    "BACKOFF_BASE",
    "BACKOFF_MAX",
    "BODY_MAX",
    "COMPONENT",
    "EVENT_NAMESPACE",
    "KUBECONFIG_MAX",
    "LIST_LIMIT",
    "LIST_PAGES_MAX",
    "QUIET_LOGGERS",
    "RETRY_AFTER_MAX",
    "WATCH_LINE_MAX",
    "KubeClient",
    "KubeConflict",
    "KubeError",
    "KubeNotFound",
    "KubePermissionError",
    "KubeShapeError",
    "Pod",
    "_status_message",
    "_transport_problem",
    "check_kubeconfig",
    "token_problem",
]
