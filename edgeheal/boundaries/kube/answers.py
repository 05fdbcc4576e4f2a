"""Reading the API's answers within bounds, and parsing them into the client's own errors.

Why a module of its own: everything the API server (or whatever answers in its place)
sends is outside input, and the agent that reads it sits in every collector's readiness
path. So an answer is read in chunks and refused past a cap (a body past
:data:`BODY_MAX`, a watch line past :data:`WATCH_LINE_MAX`) before it is buffered whole,
JSON is decoded with every failure (not JSON, not UTF-8, nested too deep for the decoder)
turned into a :class:`~.errors.KubeError`, and the shape of what the client reads (an
object where an object must be, a string where a string must be) is checked by the small
helpers below, which raise :class:`KubeShapeError` naming the field. Issue 27: a watch
that never sent a newline was buffered to 5.6 GB, a 45 MB pod list took RSS from 54 to
348 MB, and a list where an object belonged escaped as ``AttributeError`` and crash-looped
the remediation task.

Parsing in a thread would not keep the loop free: CPython's JSON decoder holds the GIL for
the whole document. What keeps the loop free is small answers: the caps here, and lists
asked for in pages (:data:`LIST_LIMIT`) with the field and label selectors.
"""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from edgeheal.boundaries.kube.errors import KubeError

BODY_MAX = 4 * 1024 * 1024
"""The largest response body read, bytes (a pod is a few KiB, a page of them well under
this); a larger one is a :class:`KubeError` naming the cap, read no further."""
ERROR_BODY_MAX = 64 * 1024
"""The part of an error answer read for its message (the rest is dropped, not refused)."""
WATCH_LINE_MAX = 1024 * 1024
"""The longest watch event (one JSON line), bytes; a longer one ends the watch with a
:class:`KubeError` naming the cap."""
LIST_LIMIT = 100
"""Items asked for per list page (``limit``, then ``continue``): a page of real pods (10-20
KiB each with their managed fields) stays well under :data:`BODY_MAX`, and decoding one
takes a few milliseconds of the loop, not hundreds."""
LIST_PAGES_MAX = 1000
GC_PAUSE_FROM = 16 * 1024
"""Bodies from this size are decoded with the cyclic collector held off (:func:`decode`)."""
"""Pages followed in one list before it is refused (a server that never stops sending a
``continue`` token, or 100,000 pods where this node has one)."""


class KubeShapeError(KubeError):
    """The API answered JSON of the wrong shape (a list where an object belongs, a number
    where a string does): named by the call and the field, never quoting the value."""


async def read_body(chunks: AsyncIterator[bytes], what: str, *, limit: int = BODY_MAX,
                    declared: str | None = None, truncate: bool = False) -> bytes:
    """The whole body from ``chunks``, refused (``truncate``: cut) past ``limit`` bytes.
    ``declared`` is the Content-Length header, refused at once when it is over."""
    if declared is not None and not truncate:
        try:
            size = int(declared)
        except ValueError:
            size = 0
        if size > limit:
            raise _too_big(what, f"a {size}-byte answer", limit)
    body = bytearray()
    async for chunk in chunks:
        if len(body) + len(chunk) > limit:
            if truncate:
                body += chunk[:limit - len(body)]
                break
            raise _too_big(what, "an answer", limit)
        body += chunk
    return bytes(body)


async def read_lines(chunks: AsyncIterator[bytes], what: str, *,
                     limit: int = WATCH_LINE_MAX) -> AsyncIterator[bytes]:
    """The non-empty lines of a stream, each refused past ``limit`` bytes before it is
    buffered further (httpx's ``aiter_lines`` buffers a line without end)."""
    pending = bytearray()
    async for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if len(pending) + end - start > limit:
                raise _too_big(what, "a watch event", limit)
            pending += chunk[start:end]
            if pending.strip():
                yield bytes(pending)
            pending.clear()
            start = end + 1
        if len(pending) + len(chunk) - start > limit:
            raise _too_big(what, "a watch event", limit)
        pending += chunk[start:]
    if pending.strip():
        yield bytes(pending)


def _too_big(what: str, thing: str, limit: int) -> KubeError:
    size = (f"{limit // 2**20} MiB" if limit % 2**20 == 0 else f"{limit // 1024} KiB"
            if limit % 1024 == 0 else f"{limit}-byte")
    return KubeError(f"{what}: the API sent {thing} over the {size} cap "
                     "(docs/remediation.md); refused, not read further")


def decode(body: bytes, what: str, thing: str = "a body") -> Any:
    """JSON from ``body``; anything that is not JSON is a :class:`KubeError`.

    The cyclic garbage collector is held off while a large body is decoded: the decoder
    makes thousands of containers, each counted towards a collection, and a full
    collection of the agent's heap stalled the loop for 20-50 ms several times in a paged
    list (the decoded objects are acyclic and freed by reference counting)."""
    paused = len(body) >= GC_PAUSE_FROM and gc.isenabled()
    if paused:
        gc.disable()
    try:
        return json.loads(body)
    except RecursionError:
        raise KubeError(f"{what}: the API answered with {thing} nested too deeply to "
                        "read") from None
    except ValueError:  # also UnicodeDecodeError
        raise KubeError(f"{what}: the API answered with {thing} that is not JSON") from None
    finally:
        if paused:
            gc.enable()


def mapping(value: Any, what: str, field: str, *, optional: bool = True,
            ) -> Mapping[str, Any]:
    """``value`` as an object (None or missing: empty, when ``optional``)."""
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise KubeShapeError(f"{what}: {field} is {_kind(value)}, not an object")
    return value


def items(value: Any, what: str, field: str) -> list[Any]:
    """``value`` as a list (None or missing: empty)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise KubeShapeError(f"{what}: {field} is {_kind(value)}, not a list")
    return value


def text(value: Any, what: str, field: str) -> str:
    """``value`` as a string (None or missing: ""); numbers are not strings here."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise KubeShapeError(f"{what}: {field} is {_kind(value)}, not a string")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(
                type(value), type(value).__name__)
