"""State files: what the agent wrote in an earlier run, read back trusting nothing about it.

Why one helper: the agent's state files (the remediation histories, the open problems in
the outbox, the outbox's rows) are its own, but a power cut on an SD card, a hand edit or
another version damages them, and one bad value must never stop the agent at start (it
serves every collector's readiness probe). So each reader goes through :func:`parse` (or
:func:`read`), which bounds what it will look at before it parses:

- **size**: at most ``max_bytes`` (default :data:`MAX_BYTES`);
- **depth**: JSON nested at most ``max_depth`` levels (default :data:`MAX_DEPTH`), counted
  without recursion, so 100,000 ``[`` are refused before ``json`` could overflow its stack;
- **numbers**: ``NaN``, ``Infinity`` and a literal too large for a float (``1e400``) are
  refused, so no ``int(inf)`` waits further down;
- **shape**: the top-level value's type (an object unless told otherwise); the reader
  checks its own fields and raises :class:`StateFileError` too.

What fails is moved aside (:func:`move_aside`: renamed ``<name>.corrupt-<time>``, kept for
a human), and the reader starts afresh; it logs it once and says so with a
:class:`Reset`, which the agent raises as ``agent.state_reset`` (the file and the reason in
``detail``). Files are opened with ``O_NOFOLLOW``: a symlink in their place is refused, not
followed.

**Format versions.** Every state file says which format it is in (a JSON file its
``"format"`` field, read by :func:`format_of`; the outbox SQLite's ``PRAGMA user_version``).
A file without one is release 0.2.0's, format 1, and is read as such (the next write adds
the field). A file of a *newer* format than this build knows was written by a later release
and this one is a downgrade: it is never parsed further, never moved aside and never
written (:class:`NewerFormat`); that piece of state runs in memory for this run, and the
agent says so once (log, ``/status``, ``edgeheal_state_file_newer``, ``agent.state_newer``)
with a :class:`Newer`. Why not refuse to start, as a downgrade tool would: edgeheal gates
every collector's readiness and enforces the offload fix, so an agent that stops is itself
the outage; losing one file's history for a run is the smaller harm.

**Power cuts.** A JSON state file is saved atomically (temp file, fsync, rename) and then
:func:`fsync_dir`: without the directory's fsync the rename waits for ext4's next journal
commit, and a cut before it brings the old file back although the save returned.
:func:`sweep_temporary` removes a temp file a cut left between creating and renaming it
(``tests/qemu/test_power_cut.py`` found it).
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_BYTES = 1024 * 1024
"""Largest state file read (the histories are a few KiB; the open problems less)."""
MAX_DEPTH = 32
"""Deepest JSON nesting accepted (the agent writes at most 4 levels)."""


class StateFileError(ValueError):
    """A state file (or record) that is not what the agent writes: ``reason`` says how."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what, self.reason = what, reason


@dataclass(frozen=True, slots=True)
class Reset:
    """A state file (or record) the agent could not use and started afresh without."""

    file: str
    reason: str
    moved_to: str | None
    """Where the bad content now is (None: it could not be moved, or had nowhere to go)."""

    def detail(self) -> dict[str, Any]:
        return {"file": self.file, "reason": self.reason, "moved_to": self.moved_to}


@dataclass(frozen=True, slots=True)
class Newer:
    """A state file of a newer format than this build reads: left untouched, run in memory."""

    file: str
    found: int
    """The file's format."""
    known: int
    """The newest format this build reads."""

    def detail(self) -> dict[str, Any]:
        return {"file": self.file, "format": self.found, "known_format": self.known}

    def describe(self) -> str:
        return (f"{self.file} is in format {self.found}, newer than this build reads "
                f"(up to {self.known}): written by a later edgeheal, so this is a downgrade; "
                "the file is left untouched and this run keeps that state in memory only "
                "(upgrade again, or move the file aside to start it afresh)")


class NewerFormat(StateFileError):
    """The state file is of a newer format than this build reads (:attr:`newer` says)."""

    def __init__(self, newer: Newer) -> None:
        super().__init__(newer.file, f"format {newer.found}, newer than this build reads "
                         f"(up to {newer.known})")
        self.newer = newer


