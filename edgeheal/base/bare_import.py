"""Import a package's submodules without running its package ``__init__``.

Some dependencies' ``__init__`` imports far more than the agent uses, and the agent's
budget is 60 MB of RSS with every feature on (docs/footprint.md). ``import pyroute2`` loads
every subsystem of the library (:mod:`edgeheal.boundaries.kernel.pyroute2_light`); ``import
aiohttp`` loads its HTTP *client* too (cookie jar, connector, multipart...), whose connector module
builds two TLS contexts at import, one of them loading the system's ~150 CA certificates; the agent
only serves HTTP (:mod:`edgeheal.agent.endpoints`), and the server half of aiohttp never needs them.

:func:`skip_init` registers a bare package object (same ``__path__`` and spec, the few
attributes its submodules read from it, nothing executed) before the first import;
submodules then import normally and pull in only what they need. If anything already
imported the real package, that one is used. Any other package-level name asked for later
(``from aiohttp import ClientSession``, ``pyroute2.IPRoute``) runs the real ``__init__``
into the same module object, paying its cost only then, so other code in the process
(tests, the lab) still sees the whole package.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def skip_init(name: str, *, literals: tuple[str, ...] = ()) -> bool:
    """Make ``import <name>.<sub>`` skip ``<name>/__init__.py`` (idempotent). ``literals``:
    package-level strings its submodules import (``from . import __version__``), read from
    the ``__init__`` source without running it. False, and nothing done, when the package
    was already imported, is not installed, or a literal cannot be read."""
    if name in sys.modules:
        return False
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None or spec.origin is None:
        return False  # not installed: the caller's import raises the usual error
    attrs = {var: _assigned(spec.origin, var) for var in literals}
    if None in attrs.values():
        return False  # a changed __init__: import it whole, as usual
    package = types.ModuleType(name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    package.__package__ = name
    package.__dict__.update(attrs)
    loader = spec.loader

    def full(attr: str) -> object:
        """A submodule is imported as such; any other package-level name runs the real
        ``__init__`` into this module."""
        if importlib.util.find_spec(f"{name}.{attr}") is not None:
            return importlib.import_module(f"{name}.{attr}")
        del package.__dict__["__getattr__"]
        if loader is not None:
            loader.exec_module(package)
        try:
            return package.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    package.__dict__["__getattr__"] = full
    sys.modules[name] = package
    return True


def _assigned(path: str, variable: str) -> str | None:
    """The string literal assigned to ``variable`` at the top level of the file ``path``
    (``__version__ = "3.9.5"``)."""
    try:
        with open(path, encoding="utf-8") as source:
            for line in source:
                head, sep, value = line.partition("=")
                if sep and head.strip() == variable:
                    value = value.strip()
                    quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'"
                    return value[1:-1] if quoted else None
    except (OSError, UnicodeDecodeError):
        return None
    return None
