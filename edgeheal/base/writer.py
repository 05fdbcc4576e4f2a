"""One writer thread: disk writes that wait for fsync, done off the event loop, in order.

Why: the agent serves kubelet probes (``/readyz`` gates every collector pod on the node)
from the same asyncio loop that raises alerts and persists the remediation history. An
fsync on a worn SD card can take seconds; done on the loop, it stalls every probe for as
long. A :class:`Writer` runs such work on its own single thread instead:

- **Order.** One thread, first in first out: a write submitted after another lands after
  it, so the newest history or the alerts' sequence is what is left on disk.
- **Waiting without blocking.** :meth:`Writer.run` is awaited by a caller that must know the
  write is done (an attempt persisted before a remedy runs); the loop serves meanwhile.
  :meth:`Writer.post` queues a write whose caller cannot wait (a synchronous call site);
  its errors are logged, and a later :meth:`Writer.run` still waits for it (FIFO).
- **Outside a loop** (start-up, tools, synchronous tests) there is nothing to keep free:
  :meth:`Writer.call` and :meth:`Writer.post` wait for the thread (or run inline on it),
  so a synchronous caller sees the same effects, in the same order, as before.
- **Shutdown.** The thread is not a daemon: the interpreter waits for queued writes at exit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger("edgeheal.writer")


class Writer:
    """A single thread for blocking writes; see the module docstring."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._ident = self._pool.submit(threading.get_ident).result()
        self._closed = False

    def on_thread(self) -> bool:
        """True on the writer thread itself (a job that writes again runs inline)."""
        return threading.get_ident() == self._ident

    def _submit(self, fn: Callable[P, T], *args: P.args, **kw: P.kwargs) -> Future[T] | None:
        if self._closed:
            return None
        try:
            return self._pool.submit(fn, *args, **kw)
        except RuntimeError:  # shut down meanwhile (interpreter exit)
            return None

    def call(self, fn: Callable[P, T], *args: P.args, **kw: P.kwargs) -> T:
        """Run ``fn`` on the thread and wait for it (blocking: not for the event loop)."""
        if self.on_thread():
            return fn(*args, **kw)
        fut = self._submit(fn, *args, **kw)
        return fn(*args, **kw) if fut is None else fut.result()

    async def run(self, fn: Callable[P, T], *args: P.args, **kw: P.kwargs) -> T:
        """Run ``fn`` on the thread after everything queued before it; the loop stays free."""
        fut = self._submit(fn, *args, **kw)
        if fut is None:
            return fn(*args, **kw)
        return await asyncio.wrap_future(fut)

    def post(self, fn: Callable[P, object], *args: P.args, **kw: P.kwargs) -> None:
        """Queue ``fn`` without waiting when called on a running loop; else :meth:`call`."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.call(fn, *args, **kw)
            return
        fut = self._submit(fn, *args, **kw)
        if fut is None:
            fn(*args, **kw)
            return
        fut.add_done_callback(self._report)

    def _report(self, fut: Future[object]) -> None:
        err = fut.exception()
        if err is not None:
            log.error("%s: a queued write failed", self.name, exc_info=err)

    def close(self) -> None:
        """Wait for the queued writes and end the thread; later calls run inline."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True)
