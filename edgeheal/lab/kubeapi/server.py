"""The test API server itself: :class:`FakeKube`. See the package docstring.

Why it is put together from parts: the server is the API server's pieces in the order a
request meets them — authentication and fault injection (:mod:`.authz`, :mod:`.faults`),
authorization, then a handler (:mod:`.reads`, :mod:`.writes`, the self reviews in
:mod:`.authz`) over the objects and their history (:mod:`.store`) that the controllers
move (:mod:`.controller`). Each part is a mixin holding its own state (set up by
``_setup_*``), so tests keep reaching everything on the one server object; this module
only builds it, routes, and serves HTTPS. The names other code imports from here are
re-exported.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web

from edgeheal.lab.kubeapi import discovery
from edgeheal.lab.kubeapi.authz import (
    DISCOVERY_PATHS,
    SELF_REVIEWS,
    Attributes,
    Authz,
    Credentials,
    forbidden_message,
)
from edgeheal.lab.kubeapi.faults import Fault, Faults
from edgeheal.lab.kubeapi.heartbeats import Heartbeats
from edgeheal.lab.kubeapi.reads import Reads
from edgeheal.lab.kubeapi.wire import (
    NAME_CHARS,
    TARGET,
    USER,
    WATCHING,
    ApiError,
    Logged,
    Obj,
    Target,
    error_response,
    object_response,
    parse_path,
    status_body,
    verb_of,
)
from edgeheal.lab.kubeapi.writes import Writes

__all__ = ["DISCOVERY_PATHS", "NAME_CHARS", "SELF_REVIEWS", "TARGET", "USER", "WATCHING",
           "ApiError", "Attributes", "Credentials", "FakeKube", "Fault", "Logged", "Obj",
           "Target", "forbidden_message", "parse_path", "status_body", "verb_of"]


class FakeKube(Writes, Heartbeats, Reads, Authz, Faults):
    """The test API server. See the package docstring."""

    def __init__(self, *, ready_delay: float = 0.3, replace_delay: float = 0.05,
                 stop_delay: float = 0.3, grace: int = 30,
                 server_names: tuple[str, ...] = (), version: str = "v1.33.5+k3s1",
                 history: int = 1000, bookmark_interval: float = 60.0) -> None:
        """``server_names``: extra addresses/names for the server certificate (e.g. the
        address edge namespaces reach it on); 127.0.0.1, ::1 and localhost always.
        ``ready_delay``: how long a replacement pod takes to turn Running and Ready;
        ``replace_delay``: how soon the DaemonSet controller creates it; ``stop_delay``:
        how long a deleted pod stays Terminating (its container exits on SIGTERM; never
        longer than the grace period); ``grace``: the pods' terminationGracePeriodSeconds;
        ``history``: how many changes a watch can resume from (older: 410 Expired);
        ``bookmark_interval``: seconds between BOOKMARKs for watches that allow them."""
        import trustme  # lab dependency

        self._setup_store(history)
        self._setup_controller(ready_delay=ready_delay, replace_delay=replace_delay,
                               stop_delay=stop_delay, grace=grace, version=version)
        self._setup_writes()
        self._setup_heartbeats()
        self._setup_authz(trustme.CA())
        self._setup_faults()
        self.bookmark_interval = bookmark_interval
        self._server_cert = self.ca.issue_cert("127.0.0.1", "localhost", "::1",
                                               *server_names)
        self.requests = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    # --- kubeconfig --------------------------------------------------------------------

    def write_kubeconfig(self, path: Path, credentials: Credentials, *,
                         namespace: str = "default") -> Path:
        """A real kubeconfig as K3s writes them (CA and client cert as ``*-data``)."""
        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        user: Obj = {}
        if credentials.token:
            user["token"] = credentials.token
        else:
            user["client-certificate-data"] = b64(credentials.cert_pem)
            user["client-key-data"] = b64(credentials.key_pem)
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "fake", "cluster": {
                "server": self.url, "certificate-authority-data": b64(self.ca.cert_pem.bytes())}}],
            "users": [{"name": "edgeheal", "user": user}],
            "contexts": [{"name": "edgeheal", "context": {
                "cluster": "fake", "user": "edgeheal", "namespace": namespace}}],
            "current-context": "edgeheal",
        }
        import yaml  # type: ignore[import-untyped]  # lightkube's dep

        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        path.chmod(0o600)
        return path

    # --- serving -----------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1") -> str:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_cert.configure_cert(ctx)
        self.ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_OPTIONAL
        app = web.Application(middlewares=[self._middleware])
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, 0, ssl_context=ctx)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"https://{host}:{port}"
        return self.url

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for watcher in self._watchers:
            watcher.queue.put_nowait(("CLOSE", {}))
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._runner.cleanup(), 5.0)
            self._runner = None

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        user = self._authenticate(request)
        status = 500
        try:
            if user is None:
                status = 401
                return error_response(401, "Unauthorized", "Unauthorized")
            request[USER] = user
            injected = await self._inject(request)
            if injected is not None:
                status = injected.status
                return injected
            denied = self._authorize(request, user)
            if denied is not None:
                status = 403
                return denied
            try:
                resp: web.StreamResponse = await handler(request)
            except ApiError as err:
                resp = error_response(err.code, err.reason, err.message, **err.details)
        except web.HTTPException as err:
            status = err.status
            raise
        else:
            status = resp.status
            return resp
        finally:
            if not request.get(WATCHING):  # a watch logged itself when it began streaming
                self.requests.append(Logged(request.method, request.path,
                                            request.query_string, user or "", status))

    # --- routing -----------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        target = request.get(TARGET)
        if target is None:
            return self._non_resource(request)
        resource = discovery.find(target.group, target.version, target.full)
        if resource is None:
            raise ApiError(404, "NotFound", "the server could not find the requested "
                           "resource")
        if resource.namespaced and target.name and target.namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested "
                           "resource")
        if not resource.namespaced and target.namespace is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested "
                           "resource")
        verb = verb_of(request.method, target, request.query)
        if verb not in resource.verbs:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method "
                           "on the requested resource")
        if target.group and target.group != "coordination.k8s.io":
            return await self._review(request, target)
        if verb in ("list", "watch"):
            return await self._list(request, target, watch=verb == "watch")
        if verb == "get":
            return object_response(request, target.resource, self._get(target))
        if verb == "delete":
            return await self._delete_pod(request, target)
        if verb == "create":
            return await self._post_event(request, target)
        return await self._patch_node_status(request, target)

    def _non_resource(self, request: web.Request) -> web.Response:
        path = request.path.rstrip("/") or "/"
        if path == "/version":
            return web.json_response(discovery.version_info(self.version))
        if path == "/api":
            return web.json_response(discovery.api_versions(request.host))
        if path == "/apis":
            return web.json_response(discovery.api_groups())
        parts = path.strip("/").split("/")
        found: Obj | None = None
        if parts == ["api", "v1"]:
            found = discovery.resource_list("", "v1")
        elif parts[0] == "apis" and len(parts) == 2:
            found = discovery.api_group(parts[1])
        elif parts[0] == "apis" and len(parts) == 3:
            found = discovery.resource_list(parts[1], parts[2])
        elif path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if found is None:
            raise ApiError(404, "NotFound", "the server could not find the requested "
                           "resource")
        return web.json_response(found)
