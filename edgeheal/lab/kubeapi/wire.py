"""What every part of the test API server shares: the request path taken apart, the error
``Status`` and the wire's small rules (timestamps, resourceVersions, request bodies, dryRun).

Why a module of its own: the store, the authorizer and the handlers all speak in these
terms, and each must answer an error exactly as the API server does (a JSON ``Status``
with its ``reason`` and ``code``, raised as :class:`ApiError` anywhere and written once by
the server's middleware), so the wording lives in one place. Nothing here holds state.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiohttp import web

from edgeheal.base.compat import UTC
from edgeheal.lab.kubeapi import discovery

Obj = dict[str, Any]
USER: web.RequestKey[str] = web.RequestKey("user", str)
WATCHING: web.RequestKey[bool] = web.RequestKey("watching", bool)
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
"""The alphabet of ``generateName`` suffixes (no vowels, no look-alikes)."""


@dataclass(frozen=True, slots=True)
class Logged:
    method: str
    path: str
    query: str
    user: str
    status: int


@dataclass(frozen=True, slots=True)
class Target:
    """A request path taken apart: ``/api/v1/namespaces/{ns}/{resource}/{name}/{sub}``."""

    group: str
    version: str
    resource: str
    namespace: str | None
    name: str
    subresource: str

    @property
    def full(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


TARGET: web.RequestKey[Target] = web.RequestKey("target", Target)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def timestamp() -> str:
    """Now, as a ``metav1.Time`` on the wire."""
    return stamp(datetime.now(UTC))


def status_body(code: int, reason: str, message: str, **details: Any) -> Obj:
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


def error_response(code: int, reason: str, message: str, **details: Any) -> web.Response:
    return web.json_response(status_body(code, reason, message, **details), status=code)


def parse_path(path: str) -> Target | None:
    """The resource a path names, or None for a non-resource path (``/version``,
    ``/api``, a group's discovery document)."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    return Target(group, version, rest[0], namespace, rest[1] if len(rest) > 1 else "",
                  "/".join(rest[2:]))


def verb_of(method: str, target: Target, query: Any) -> str:
    if method == "GET":
        if target.name:
            return "get"
        return "watch" if query.get("watch") in ("true", "1") else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(
        method, "delete" if target.name else "deletecollection")


def wire_time(value: Any, what: str) -> str:
    """A ``metav1.Time`` as the API server stores it: parsed as RFC 3339, kept to the
    second (a malformed one is the decoder's 400)."""
    try:
        return stamp(discovery.parse_time(str(value)))
    except ValueError as err:
        raise ApiError(400, "BadRequest", f"{what}: parsing time {value!r} as RFC 3339: "
                       f"{err}") from err


def parse_rv(raw: str) -> int | None:
    if raw in ("", "0"):
        return None
    if not re.fullmatch(r"[0-9]+", raw):
        raise ApiError(400, "BadRequest", f"invalid resource version: {raw!r}: a "
                       "resourceVersion is an unsigned integer")
    return int(raw)


async def read_body(request: web.Request) -> Obj:
    if not request.can_read_body:
        return {}
    raw = await request.read()
    kind = request.content_type
    if raw.strip() and not (kind in ("application/json", "application/octet-stream")
                            or (kind.startswith("application/") and kind.endswith("+json"))):
        raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an "
                       "unknown format - accepted media types include: application/json")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise ApiError(400, "BadRequest", f"the body of the request is not valid "
                       f"JSON: {err}") from err
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the body of the request must be an object")
    return body


def is_dry_run(request: web.Request, options: Obj) -> bool:
    values = request.query.getall("dryRun", []) + list(options.get("dryRun") or [])
    for value in values:
        if value != "All":
            raise ApiError(400, "BadRequest", f'Invalid dry run value: "{value}"; '
                           'the only valid value is "All"')
    return bool(values)


def object_response(request: web.Request, resource: str, obj: Obj,
                    status: int = 200) -> web.Response:
    """One object as JSON, or as the one-row ``Table`` ``kubectl get`` asks for."""
    version = discovery.wants_table(request.headers.get("Accept", ""))
    if version is None:
        return web.json_response(obj, status=status)
    return web.json_response(discovery.table(
        resource, [obj], version=version,
        resource_version=obj["metadata"].get("resourceVersion", ""),
        include=request.query.get("includeObject", "Metadata"), now=datetime.now(UTC)),
        status=status)
