"""The archive: the members cut to the size bound, the manifest, one tar.gz written new.

**Bounded.** The archive is at most ``max_bytes`` (8 MiB by default): members are added in
the order :func:`edgeheal.tools.bundle.members.collect` made them, each cut to what is left
of the budget (the journal keeps its last lines), and the manifest says which were cut.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path
from typing import Any

from edgeheal import __version__
from edgeheal.tools.bundle.members import MAX_MEMBER, Member, Options, json_bytes

_TAR_OVERHEAD = 2048
"""Bytes a member adds to the tar stream beyond its data (header and padding), generously."""


class BundleError(Exception):
    """The archive cannot be written (the message names the path or the bound)."""


def _fit(members: list[Member], budget: int) -> None:
    """Cut members, in order, to what is left of ``budget`` bytes (the journal keeps its
    tail, the others their head)."""
    left = budget
    for member in members:
        room = max(0, min(left - _TAR_OVERHEAD, MAX_MEMBER))
        if len(member.data) > room:
            member.cut = True
            if member.name == "journal.txt":
                tail = member.data[len(member.data) - room:]
                nl = tail.find(b"\n")
                member.data = tail[nl + 1:] if 0 <= nl < len(tail) - 1 else tail
            else:
                member.data = member.data[:room]
        left -= len(member.data) + _TAR_OVERHEAD


def manifest(members: list[Member], options: Options) -> dict[str, Any]:
    return {"edgeheal": __version__, "config": options.config_path,
            "max_bytes": options.max_bytes,
            "members": [{"name": m.name, "bytes": len(m.data),
                         **({"note": m.note} if m.note else {}),
                         **({"cut": True} if m.cut else {}),
                         **({"redacted": m.redactions} if m.redactions else {})}
                        for m in members]}


def write(members: list[Member], path: Path, options: Options) -> dict[str, Any]:
    """Write the archive to ``path`` (created new, mode 0600) and return its manifest;
    :class:`BundleError` if it cannot be."""
    if options.max_bytes < 64 * 1024:
        raise BundleError(f"--max-size {options.max_bytes} is below 64 KiB: too small for "
                          "even the manifest and the version")
    reserve = 16 * 1024  # the manifest (~3 KB), the tar end blocks, gzip over stored blocks
    _fit(members, options.max_bytes - reserve)
    doc = manifest(members, options)
    root = path.name.removesuffix(".tar.gz").removesuffix(".tgz") or "edgeheal-bundle"
    buf = io.BytesIO()
    stamp = time.time()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for member in [Member("manifest.json", json_bytes(doc)), *members]:
            if not member.data and member.note:
                continue  # the manifest says why it is empty
            info = tarfile.TarInfo(f"{root}/{member.name}")
            info.size, info.mtime, info.mode = len(member.data), int(stamp), 0o600
            tar.addfile(info, io.BytesIO(member.data))
    data = buf.getvalue()
    if len(data) > options.max_bytes:  # cannot happen: the budget leaves room for gzip
        raise BundleError(f"the archive would be {len(data)} bytes, over --max-size "
                          f"{options.max_bytes}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise BundleError(f"{path}: already exists (not overwritten)") from None
    except OSError as err:
        raise BundleError(f"{path}: cannot create: {err.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    doc["archive_bytes"] = len(data)
    return doc


__all__ = ["BundleError", "manifest", "write"]
