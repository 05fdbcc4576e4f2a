"""aiohttp's server half, without the package ``__init__`` (which loads the client too).

The agent only serves HTTP (:mod:`edgeheal.agent.endpoints`). ``import aiohttp`` also imports the
client: requests and responses, websockets, the cookie jar (and pickle), happy eyeballs,
and the connector, which builds two TLS contexts at import, one loading the system's CA
certificates. Measured in the lab edge's agent with every feature on, skipping it saves
2.9 MB of RSS (docs/footprint.md), against a 60 MB budget.
:func:`edgeheal.base.bare_import.skip_init` explains the mechanism; any later use of a
package-level name (``aiohttp.ClientSession`` in a test or the lab) still works.
"""

from __future__ import annotations

from edgeheal.base.bare_import import skip_init

skip_init("aiohttp", literals=("__version__",))  # aiohttp.http reads it from the package

from aiohttp import web  # noqa: E402 - after skip_init, on purpose
from aiohttp.http_exceptions import HttpProcessingError  # noqa: E402

__all__ = ["HttpProcessingError", "web"]
