"""A pod as the client reads it: only the fields the remedy decides on.

Why its own module: the client and the pod remedy (:mod:`edgeheal.remedies.pod`) share it,
and a frozen record parsed once from the API's JSON keeps their decisions (this node? the
same uid? already Terminating?) away from raw dictionaries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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
    def from_json(cls, obj: Mapping[str, Any]) -> Pod:
        meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or ())
        return cls(namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")),
                   uid=str(meta.get("uid", "")), node=str(spec.get("nodeName") or ""),
                   phase=str(status.get("phase", "")), ready=ready,
                   deleting=bool(meta.get("deletionTimestamp")))
