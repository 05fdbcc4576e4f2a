"""Settings -> text for people: the effective config with secrets hidden, and the reference.

``check-config`` prints :func:`redacted` (durations as ``"5s"``, ``secret`` fields as
:data:`REDACTED`); ``docs/configuration.md`` is rendered from :func:`reference`, the
``doc`` metadata of every field, and a test keeps the two in step.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from edgeheal.config.parse import DURATION_BOUNDS, format_duration
from edgeheal.config.schema import Config

REDACTED = "<redacted>"


def redacted(obj: Any) -> Any:
    """A JSON-ready copy with secret fields replaced; what ``check-config`` prints."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            if f.name in ("source", "sections"):
                continue
            value = getattr(obj, f.name)
            if f.metadata.get("secret") and value:
                out[f.name] = REDACTED
            elif f.metadata.get("duration") and isinstance(value, float):
                out[f.name] = format_duration(value)
            else:
                out[f.name] = redacted(value)
        return out
    if isinstance(obj, tuple):
        return [redacted(v) for v in obj]
    return obj


def reference() -> list[tuple[str, str, str]]:
    """(key path, default, doc) for every key: the source of docs/configuration.md."""
    rows: list[tuple[str, str, str]] = []

    def walk(cls: type[Any], path: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in ("source", "sections"):
                continue
            tp, key = hints[f.name], f"{path}.{f.name}" if path else f.name
            if typing.get_origin(tp) in (types.UnionType, typing.Union):
                tables = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
                tp = tables[0] if tables else tp  # an optional section: document its keys
            sub = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
            if dataclasses.is_dataclass(sub):
                walk(sub, key + ("[]" if sub is not tp else ""))  # type: ignore[arg-type]
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            duration = bool(f.metadata.get("duration"))
            shown = (format_duration(default) if duration
                     and isinstance(default, float) else default)
            rows.append((key, json.dumps(shown), f.metadata.get("doc", "")
                         + _constraints(f.metadata)))

    walk(Config, "")
    return rows


def _constraints(meta: Any) -> str:
    """What the parser enforces beyond the type, as a sentence for the reference."""
    out = ""
    bounds = meta.get("bounds") or (DURATION_BOUNDS if meta.get("duration") else None)
    if bounds is not None:
        fmt = format_duration if meta.get("duration") else (lambda v: f"{v:g}")
        out += f" Range: {fmt(bounds[0])} to {fmt(bounds[1])}."
    if meta.get("file"):
        out += (" An absolute path; `check-config` also checks that the file exists and "
                "is readable.")
    return out
