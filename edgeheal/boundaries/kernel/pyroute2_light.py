"""Import pyroute2's submodules without its package ``__init__``.

``import pyroute2`` runs a package ``__init__`` that imports every subsystem the library
has (IPDB, NDB, conntrack, ipset, devlink, nftables...): measured here, 11 MB of RSS on top
of the agent's other imports, of which the agent uses three small parts (the ethtool
ioctls, an rtnetlink socket and the WireGuard generic-netlink messages), about 6 MB. The
agent's budget is 60 MB with every feature on, so :func:`light` registers a bare package
object for ``pyroute2`` (same ``__path__``, nothing executed; :mod:`edgeheal.base.bare_import`)
before the first import; submodules then import normally and only pull in what they need. If
anything already imported the real package, that one is used. ``bench/footprint.py``
measures the effect.
"""

from __future__ import annotations

from edgeheal.base.bare_import import skip_init


def light() -> None:
    """Make ``import pyroute2.<sub>`` skip the package ``__init__`` (idempotent)."""
    skip_init("pyroute2")
