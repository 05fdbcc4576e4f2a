"""One thread for the renders that grow with the node (``/metrics`` text, ``/status`` JSON).

The event loop answers the kubelets' probes; a render that takes a second at 5,000
WireGuard peers must not run on it. :class:`Renderer` runs each render on its own thread
(started on first use), one at a time, and callers that ask for a render already in
flight (the same key) share it instead of queueing another: four parallel scrapers cost
one render, not four. What a render reads must be safe to read from that thread
(immutable, or copied in one step; see :mod:`edgeheal.boundaries.prometheus`).

The thread still takes the GIL while it renders; the loop gets it back at every switch
interval (5 ms), so a probe waits a few milliseconds behind a render, never the render.
Disk writes have their own thread (:mod:`edgeheal.base.writer`): a slow fsync never
delays a scrape, nor a scrape a write.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def _no_gc(fn: Callable[[], T]) -> T:
    """``fn()`` with the cyclic collector paused (process-wide, for one render).

    A render allocates about 100,000 short-lived objects (a sample, a label dict and strings
    per series), freed by reference counting when it ends. With the collector on, they
    trigger collections mid-render and survive into the older generations, and a node
    with a large mesh then runs full collections (100-200 ms each over its peer state,
    holding the GIL: the probes wait) several times a second."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return fn()
    finally:
        if enabled:
            gc.enable()


class Renderer:
    """Renders off the event loop, at most one in flight per key, one at a time."""

    def __init__(self, name: str = "edgeheal-render") -> None:
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: dict[Hashable, asyncio.Future[Any]] = {}
        self.renders = 0
        """Renders started (each shared by every caller that asked while it ran)."""

    async def render(self, key: Hashable, fn: Callable[[], T]) -> T:
        """``fn()``'s result, computed on the render thread; a caller that asks while a
        render of ``key`` is in flight gets that render's result (or its exception).
        Cancelling a caller leaves the render to the others."""
        future = self._inflight.get(key)
        if future is None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
            future = asyncio.get_running_loop().run_in_executor(self._pool, _no_gc, fn)
            self._inflight[key] = future
            self.renders += 1
            future.add_done_callback(lambda done: self._finished(key, done))
        result: T = await asyncio.shield(future)
        return result

    def _finished(self, key: Hashable, future: asyncio.Future[Any]) -> None:
        if self._inflight.get(key) is future:
            del self._inflight[key]
        if not future.cancelled():
            future.exception()  # retrieved: every caller may have gone

    def close(self) -> None:
        """Stop the thread; a render in progress finishes, queued ones are dropped."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
