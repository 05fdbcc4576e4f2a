"""The changes a client may make: delete a pod, create an Event, patch a Node's status.

Why: these are the agent's three writes, and each must be judged the way the API server
judges it, since the agent's safety rests on the answers. A pod DELETE is graceful: it
sets ``deletionTimestamp`` and ``deletionGracePeriodSeconds`` (``gracePeriodSeconds`` from
the query or the ``DeleteOptions``, else the pod's ``terminationGracePeriodSeconds``; 0 for
a pod never scheduled or already finished), leaves the pod listed, Terminating, for the
kubelet to remove (:mod:`edgeheal.lab.kubeapi.controller`), and a second DELETE only counts
with a shorter grace period; ``preconditions.uid``/``resourceVersion`` that do not match
are a 409 ``Conflict`` (how the agent avoids deleting a pod recreated under the same
name); ``dryRun=All`` answers what would happen and changes nothing. An Event is
validated as the API server's validation does (required fields, the namespace rules,
``generateName``), and a Node status PATCH is a strategic merge by condition ``type``
(``patchMergeKey``) or a JSON merge that replaces the list.
"""

from __future__ import annotations

import copy
import secrets
import uuid
from datetime import datetime, timedelta

from aiohttp import web

from edgeheal.base.compat import UTC
from edgeheal.lab.kubeapi.controller import Controller
from edgeheal.lab.kubeapi.wire import (
    NAME_CHARS,
    USER,
    ApiError,
    Obj,
    Target,
    is_dry_run,
    object_response,
    read_body,
    stamp,
    timestamp,
    wire_time,
)


