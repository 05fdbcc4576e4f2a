"""Named, guarded tasks and the process-wide odds and ends of a running agent.

Why apart from the supervisor: every long-lived part (a check loop, a check's ``serve()``,
the alert engine, the ladders, the supervisor tick) runs as a named task that is restarted
with capped backoff if it crashes (kopf's ``aiotasks.guard``), and that guard is the same
for all of them; the signals the agent ignores and the one-time heap trim after start-up
belong to the process, not to the snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("edgeheal.agent")  # the name operators grep for

RESTART_BACKOFF_MAX = 60.0
"""Longest wait before a crashed task is started again, seconds (doubling from 1 s)."""
IGNORED_SIGNALS = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""Logged and ignored (their default would kill the agent without a clean stop); there is
no reload: a configuration change takes ``systemctl restart edgeheal``."""

__all__ = ["IGNORED_SIGNALS", "RESTART_BACKOFF_MAX", "ignore_signal", "release_startup_memory",
           "spawn"]


def release_startup_memory() -> None:
    """Hand the heap that start-up used and freed (imports, config parsing, the registries,
    the first connections) back to the kernel, once: without it the steady RSS keeps that
    high-water mark. glibc only (``malloc_trim``); elsewhere a no-op."""
    import ctypes  # once, at start-up
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        log.debug("malloc_trim is not available here")


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
