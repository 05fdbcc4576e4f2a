"""Interface names against the shell-style globs of ``[offload] interfaces`` (``wwan*``).

One definition, because the config, the enforcer, its link-event filter and ``diagnose``
must agree on what a pattern selects: case-sensitive (Linux interface names are), with
``*``, ``?`` and ``[...]`` as in the shell, and no path semantics.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable


def matches(name: str, patterns: Iterable[str]) -> bool:
    """Does interface ``name`` match any of ``patterns``?"""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def matching(names: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """The ``names`` that match any of ``patterns``, in their order."""
    pats = tuple(patterns)
    return [n for n in names if matches(n, pats)]
