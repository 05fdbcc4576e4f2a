"""The engine's outbox, kept off the event loop: an :class:`Outbox` on one writer thread.

Why: every write to the outbox waits for fsync (``synchronous=FULL``: a queued alert is on
disk), and a slow SD card can take seconds for one. The engine runs on the loop that also
answers ``/readyz``, the readiness gate of every collector pod on the node, which must
answer in milliseconds whatever the disk does. So the :class:`Outbox` is opened on, and
from then on only touched by, a single writer thread (:class:`edgeheal.base.writer.Writer`):

- the engine hands it *jobs* (:meth:`OffLoopOutbox.post` from a synchronous call site,
  :meth:`OffLoopOutbox.run` where it awaits the result); one thread, first in first out,
  so alerts keep the order they were raised in and every read sees the writes before it;
- inside a job, the methods below call the outbox directly (they run on that thread);
  called from anywhere else they wait for the thread — right for start-up, tools and
  tests, never done on the running loop;
- the fault state (:attr:`fault`, :attr:`memory_depth`, ...) is plain attributes, read
  from any thread without waiting (a value at most one job old).

The promises of :mod:`~edgeheal.agent.alerts.outbox` hold unchanged: the engine logs and
counts an alert inside the job, after :meth:`Outbox.add` returned, so an alert it reported
is on disk (or, with a fault, held in memory and said so).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from edgeheal.agent.alerts.outbox import Entry, Outbox
from edgeheal.base.statefile import Newer, Reset
from edgeheal.base.writer import Writer

P = ParamSpec("P")
T = TypeVar("T")


class OffLoopOutbox:
    """An :class:`Outbox` that lives on its own writer thread (see the module docstring)."""

    def __init__(self, make: Callable[[], Outbox]) -> None:
        self.writer = Writer("edgeheal-outbox")
        self.core: Outbox = self.writer.call(make)

    # --- jobs -----------------------------------------------------------------------------

    def post(self, fn: Callable[P, object], *args: P.args, **kw: P.kwargs) -> None:
        """Queue a job (on a running loop, without waiting; elsewhere, done on return)."""
        self.writer.post(fn, *args, **kw)

    async def run(self, fn: Callable[P, T], *args: P.args, **kw: P.kwargs) -> T:
        """Run a job after every job queued before it; the loop serves meanwhile."""
        return await self.writer.run(fn, *args, **kw)

    async def settled(self) -> None:
        """Wait until every job queued so far is done (the alerts are on disk)."""
        await self.writer.run(lambda: None)

    def shutdown(self) -> None:
        """End the writer thread (after its queued jobs); later calls run inline."""
        self.writer.close()

    # --- state, read without the writer ---------------------------------------------------

    @property
    def path(self) -> Path:
        return self.core.path

    @property
    def fault(self) -> str | None:
        return self.core.fault

    @property
    def fault_message(self) -> str:
        return self.core.fault_message

    @property
    def memory_depth(self) -> int:
        return self.core.memory_depth

    @property
    def lost_unknown(self) -> bool:
        return self.core.lost_unknown

    @property
    def moved_aside(self) -> Path | None:
        return self.core.moved_aside

    @property
    def existed(self) -> bool:
        return self.core.existed

    @property
    def resets(self) -> list[Reset]:
        return self.core.resets

    @property
    def newer(self) -> Newer | None:
        return self.core.newer

    # --- the outbox's operations, on the writer thread ------------------------------------

    def add(self, alert_id: str, kind: str, raised: float, payload: bytes) -> int:
        return self.writer.call(self.core.add, alert_id, kind, raised, payload)

    def delete(self, seq: int) -> None:
        self.writer.call(self.core.delete, seq)

    def replace(self, seq: int, payload: bytes) -> bool:
        return self.writer.call(self.core.replace, seq, payload)

    def prune(self) -> int:
        return self.writer.call(self.core.prune)

    def retry(self, *, force: bool = False) -> bool:
        return self.writer.call(self.core.retry, force=force)

    def take_drops(self) -> dict[str, int]:
        return self.writer.call(self.core.take_drops)

    def oldest(self) -> Entry | None:
        return self.writer.call(self.core.oldest)

    def latest(self, kind: str) -> Entry | None:
        return self.writer.call(self.core.latest, kind)

    def entries(self) -> list[Entry]:
        return self.writer.call(self.core.entries)

    def depth(self) -> int:
        return self.writer.call(self.core.depth)

    def get_meta(self, key: str) -> str | None:
        return self.writer.call(self.core.get_meta, key)

    def set_meta(self, key: str, value: str) -> None:
        self.writer.call(self.core.set_meta, key, value)

    def close(self) -> int:
        return self.writer.call(self.core.close)
