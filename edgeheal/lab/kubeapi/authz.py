"""Who is asking and what they may do: authentication, the permission table, the self
reviews.

Why: the agent's Kubernetes code is only as safe as its handling of a 401 or a 403, and
``edgeheal doctor`` reads its rights through ``kubectl auth can-i`` style reviews, so the
stand-in authorizes every request as the API server does and says no in its words. Users
are bearer tokens or TLS client certificates (the user is the certificate's CN, as K3s's
client certs). The table is RBAC reduced to rows of ``(user, verb, resource, namespace)``
(``namespace=None``: every namespace, or cluster-scoped), applied to the attributes the
API server's request-info resolver parses from the path (``resource`` carries the
subresource: ``nodes/status``). As the default cluster roles grant, discovery is open to
every authenticated user (``system:discovery``) and the self reviews to everyone
(``system:basic-user``). Every resource request's decision is kept in
:attr:`Authz.authorized`, so a test can hold the agent's RBAC manifest to what it uses.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from edgeheal.lab.kubeapi import protobuf
from edgeheal.lab.kubeapi.wire import (
    TARGET,
    USER,
    ApiError,
    Obj,
    Target,
    error_response,
    parse_path,
    read_body,
    verb_of,
)

if TYPE_CHECKING:
    import trustme

DISCOVERY_PATHS = ("/api", "/apis", "/version", "/openapi", "/healthz", "/livez", "/readyz")
"""Non-resource URLs every authenticated user may GET (``system:discovery``)."""
SELF_REVIEWS = {("authorization.k8s.io", "selfsubjectaccessreviews"),
                ("authorization.k8s.io", "selfsubjectrulesreviews"),
                ("authentication.k8s.io", "selfsubjectreviews")}
"""Resources every authenticated user may create (``system:basic-user``)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """How one user authenticates: a token, or a client certificate (PEM paths/bytes)."""

    user: str
    token: str = ""
    cert_pem: bytes = b""
    key_pem: bytes = b""


@dataclass(frozen=True, slots=True)
class Attributes:
    """What one request asked to do, as the authorizer saw it (``resource`` carries the
    subresource: ``nodes/status``; non-resource requests have ``path`` instead)."""

    user: str
    verb: str
    resource: str = ""
    namespace: str | None = None
    name: str = ""
    group: str = ""
    path: str = ""
    allowed: bool = False


def forbidden_message(attrs: Attributes) -> tuple[str, Obj]:
    """The API server's wording (``responsewriters.forbiddenMessage`` + NewForbidden)."""
    if attrs.path:
        return (f'forbidden: User "{attrs.user}" cannot {attrs.verb} path "{attrs.path}"',
                {})
    where = (f' in the namespace "{attrs.namespace}"' if attrs.namespace
             else " at the cluster scope")
    base = attrs.resource.split("/")[0]
    qualified = f"{base}.{attrs.group}" if attrs.group else base
    subject = f'{qualified} "{attrs.name}"' if attrs.name else qualified
    details: Obj = {"kind": base, **({"name": attrs.name} if attrs.name else {}),
                    **({"group": attrs.group} if attrs.group else {})}
    return (f'{subject} is forbidden: User "{attrs.user}" cannot {attrs.verb} resource '
            f'"{attrs.resource}" in API group "{attrs.group}"{where}', details)


