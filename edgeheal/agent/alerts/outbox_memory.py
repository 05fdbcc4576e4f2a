"""The outbox's memory queue: what it holds while its database cannot be written.

Why apart from the database side (:mod:`~edgeheal.agent.alerts.outbox`): a fault of the
file (``permission``, ``read_only``, ``locked``, ``disk_full``, ``io_error``,
``newer_format``) must neither lose an alert nor stop one from being raised, so the outbox
keeps three things here until a retry writes them, and reads them back as if they were
rows:

- alerts, numbered ``-1, -2, ...``: they follow the database's rows (they were raised
  later), are delivered from here if the broker is reachable, and move into the database
  in order when it works again; :meth:`MemoryQueue.written` remembers their new numbers,
  so an entry that was in flight while it moved is still found by its old one;
- rows the broker acknowledged whose DELETE failed (:attr:`MemoryQueue.acked`): never sent
  again, deleted by the next write;
- meta keys (the open problems) that could not be written.

Bounded: at most ``size`` alerts (:data:`MEMORY_MAX` by default, about 1 KB each), the
oldest go first and the outbox counts them (``memory_queue``). Alerts of the ``exempt``
kind (``alerts.dropped``, the report of a loss) neither count nor go, so the report of a
loss is never itself lost. Plain data, no I/O: it runs on the outbox's writer thread.
"""

from __future__ import annotations

from edgeheal.agent.alerts.outbox_file import Entry

MEMORY_MAX = 500
"""Alerts held in memory while the database cannot be written (about 1 KB each)."""


class MemoryQueue:
    """Alerts, acknowledgements and meta keys the database could not take (module docstring)."""

    def __init__(self, size: int, *, exempt: str) -> None:
        self.size = size
        self.exempt = exempt
        self.entries: list[Entry] = []
        """Held alerts, oldest first, with negative ``seq`` numbers."""
        self.meta: dict[str, str] = {}
        self.acked: set[int] = set()
        """Rows the broker acknowledged whose DELETE failed (never sent again)."""
        self._renumbered: dict[int, int] = {}
        self._next = -1

    @property
    def holds_nothing(self) -> bool:
        return not self.entries and not self.acked and not self.meta

    def hold(self, alert_id: str, kind: str, raised: float, payload: bytes) -> int:
        """Keep one alert; return how many of the oldest the bound dropped for it."""
        self.entries.append(Entry(self._next, alert_id, kind, raised, payload))
        self._next -= 1
        excess = self.lost() - self.size
        dropped = 0
        while excess > 0:
            index = next(i for i, e in enumerate(self.entries) if e.kind != self.exempt)
            del self.entries[index]
            excess -= 1
            dropped += 1
        return dropped

    def lost(self) -> int:
        """The held alerts a loss of this memory would count (the exempt kind is not)."""
        return sum(1 for e in self.entries if e.kind != self.exempt)

    def prune(self, cutoff: float) -> int:
        """Drop alerts raised before ``cutoff`` (wall clock); return how many."""
        before = len(self.entries)
        self.entries = [e for e in self.entries if e.raised >= cutoff or e.kind == self.exempt]
        return before - len(self.entries)

    def current(self, seq: int, *, forget: bool = False) -> int:
        """The number an entry has now: a held alert written to the database since has its
        row's (``forget``: it is named for the last time)."""
        if seq >= 0:
            return seq
        return self._renumbered.pop(seq, seq) if forget else self._renumbered.get(seq, seq)

    def delete(self, seq: int) -> None:
        """The broker acknowledged this held alert."""
        self.entries = [e for e in self.entries if e.seq != seq]

    def replace(self, seq: int, payload: bytes) -> bool:
        """Update a held alert in place; False if none has this number."""
        for i, e in enumerate(self.entries):
            if e.seq == seq:
                self.entries[i] = Entry(e.seq, e.id, e.kind, e.raised, payload)
                return True
        return False

    def latest(self, kind: str) -> Entry | None:
        for entry in reversed(self.entries):
            if entry.kind == kind:
                return entry
        return None

    def written(self, moved: list[tuple[int, int]]) -> None:
        """All of it is in the database now; ``moved``: (held number, row number) pairs."""
        self._renumbered = dict(moved)  # only an entry in flight can still be named
        self.entries.clear()
        self.acked.clear()
        self.meta.clear()
