"""How a setting is declared: a dataclass field whose metadata documents it.

Every section of the schema declares its keys with :func:`setting`; the metadata
(:func:`doc`) is what the other modules of this package read: its text renders
``docs/configuration.md`` (:func:`edgeheal.config.render.reference`), ``bounds``,
``duration`` and ``file`` drive the parser (:mod:`edgeheal.config.parse`) and the generic
rules, ``secret`` the redaction.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def doc(text: str, *, secret: bool = False, duration: bool = False,
        bounds: tuple[float, float] | None = None, file: bool = False) -> dict[str, Any]:
    """Field metadata. ``bounds``: the accepted (least, most) value of a number, shown in
    the reference and enforced by the parser (a duration without bounds gets
    :data:`edgeheal.config.parse.DURATION_BOUNDS`). ``file``: a path that must be absolute
    and, for ``check-config``, an existing readable regular file."""
    return {"doc": text, "secret": secret, "duration": duration, "bounds": bounds,
            "file": file}


def setting(default: Any, text: str, **kw: Any) -> Any:
    if isinstance(default, list | dict | set):
        raise TypeError("use a tuple for sequence defaults")
    return field(default=default, metadata=doc(text, **kw))