def format_of(data: dict[str, Any], *, what: str, known: int) -> int:
    """The ``"format"`` of a JSON state file's object (absent: 1, release 0.2.0's);
    :class:`NewerFormat` if newer than ``known``, :class:`StateFileError` if not a
    format number."""
    found = data.get("format", 1)
    if type(found) is not int or found < 1:
        raise StateFileError(what, f"format {str(found)[:20]} is not a format number")
    if found > known:
        raise NewerFormat(Newer(what, found, known))
    return found


def depth(text: str) -> int:
    """How deeply ``text`` nests JSON arrays and objects (strings skipped), iteratively."""
    deepest = level = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
        elif ch in "]}":
            level -= 1
    return deepest


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not a number a state file holds")


def parse(raw: str | bytes, *, what: str, shape: type = dict, max_bytes: int = MAX_BYTES,
          max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``raw`` if it is within the bounds (module docstring) and of type
    ``shape``; else :class:`StateFileError` naming ``what`` and the reason."""
    if len(raw) > max_bytes:
        raise StateFileError(what, f"{len(raw)} bytes, over the {max_bytes}-byte cap")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as err:
        raise StateFileError(what, f"not UTF-8 (byte {err.start})") from None
    nested = depth(text)
    if nested > max_depth:
        raise StateFileError(what, f"nested {nested} levels deep, over the cap of "
                             f"{max_depth}")
    try:
        value = json.loads(text, parse_float=_finite, parse_constant=_constant)
    except (ValueError, RecursionError) as err:
        raise StateFileError(what, f"not JSON ({str(err)[:120]})") from None
    if not isinstance(value, shape):
        raise StateFileError(what, f"a JSON {_json_type(value)}, expected a JSON "
                             f"{_json_type(shape())}")
    return value


def _json_type(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean",
            type(None): "null"}.get(type(value), "number")


def read(path: Path, *, shape: type = dict, max_bytes: int = MAX_BYTES,
         max_depth: int = MAX_DEPTH) -> Any | None:
    """The JSON value of the state file at ``path`` (None if there is none), opened with
    ``O_NOFOLLOW`` and bounded as :func:`parse`; :class:`StateFileError` if it is not a
    regular file or fails :func:`parse`; OSError if it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == 40:  # ELOOP: a symlink where the file should be
            raise StateFileError(str(path), "a symlink, not a file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateFileError(str(path), "not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(max_bytes + 1)
    finally:
        os.close(fd)
    return parse(raw, what=str(path), shape=shape, max_bytes=max_bytes,
                 max_depth=max_depth)


def move_aside(path: Path, wall: float) -> Path | None:
    """Rename ``path`` to ``<name>.corrupt-<wall>`` (kept for a human) and return the new
    name; None if there was nothing there or it could not be moved (the caller carries
    on: it overwrites the file on its next save)."""
    aside = path.with_name(f"{path.name}.corrupt-{int(wall)}")
    try:
        os.rename(path, aside)  # renames a symlink itself, never its target
    except OSError:
        return None
    return aside


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path``: makes a rename (or a new name) in it durable. Without
    it, ext4 commits the rename with its next journal commit (up to 5 s later by default),
    and a power cut before that brings back the old file although the write "returned"."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sweep_temporary(path: Path) -> list[str]:
    """Remove the temporary files (``.<name>.*``, regular files only, never through a
    symlink) that an atomic save of ``path`` left when a crash or a power cut interrupted
    it between creating and renaming one; return their names. Only for a caller that owns
    the file's saves (the agent holds ``agent.lock``), before its first save."""
    removed: list[str] = []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    prefix = f".{path.name}."
    for name in sorted(names):
        if not name.startswith(prefix):
            continue
        try:
            if not stat.S_ISREG(os.lstat(path.parent / name).st_mode):
                continue
            os.unlink(path.parent / name)
        except OSError:
            continue
        removed.append(name)
    return removed