class Authz:
    """Users, their rights, and the authorizer's decisions (see the module docstring)."""

    def _setup_authz(self, ca: trustme.CA) -> None:
        self.ca = ca
        """The cluster CA: it signs the server's certificate and the users' client ones."""
        self.authorized: list[Attributes] = []
        """Every resource request's attributes and the authorizer's answer, in order."""
        self._tokens: dict[str, str] = {}
        self._cert_users: set[str] = set()
        self._allowed: set[tuple[str, str, str, str | None]] = set()

    def add_user(self, user: str, *, token: str | None = None, cert: bool = False,
                 ) -> Credentials:
        if cert:
            leaf = self.ca.issue_cert(f"{secrets.token_hex(4)}.users.invalid", common_name=user)
            self._cert_users.add(user)
            return Credentials(user, cert_pem=leaf.cert_chain_pems[0].bytes(),
                               key_pem=leaf.private_key_pem.bytes())
        token = token or secrets.token_urlsafe(24)
        self._tokens[token] = user
        return Credentials(user, token=token)

    def revoke(self, credentials: Credentials) -> None:
        self._tokens.pop(credentials.token, None)
        self._cert_users.discard(credentials.user)

    def allow(self, user: str, verb: str, resource: str, namespace: str | None = None) -> None:
        """Grant ``verb`` on ``resource`` (``pods``, ``events``, ``nodes``, ``nodes/status``)
        in ``namespace`` (None: every namespace / cluster-scoped), like an RBAC rule."""
        self._allowed.add((user, verb, resource, namespace))

    AGENT_RULES: tuple[tuple[str, str, str | None], ...] = (
        ("get", "pods", ""), ("list", "pods", ""), ("watch", "pods", ""),
        ("delete", "pods", ""), ("create", "events", "default"),
        ("patch", "nodes/status", None), ("get", "nodes", None),
        ("get", "leases.coordination.k8s.io", "kube-node-lease"))
    """What k3s-manifests/rbac.yaml grants the agent, as (verb, resource, namespace);
    ``""`` is the Flannel namespace (tests/remediation/test_kube_rbac.py keeps it equal).
    A resource of an API group other than core is named with its group
    (``leases.coordination.k8s.io``). rbac.yaml limits the last two to the node's own
    name (``resourceNames``); the table has no names, so here they are any node's."""

    def allow_agent(self, user: str, namespace: str = "kube-flannel") -> None:
        """Grant :attr:`AGENT_RULES`."""
        for verb, resource, where in self.AGENT_RULES:
            self.allow(user, verb, resource, namespace if where == "" else where)

    def deny(self, user: str, verb: str, resource: str, namespace: str | None = None) -> None:
        self._allowed.discard((user, verb, resource, namespace))

    def permitted(self, user: str, verb: str, resource: str, namespace: str | None) -> bool:
        return ((user, verb, resource, namespace) in self._allowed
                or (user, verb, resource, None) in self._allowed)

    def _authenticate(self, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return self._tokens.get(auth[len("Bearer "):])
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        if peer:
            for rdn in peer.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName" and value in self._cert_users:
                        return str(value)
        return None

    def _authorize(self, request: web.Request, user: str) -> web.Response | None:
        target = parse_path(request.path)
        if target is None:
            verb = request.method.lower()
            allowed = verb == "get" and any(request.path == p or request.path.startswith(
                p + "/") for p in DISCOVERY_PATHS)
            attrs = Attributes(user, verb, path=request.path, allowed=allowed)
        else:
            request[TARGET] = target
            verb = verb_of(request.method, target, request.query)
            resource = f"{target.full}.{target.group}" if target.group else target.full
            allowed = ((target.group, target.resource) in SELF_REVIEWS and verb == "create"
                       ) or self.permitted(user, verb, resource, target.namespace)
            attrs = Attributes(user, verb, target.full, target.namespace, target.name,
                               target.group, allowed=allowed)
            self.authorized.append(attrs)
        if allowed:
            return None
        message, details = forbidden_message(attrs)
        return error_response(403, "Forbidden", message, **details)

    # --- self reviews ------------------------------------------------------------------

    def _groups(self, user: str) -> list[str]:
        if user.startswith("system:serviceaccount:"):
            namespace = user.split(":")[2]
            return ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                    "system:authenticated"]
        return ["system:authenticated"]

    async def _review(self, request: web.Request, target: Target) -> web.Response:
        user = request[USER]
        if request.content_type == "application/vnd.kubernetes.protobuf":
            try:
                body = protobuf.decode_review(await request.read())
            except (protobuf.ProtobufError, UnicodeDecodeError) as err:
                raise ApiError(400, "BadRequest", f"the body of the request is not a "
                               f"valid protobuf object: {err}") from err
        else:
            body = await read_body(request)
        spec = body.get("spec") or {}
        if target.resource == "selfsubjectreviews":
            return web.json_response({
                "kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": None},
                "status": {"userInfo": {"username": user, "groups": self._groups(user)}}},
                status=201)
        if target.resource == "selfsubjectrulesreviews":
            namespace = spec.get("namespace") or ""
            rules = sorted({(verb, resource) for u, verb, resource, ns in self._allowed
                            if u == user and ns in (None, namespace)})
            resources: dict[str, list[str]] = {}
            for verb, resource in rules:
                resources.setdefault(resource, []).append(verb)
            status: Obj = {
                "resourceRules": [{"verbs": ["create"], "apiGroups": [g],
                                   "resources": [r]} for g, r in sorted(SELF_REVIEWS)]
                + [{"verbs": verbs, "apiGroups": [""], "resources": [resource]}
                   for resource, verbs in sorted(resources.items())],
                "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": [
                    p + suffix for p in DISCOVERY_PATHS for suffix in ("", "/*")]}],
                "incomplete": False}
        else:
            attributes = spec.get("resourceAttributes")
            plain = spec.get("nonResourceAttributes")
            if attributes:
                resource = attributes.get("resource", "")
                if attributes.get("subresource"):
                    resource += "/" + attributes["subresource"]
                group = attributes.get("group", "")
                verb = attributes.get("verb", "")
                qualified = f"{resource}.{group}" if group else resource
                allowed = ((group, resource) in SELF_REVIEWS and verb == "create") or (
                    self.permitted(user, verb, qualified, attributes.get("namespace") or None))
            elif plain:
                allowed = plain.get("verb") == "get" and any(
                    plain.get("path", "") == p or str(plain.get("path", "")).startswith(
                        p + "/") for p in DISCOVERY_PATHS)
            else:
                raise ApiError(422, "Invalid", "SelfSubjectAccessReview.authorization.k8s.io "
                               '"" is invalid: spec.resourceAttributes: Invalid value: '
                               '"null": exactly one of nonResourceAttributes or '
                               "resourceAttributes must be specified")
            status = {"allowed": allowed}
            if allowed:
                status["reason"] = "allowed by the stand-in's permission table"
        kind = ("SelfSubjectRulesReview" if target.resource == "selfsubjectrulesreviews"
                else "SelfSubjectAccessReview")
        return web.json_response({"kind": kind, "apiVersion": "authorization.k8s.io/v1",
                                  "metadata": {"creationTimestamp": None}, "spec": spec,
                                  "status": status}, status=201)
