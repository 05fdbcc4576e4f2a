"""Label and field selectors, parsed and matched as the API server does.

Label selectors take the whole grammar of ``k8s.io/apimachinery/pkg/labels``: equality
(``k=v``, ``k==v``, ``k!=v``), sets (``k in (a,b)``, ``k notin (a,b)``), existence (``k``,
``!k``) and the integer comparisons (``k>1``, ``k<1``), comma-separated (AND). Field
selectors take ``=``, ``==`` and ``!=`` on the fields each resource supports; any other field
is the API server's 400 ``field label not supported``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|>|<|[A-Za-z0-9][A-Za-z0-9._/-]*|\S)")
_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")


class SelectorError(ValueError):
    """A selector the API server would refuse with 400 BadRequest."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str
    """``in``, ``notin``, ``exists``, ``!``, ``gt`` or ``lt`` (``=`` is ``in`` one value)."""
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op == "in":
            return present and labels[self.key] in self.values
        if self.op == "notin":
            return not present or labels[self.key] not in self.values
        if not present:
            return False
        try:
            have = int(labels[self.key])
        except ValueError:
            return False
        limit = int(self.values[0])
        return have > limit if self.op == "gt" else have < limit


def _check_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix))) \
            or not _NAME.fullmatch(name):
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r}: a "
                            "qualified name must consist of alphanumeric characters, '-', "
                            "'_' or '.', and must start and end with an alphanumeric "
                            "character")
    return key


def _check_value(value: str) -> str:
    if not _VALUE.fullmatch(value):
        raise SelectorError(f"unable to parse requirement: invalid label value: {value!r}")
    return value


def parse_labels(selector: str) -> list[Requirement]:  # noqa: PLR0915 - one grammar
    """``app in (flannel),tier!=x,k,!j`` -> requirements (all must hold)."""
    tokens: list[str] = []
    pos = 0
    text = selector.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            break
        tokens.append(m.group(1))
        pos = m.end()
    out: list[Requirement] = []
    i = 0

    def take() -> str:
        nonlocal i
        if i >= len(tokens):
            raise SelectorError(f"unable to parse requirement: {selector!r} ends too early")
        i += 1
        return tokens[i - 1]

    while i < len(tokens):
        first = take()
        if first == "!":
            out.append(Requirement(_check_key(take()), "!"))
        else:
            key = _check_key(first)
            op = tokens[i] if i < len(tokens) else ","
            if op == ",":
                out.append(Requirement(key, "exists"))
            else:
                i += 1
                if op in ("=", "==", "!="):
                    value = tokens[i] if i < len(tokens) and tokens[i] != "," else ""
                    if value:
                        i += 1
                    out.append(Requirement(key, "notin" if op == "!=" else "in",
                                           (_check_value(value),)))
                elif op in ("in", "notin"):
                    if take() != "(":
                        raise SelectorError(f"unable to parse requirement: found {op!r}, "
                                            "expected: '('")
                    values: list[str] = []
                    while (tok := take()) != ")":
                        if tok != ",":
                            values.append(_check_value(tok))
                    out.append(Requirement(key, op, tuple(values)))
                elif op in (">", "<"):
                    number = take()
                    if not re.fullmatch(r"-?\d+", number):
                        raise SelectorError(f"unable to parse requirement: for 'gt', 'lt' "
                                            f"operators, the value must be an integer: "
                                            f"{number!r}")
                    out.append(Requirement(key, "gt" if op == ">" else "lt", (number,)))
                else:
                    raise SelectorError(f"unable to parse requirement: found {op!r}, "
                                        "expected: in, notin, =, ==, !=, gt, lt")
        if i < len(tokens):
            if tokens[i] != ",":
                raise SelectorError(f"unable to parse requirement: found {tokens[i]!r}, "
                                    "expected: ','")
            i += 1
    return out


def labels_match(requirements: list[Requirement], labels: Mapping[str, str]) -> bool:
    return all(r.matches(labels) for r in requirements)


def _path(*keys: str) -> Callable[[Obj], str]:
    def get(obj: Obj) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, bool):
            return "true" if value else "false"
        return "" if value is None else str(value)
    return get


_META = {"metadata.name": _path("metadata", "name"),
         "metadata.namespace": _path("metadata", "namespace")}
FIELDS: dict[str, dict[str, Callable[[Obj], str]]] = {
    "pods": {**_META, "spec.nodeName": _path("spec", "nodeName"),
             "spec.restartPolicy": _path("spec", "restartPolicy"),
             "spec.schedulerName": _path("spec", "schedulerName"),
             "spec.serviceAccountName": _path("spec", "serviceAccountName"),
             "spec.hostNetwork": _path("spec", "hostNetwork"),
             "status.phase": _path("status", "phase"),
             "status.podIP": _path("status", "podIP"),
             "status.nominatedNodeName": _path("status", "nominatedNodeName")},
    "nodes": {**_META, "spec.unschedulable": _path("spec", "unschedulable")},
    "events": {**_META, **{f"involvedObject.{k}": _path("involvedObject", k) for k in (
        "kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
        "reason": _path("reason"), "reportingComponent": _path("reportingComponent"),
        "source": _path("source", "component"), "type": _path("type")},
}
"""The field selectors each resource supports (as the API server's field-label conversions)."""

FieldRequirement = tuple[str, Callable[[Obj], str], bool, str]


def parse_fields(selector: str, resource: str = "pods") -> list[FieldRequirement]:
    """``spec.nodeName=edge-1,status.phase!=Failed`` -> (field, getter, equal, value)."""
    out: list[FieldRequirement] = []
    supported = FIELDS.get(resource, _META)
    for raw in filter(None, (p.strip() for p in selector.split(","))):
        m = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", raw)
        if not m:
            raise SelectorError(f"invalid selector: '{selector}'; can't understand '{raw}'")
        if m.group(1) not in supported:
            raise SelectorError(f'field label not supported: {m.group(1)}')
        out.append((m.group(1), supported[m.group(1)], m.group(2) != "!=", m.group(3)))
    return out


def fields_match(requirements: list[FieldRequirement], obj: Obj) -> bool:
    return all((get(obj) == value) == equal for _, get, equal, value in requirements)
