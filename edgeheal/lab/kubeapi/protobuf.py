"""Just enough of Kubernetes's protobuf encoding to read the self reviews kubectl posts.

kubectl sends built-in types it creates (``SelfSubjectAccessReview`` for ``auth can-i``,
``SelfSubjectRulesReview`` for ``auth can-i --list``, ``SelfSubjectReview`` for ``auth
whoami``) as ``application/vnd.kubernetes.protobuf`` and does not fall back to JSON on a 415.
The envelope is the magic ``k8s\\x00`` then a ``runtime.Unknown`` (1: TypeMeta, 2: raw
object); these objects are 1: ObjectMeta, 2: spec (3: status). Only the spec fields below are
read; answers go back as JSON, which the client accepts too.
"""

from __future__ import annotations

from typing import Any

MAGIC = b"k8s\x00"
RESOURCE_ATTRIBUTES = ("namespace", "verb", "group", "version", "resource", "subresource",
                       "name")
"""``authorization.k8s.io/v1.ResourceAttributes`` fields 1-7, in order."""
NON_RESOURCE_ATTRIBUTES = ("path", "verb")


class ProtobufError(ValueError):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ProtobufError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def fields(data: bytes) -> dict[int, list[Any]]:
    """One message's fields: number -> values (bytes for length-delimited, int otherwise)."""
    out: dict[int, list[Any]] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise ProtobufError("truncated field")
            value, pos = data[pos:pos + size], pos + size
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _strings(message: bytes, names: tuple[str, ...]) -> dict[str, str]:
    found = fields(message)
    return {name: found[i + 1][-1].decode() for i, name in enumerate(names)
            if found.get(i + 1) and found[i + 1][-1]}


def decode_review(body: bytes) -> dict[str, Any]:
    """A self review's JSON shape (``kind``, ``apiVersion``, ``spec``) from its protobuf."""
    if not body.startswith(MAGIC):
        raise ProtobufError("not a Kubernetes protobuf envelope (no k8s magic)")
    envelope = fields(body[len(MAGIC):])
    type_meta = fields((envelope.get(1) or [b""])[0])
    api_version = (type_meta.get(1) or [b""])[0].decode()
    kind = (type_meta.get(2) or [b""])[0].decode()
    obj = fields((envelope.get(2) or [b""])[0])
    spec_raw = (obj.get(2) or [b""])[0]
    spec: dict[str, Any] = {}
    if kind == "SelfSubjectAccessReview":
        parts = fields(spec_raw)
        if parts.get(1):
            spec["resourceAttributes"] = _strings(parts[1][0], RESOURCE_ATTRIBUTES)
        if parts.get(2):
            spec["nonResourceAttributes"] = _strings(parts[2][0], NON_RESOURCE_ATTRIBUTES)
    elif kind == "SelfSubjectRulesReview":
        spec = _strings(spec_raw, ("namespace",))
    return {"apiVersion": api_version, "kind": kind, "spec": spec}
