"""A faithful, in-process HTTPS stand-in for the slice of the Kubernetes API that edgeheal
and ``kubectl``'s everyday commands use.

Why: no kube-apiserver can run on the test machines, and a mock of the client would test
nothing. This is a real HTTPS server (aiohttp, a throw-away CA from trustme) that the agent
and kubectl reach through a real kubeconfig file, implementing the used subset the way the
API server does, including its failure modes (tests/kubeapi/ holds it to kubectl):

- **discovery**: ``/version``, ``/api``, ``/apis``, an ``APIResourceList`` per group
  version announcing only the verbs implemented (core v1 pods, nodes, nodes/status,
  events; ``authorization.k8s.io`` and ``authentication.k8s.io`` self reviews);
- **errors**: a JSON ``Status`` with the API server's ``reason``/``code`` for every error,
  404 ``NotFound`` for unknown routes, 405 for a verb a resource does not serve;
- **authentication**: bearer tokens and TLS client certificates (user = the certificate's
  CN, as K3s's client certs); anything else -> 401 ``Unauthorized``;
- **authorization**: a permission table of ``(user, verb, resource, namespace)`` rows, like
  RBAC (``namespace=None`` = cluster-wide), applied to the attributes parsed from the path
  (``/api/v1/nodes`` is nodes, ``.../nodes/x/status`` is nodes/status); discovery is open to
  every authenticated user and the self reviews to everyone (as ``system:discovery`` and
  ``system:basic-user``); missing -> 403 with the API server's wording. Every decision is
  recorded in :attr:`FakeKube.authorized`;
- **SelfSubjectAccessReview**, **SelfSubjectRulesReview** and **SelfSubjectReview**
  (``kubectl auth can-i [--list]``, ``kubectl auth whoami``);
- **pods**: get; list (one namespace or all: ``/api/v1/pods``) with set-based label
  selectors, the pod field selectors, ``limit``/``continue``; **graceful deletion**: DELETE
  sets ``deletionTimestamp`` and ``deletionGracePeriodSeconds`` (``gracePeriodSeconds`` from
  the query or ``DeleteOptions``, else the pod's ``terminationGracePeriodSeconds``) and the
  pod stays listed, Terminating, until its container stops (``stop_delay``, capped by the
  grace period); ``preconditions.uid``/``resourceVersion`` -> 409 ``Conflict``;
  ``dryRun=All`` answers what would happen and changes nothing;
- **watch** (``watch=true``) of pods, nodes and events: without a resourceVersion the
  current state as ADDED first; from a resourceVersion the changes since are replayed; one
  older than the retained history (see :meth:`FakeKube.compact`) -> an ``ERROR`` event
  carrying a 410 ``Expired`` Status; a malformed one -> 400; ``timeoutSeconds``;
  ``allowWatchBookmarks`` -> BOOKMARK events; ``sendInitialEvents``;
- **a DaemonSet-like controller**: :meth:`FakeKube.add_daemonset` makes one pod per node;
  once one is Terminating, a replacement with a new name and uid is created on its node
  after ``replace_delay`` (while the old one is still listed) and turns Running and Ready
  after ``ready_delay``; ``on_replace`` callbacks see (old, new) pods — the WireGuard lab
  uses them to rebuild the stand-in Flannel's tunnel;
- **Leases** (``coordination.k8s.io/v1``: get, list, watch) **renewed by a stand-in
  kubelet**, with its NodeStatus and the node lifecycle controller's ``Unknown`` when the
  renewals stop (:mod:`.heartbeats`, each behaviour from kubelet's and the controller's
  source);
- **Events** (create, get, list, watch) and **Node status** (PATCH
  ``/api/v1/nodes/{name}/status``: strategic merge by condition ``type``, or JSON merge);
- **Table** answers for ``kubectl get`` (``Accept: ...;as=Table;g=meta.k8s.io``);
- **fault injection**: :meth:`FakeKube.fail` (e.g. 429 with ``Retry-After``, 500),
  :meth:`FakeKube.slow` (a delay before answering) and :meth:`FakeKube.before` (run a
  change just before a matching request: a race made exact), each for ``times`` requests.

Usage::

    api = FakeKube(ready_delay=0.5)
    api.add_node("edge-1"); api.add_node("edge-2")
    api.add_daemonset("kube-flannel", "kube-flannel-ds", {"app": "flannel"})
    creds = api.add_user("system:serviceaccount:kube-flannel:edgeheal", token="t0k")
    api.allow(creds.user, "list", "pods", "kube-flannel")
    url = await api.start()                    # https://127.0.0.1:<port>
    api.write_kubeconfig(tmp_path / "kubeconfig", creds)
    ...
    await api.close()

Inspect what happened through :attr:`FakeKube.requests`, :attr:`FakeKube.authorized`,
:attr:`FakeKube.deletions`, :attr:`FakeKube.events` and :meth:`FakeKube.node`. Where it still
differs from a real API server is listed in the README's Tests section. This is lab code:
never imported by the agent.

Where each part lives: :mod:`.server` composes :class:`FakeKube` from :mod:`.store` (the
objects, resourceVersions, history and watchers), :mod:`.controller` (nodes, the
DaemonSet controller, the kubelet), :mod:`.heartbeats` (leases, the kubelet's heartbeats,
the lifecycle controller), :mod:`.authz` (users, the permission table, the self
reviews), :mod:`.faults`, :mod:`.reads` (list and watch) and :mod:`.writes` (delete,
create, patch), over :mod:`.wire` (paths, the error ``Status``), :mod:`.discovery`,
:mod:`.selectors` and :mod:`.protobuf`.
"""

from edgeheal.lab.kubeapi.selectors import (
    Requirement,
    SelectorError,
    fields_match,
    labels_match,
    parse_fields,
    parse_labels,
)
from edgeheal.lab.kubeapi.server import (
    Attributes,
    Credentials,
    FakeKube,
    Fault,
    Logged,
    Target,
    parse_path,
    status_body,
)

__all__ = ["Attributes", "Credentials", "FakeKube", "Fault", "Logged", "Requirement",
           "SelectorError", "Target", "fields_match", "labels_match", "parse_fields",
           "parse_labels", "parse_path", "status_body"]
