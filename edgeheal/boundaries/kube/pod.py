"""A pod as the client reads it: only the fields the remedy decides on.

Why its own module: the client and the pod remedy (:mod:`edgeheal.remedies.pod`) share it,
and a frozen record parsed once from the API's JSON keeps their decisions (this node? the
same uid? already Terminating?) away from raw dictionaries. Parsing checks the shape of
every field it reads: a list where an object belongs, or a number where a string does, is
a :class:`~.answers.KubeShapeError` (a :class:`~.errors.KubeError`), never an
``AttributeError`` escaping into the remedy (issue 27).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeheal.boundaries.kube.answers import items, mapping, text


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    ready: bool
    deleting: bool

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_json(cls, obj: Any, what: str = "a pod") -> Pod:
        """The pod in ``obj``; ``what`` names where it came from in a shape error."""
        obj = mapping(obj, what, "the pod", optional=False)
        meta = mapping(obj.get("metadata"), what, "metadata")
        spec = mapping(obj.get("spec"), what, "spec")
        status = mapping(obj.get("status"), what, "status")
        ready = False
        for i, raw in enumerate(items(status.get("conditions"), what, "status.conditions")):
            condition = mapping(raw, what, f"status.conditions[{i}]", optional=False)
            if (text(condition.get("type"), what, f"status.conditions[{i}].type") == "Ready"
                    and text(condition.get("status"), what,
                             f"status.conditions[{i}].status") == "True"):
                ready = True
        deleting = meta.get("deletionTimestamp")
        return cls(namespace=text(meta.get("namespace"), what, "metadata.namespace"),
                   name=text(meta.get("name"), what, "metadata.name"),
                   uid=text(meta.get("uid"), what, "metadata.uid"),
                   node=text(spec.get("nodeName"), what, "spec.nodeName"),
                   phase=text(status.get("phase"), what, "status.phase"), ready=ready,
                   deleting=bool(text(deleting, what, "metadata.deletionTimestamp")))
