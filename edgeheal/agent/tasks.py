"""Named, guarded tasks and the process-wide odds and ends of a running agent.

Why apart from the supervisor: every long-lived part (a check loop, a check's ``serve()``,
the alert engine, the ladders, the supervisor tick) runs as a named task that is restarted
with capped backoff if it crashes (kopf's ``aiotasks.guard``), and that guard is the same
for all of them; the signals the agent ignores and the one-time heap trim after start-up
belong to the process, not to the snapshot.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

log = logging.getLogger("edgeheal.agent")  # the name operators grep for

RESTART_BACKOFF_MAX = 60.0
"""Longest wait before a crashed task is started again, seconds (doubling from 1 s)."""
IGNORED_SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""Logged and ignored (their default would kill the agent without a clean stop); there is
no reload: a configuration change takes ``systemctl restart edgeheal``."""

__all__ = ["IGNORED_SIGNALS", "RESTART_BACKOFF_MAX", "TRACEMALLOC_ENV", "allocations",
           "ignore_signal", "release_startup_memory", "spawn", "trace_allocations"]

TRACEMALLOC_ENV = "EDGEHEAL_TRACEMALLOC"
"""``EDGEHEAL_TRACEMALLOC=FRAMES`` (1-100) starts ``tracemalloc`` with that many frames per
allocation before the agent imports its dependencies, and the control command
``debug.allocations`` answers with the top allocations. Off by default: tracing costs
about a third more memory and slows every allocation."""


def release_startup_memory() -> None:
    """Hand the heap that start-up used and freed (imports, config parsing, the registries,
    the first connections) back to the kernel, once: without it the steady RSS keeps that
    high-water mark. glibc only (``malloc_trim``); elsewhere a no-op."""
    import ctypes  # once, at start-up

    gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        log.debug("malloc_trim is not available here")


def trace_allocations(environ: Mapping[str, str]) -> int:
    """Start ``tracemalloc`` if :data:`TRACEMALLOC_ENV` asks for it; the frames kept (0: off).
    A value that is not a number from 1 to 100 is a :class:`ValueError` naming it."""
    value = environ.get(TRACEMALLOC_ENV, "").strip()
    if value in ("", "0"):
        return 0
    try:
        frames = int(value)
    except ValueError:
        frames = -1
    if not 1 <= frames <= 100:
        raise ValueError(f"{TRACEMALLOC_ENV}={value!r}: expected the frames to keep per "
                         "allocation, a whole number from 1 to 100 (0 or unset: off)")
    import tracemalloc

    tracemalloc.start(frames)
    return frames


class Allocations:
    """The ``debug.allocations`` control command: the top allocations now, and the change
    since the previous call (the first call only takes the baseline for the next)."""

    def __init__(self) -> None:
        self._before: Any = None

    async def __call__(self, args: Mapping[str, Any]) -> Any:
        import tracemalloc

        if not tracemalloc.is_tracing():
            raise ValueError(f"tracemalloc is off: start the agent with {TRACEMALLOC_ENV}="
                             "FRAMES (e.g. 10) to trace allocations")
        top = args.get("top", 15)
        group = args.get("by", "lineno")
        if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= 200:
            raise ValueError(f"top={top!r}: expected a whole number from 1 to 200")
        if group not in ("lineno", "filename", "traceback"):
            raise ValueError(f"by={group!r}: expected lineno, filename or traceback")
        gc.collect()
        snap = tracemalloc.take_snapshot().filter_traces((
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap*>")))
        traced, peak = tracemalloc.get_traced_memory()

        def row(stat: Any) -> dict[str, Any]:
            out = {"size_kib": round(stat.size / 1024, 1), "count": stat.count,
                   "where": [f"{f.filename}:{f.lineno}" for f in stat.traceback]}
            if hasattr(stat, "size_diff"):
                out["size_diff_kib"] = round(stat.size_diff / 1024, 1)
                out["count_diff"] = stat.count_diff
            return out

        result: dict[str, Any] = {
            "traced_mib": round(traced / 2**20, 2), "peak_mib": round(peak / 2**20, 2),
            "overhead_mib": round(tracemalloc.get_tracemalloc_memory() / 2**20, 2),
            "top": [row(s) for s in snap.statistics(group)[:top]]}
        if self._before is not None:
            result["grown"] = [row(s) for s in snap.compare_to(self._before, group)[:top]]
        self._before = snap
        return result


def allocations() -> Allocations:
    return Allocations()


def spawn(name: str, factory: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    return asyncio.create_task(_guard(name, factory), name=name)


async def _guard(name: str, factory: Callable[[], Awaitable[None]]) -> None:
    """Run a long-lived coroutine; log and restart it with capped backoff if it crashes."""
    delay = 1.0
    while True:
        began = time.monotonic()
        try:
            await factory()
            log.warning("task %s returned; restarting in %.0fs", name, delay)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("task %s crashed; restarting in %.0fs", name, delay)
        if time.monotonic() - began > 5 * RESTART_BACKOFF_MAX:
            delay = 1.0
        await asyncio.sleep(delay)
        delay = min(delay * 2, RESTART_BACKOFF_MAX)


def ignore_signal(sig: signal.Signals) -> None:
    log.info("%s ignored: edgeheal reads its configuration only at start "
             "(systemctl restart edgeheal applies a change)", sig.name)
