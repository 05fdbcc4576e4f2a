"""Import pyroute2's submodules without its package ``__init__``.

``import pyroute2`` runs a package ``__init__`` that imports every subsystem the library
has (IPDB, NDB, conntrack, ipset, devlink, nftables...): measured here, 11 MB of RSS on top
of the agent's other imports, of which the agent uses three small parts (the ethtool
ioctls, an rtnetlink socket and the WireGuard generic-netlink messages), about 6 MB. The
agent's budget is 60 MB with every feature on, so :func:`light` registers a bare package
object for ``pyroute2`` (same ``__path__``, nothing executed) before the first import;
submodules then import normally and only pull in what they need. If anything already
imported the real package, that one is used. ``bench/footprint.py`` measures the effect.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def light() -> None:
    """Make ``import pyroute2.<sub>`` skip the package ``__init__`` (idempotent)."""
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.submodule_search_locations is None:
        return  # not installed: the caller's import raises the usual error
    package = types.ModuleType("pyroute2")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    package.__package__ = "pyroute2"
    loader = spec.loader

    def full(name: str) -> object:
        """``from pyroute2 import X`` still works: a submodule is imported as such; any
        other package-level name runs the real ``__init__`` into this module (paying its
        cost only then)."""
        if importlib.util.find_spec(f"pyroute2.{name}") is not None:
            return importlib.import_module(f"pyroute2.{name}")
        del package.__dict__["__getattr__"]
        if loader is not None:
            loader.exec_module(package)
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module 'pyroute2' has no attribute {name!r}") from None

    package.__dict__["__getattr__"] = full
    sys.modules["pyroute2"] = package