class Writes(Controller):
    """The write handlers (see the module docstring)."""

    def _setup_writes(self) -> None:
        self.deletions: list[Obj] = []
        """Every pod deletion accepted (not dry-run), as the pod was then."""
        self.deleted_by: list[str] = []
        """The user who made each deletion, parallel to :attr:`deletions`."""

    # --- pods --------------------------------------------------------------------------

    async def _delete_pod(self, request: web.Request, target: Target) -> web.Response:
        options = await read_body(request)
        dry_run = is_dry_run(request, options)
        pod = self._get(target)
        name = target.name
        raw_grace = request.query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
        try:
            asked = None if raw_grace is None else int(raw_grace)
        except (TypeError, ValueError) as err:
            raise ApiError(400, "BadRequest", f"gracePeriodSeconds: {raw_grace!r} is not "
                           "an integer") from err
        if asked is not None and asked < 0:
            raise ApiError(422, "Invalid", f"DeleteOptions.meta.k8s.io is invalid: "
                           f"gracePeriodSeconds: Invalid value: {asked}: must be >= 0")
        policy = request.query.get("propagationPolicy", options.get("propagationPolicy"))
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError(422, "Invalid", f"DeleteOptions.meta.k8s.io is invalid: "
                           f"propagationPolicy: Unsupported value: {policy!r}")
        conditions = options.get("preconditions") or {}
        meta = pod["metadata"]
        for field_, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            want = conditions.get(field_)
            if want is not None and want != meta[field_]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods '
                               f'"{name}": Precondition failed: {label} in precondition: '
                               f'{want}, {label} in object meta: {meta[field_]}',
                               name=name, kind="pods")
        spec_grace = int(pod["spec"].get("terminationGracePeriodSeconds", self.grace))
        grace = spec_grace if asked is None else asked
        if not pod["spec"].get("nodeName") or pod["status"].get("phase") in ("Failed",
                                                                             "Succeeded"):
            grace = 0
        now = datetime.now(UTC)
        answer = copy.deepcopy(pod)
        pending = meta.get("deletionTimestamp")
        if pending:
            # already Terminating: only a shorter grace period changes anything
            left = (datetime.strptime(pending, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                    - now).total_seconds()
            if grace >= max(0.0, left) and grace != 0:
                if not dry_run:
                    self._record_deletion(request, answer)
                return object_response(request, "pods", answer)
        answer["metadata"]["deletionTimestamp"] = stamp(now + timedelta(seconds=grace))
        answer["metadata"]["deletionGracePeriodSeconds"] = grace
        if dry_run:
            return object_response(request, "pods", answer)
        self._record_deletion(request, answer)
        meta["deletionTimestamp"] = answer["metadata"]["deletionTimestamp"]
        meta["deletionGracePeriodSeconds"] = grace
        key = (target.namespace or "", name)
        if grace == 0:
            self._put("pods", pod, "DELETED")
        else:
            self._put("pods", pod, "MODIFIED")
            self._spawn(self._terminate(key, meta["uid"], min(float(grace), self.stop_delay)))
        answer = copy.deepcopy(pod)
        if not pending:
            owner = (meta.get("ownerReferences") or [{}])[0].get("name")
            for ds in self._daemonsets:
                if ds.namespace == key[0] and ds.name == owner:
                    self._spawn(self._replace(ds, answer))
        return object_response(request, "pods", answer)

    def _record_deletion(self, request: web.Request, pod: Obj) -> None:
        self.deletions.append(copy.deepcopy(pod))
        self.deleted_by.append(request[USER])

    # --- events ------------------------------------------------------------------------

    async def _post_event(self, request: web.Request, target: Target) -> web.Response:
        ns = target.namespace or ""
        event = await read_body(request)
        dry_run = is_dry_run(request, {})
        involved = event.get("involvedObject")
        problems = []
        if not isinstance(involved, dict):
            problems.append("involvedObject: Required value")
            involved = {}
        if not event.get("reason"):
            problems.append("reason: Required value")
        if not involved.get("kind") or not involved.get("name"):
            problems.append("involvedObject.kind, involvedObject.name: Required value")
        if not involved.get("namespace") and ns not in ("", "default"):
            problems.append(f"involvedObject.namespace: Invalid value: \"\": does not match "
                            f"event.namespace {ns!r}")
        if event.get("type") not in (None, "Normal", "Warning"):
            problems.append(f"type: Unsupported value: {event.get('type')!r}")
        meta = event.setdefault("metadata", {})
        if meta.get("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does "
                           "not match the namespace sent on the request")
        if not meta.get("name") and not meta.get("generateName"):
            problems.append("metadata.name: Required value: name or generateName is required")
        if problems:
            raise ApiError(422, "Invalid", f'Event "{meta.get("name", "")}" is invalid: '
                           + ", ".join(problems), kind="Event")
        for moment in ("firstTimestamp", "lastTimestamp"):
            if event.get(moment):
                event[moment] = wire_time(event[moment], f"Event.{moment}")
        meta["namespace"] = ns
        if not meta.get("name"):
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(NAME_CHARS) for _ in range(5))
        if ("events" in self._store and (ns, meta["name"]) in self._store["events"]):
            raise ApiError(409, "AlreadyExists", f'events "{meta["name"]}" already exists',
                           name=meta["name"], kind="events")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = timestamp()
        event.setdefault("apiVersion", "v1")
        event.setdefault("kind", "Event")
        if not dry_run:
            self._put("events", event, "ADDED")
        return web.json_response(event, status=201)

    # --- nodes -------------------------------------------------------------------------

    async def _patch_node_status(self, request: web.Request, target: Target) -> web.Response:
        node = self._get(target)
        kind = request.content_type
        if kind not in ("application/strategic-merge-patch+json",
                        "application/merge-patch+json"):
            raise ApiError(415, "UnsupportedMediaType",
                           f"the body of the request was in an unknown format - accepted "
                           f"media types include: application/strategic-merge-patch+json, "
                           f"application/merge-patch+json (got {kind})")
        patch = await read_body(request)
        try:
            conditions = patch["status"]["conditions"]
            if not isinstance(conditions, list) or not all(
                    isinstance(c, dict) and "type" in c for c in conditions):
                raise TypeError("conditions must be a list of objects with a type")
        except (KeyError, TypeError) as err:
            raise ApiError(422, "Invalid", f"unsupported patch: {err}") from err
        for cond in conditions:
            for moment in ("lastHeartbeatTime", "lastTransitionTime"):
                if cond.get(moment):
                    cond[moment] = wire_time(cond[moment], f"NodeCondition.{moment}")
        if is_dry_run(request, {}):
            return web.json_response(node)
        if kind == "application/merge-patch+json":
            node["status"]["conditions"] = conditions
        else:
            by_type = {c["type"]: c for c in node["status"]["conditions"]}
            for cond in conditions:
                by_type[cond["type"]] = {**by_type.get(cond["type"], {}), **cond}
            node["status"]["conditions"] = list(by_type.values())
        self._put("nodes", node, "MODIFIED")
        return web.json_response(node)
