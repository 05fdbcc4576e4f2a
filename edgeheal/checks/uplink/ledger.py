"""The uplink's byte ledger: what was counted, per interface and per UTC day, the samples
of the 24 h rate, and the billing period's bounds. Pure: no I/O, no clock; the
:class:`~edgeheal.checks.uplink.usage.Meter` feeds it readings with their time, keeps it
on disk and raises the plan's alerts from it.

**Counting.** Per interface, the last counter seen, with the link's ifindex and the boot id
(``/proc/sys/kernel/random/boot_id``). A reading adds ``counter - last`` when it is the same
link in the same boot and the counter did not go back. Otherwise the counter started again
from zero — the link was re-created (a USB modem re-enumerating: a new ifindex), its counters
were reset, or the node rebooted — so the reading adds the counter itself.
The very first reading of a fresh ledger (a new install, or one that was moved aside) is a
baseline: what passed before the agent counted is not charged to today. What can be lost:
after a reboot, what passed between the last save and the shutdown (at most
:data:`~edgeheal.checks.uplink.usage.SAVE_EVERY`); after a re-creation between two runs,
what the old link counted since the last run (at most the check's interval, 10 s).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

SAMPLE_EVERY = 900.0
"""Seconds between two samples of the running total, for the 24 h rate."""
RATE_WINDOW = 86400.0
MIN_RATE_SPAN = 3600.0
"""Least history (seconds) the rate needs; before that there is no forecast."""
KEEP_DAYS = 62


def period(today: dt.date, start_day: int) -> tuple[dt.date, dt.date]:
    """The billing period holding ``today``: [start, end)."""
    start = today.replace(day=start_day)
    if today.day < start_day:
        start = _add_month(start, -1)
    return start, _add_month(start, 1)


def _add_month(day: dt.date, months: int) -> dt.date:
    index = day.year * 12 + day.month - 1 + months
    return day.replace(year=index // 12, month=index % 12 + 1)


@dataclass
class Seen:
    index: int
    rx: int
    tx: int


@dataclass
class Ledger:
    """What was counted (pure: no I/O, no clock; :class:`Meter` does both)."""

    boot_id: str = ""
    seen: dict[str, Seen] = field(default_factory=dict)
    totals: dict[str, list[int]] = field(default_factory=dict)
    """Interface -> [rx, tx] bytes since counting began (never goes back)."""
    days: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """UTC day (ISO) -> interface -> [rx, tx]."""
    samples: list[tuple[float, int]] = field(default_factory=list)
    """(UNIX time, all interfaces' total) every :data:`SAMPLE_EVERY`."""
    raised: dict[str, str] = field(default_factory=dict)
    """Alert kind -> the period (its start day) it was raised for."""

    def observe(self, readings: Iterable[tuple[str, int, int, int]], boot_id: str,
                now: float) -> dict[str, tuple[int, int]]:
        """Add ``(name, ifindex, rx_bytes, tx_bytes)`` readings taken at UNIX time ``now``;
        return what each added."""
        added: dict[str, tuple[int, int]] = {}
        day = dt.datetime.fromtimestamp(now, dt.timezone.utc).date().isoformat()
        same_boot = boot_id == self.boot_id
        fresh = not self.boot_id  # the very first reading: a new install, or afresh
        self.boot_id = boot_id
        for name, index, rx, tx in readings:
            last = self.seen.get(name)
            if last is None and fresh:  # a baseline: what passed before is not today's
                d_rx, d_tx = 0, 0
            elif last is not None and same_boot and last.index == index and rx >= last.rx \
                    and tx >= last.tx:
                d_rx, d_tx = rx - last.rx, tx - last.tx
            else:  # new link, re-created, reset or rebooted: the counter began at zero
                d_rx, d_tx = rx, tx
            self.seen[name] = Seen(index, rx, tx)
            added[name] = (d_rx, d_tx)
            total = self.totals.setdefault(name, [0, 0])
            total[0] += d_rx
            total[1] += d_tx
            today = self.days.setdefault(day, {}).setdefault(name, [0, 0])
            today[0] += d_rx
            today[1] += d_tx
        for old in sorted(self.days)[:-KEEP_DAYS]:
            del self.days[old]
        if not self.samples or now - self.samples[-1][0] >= SAMPLE_EVERY:
            self.samples.append((now, self.total()))
        self.samples = [s for s in self.samples if now - s[0] <= RATE_WINDOW + SAMPLE_EVERY]
        return added

    def total(self) -> int:
        return sum(rx + tx for rx, tx in self.totals.values())

    def used(self, since: dt.date, until: dt.date | None = None) -> int:
        """Bytes (rx + tx, every interface) on the days from ``since`` (to ``until``)."""
        return sum(rx + tx for day, per in self.days.items()
                   if since.isoformat() <= day and (until is None or day < until.isoformat())
                   for rx, tx in per.values())

    def rate(self, now: float) -> float | None:
        """Bytes a second over the last 24 h (None: under an hour of history)."""
        past = [s for s in self.samples if now - s[0] <= RATE_WINDOW]
        if not past or now - past[0][0] < MIN_RATE_SPAN:
            return None
        return (self.total() - past[0][1]) / (now - past[0][0])

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "boot_id": self.boot_id,
                "seen": {n: [s.index, s.rx, s.tx] for n, s in self.seen.items()},
                "totals": self.totals, "days": self.days,
                "samples": [list(s) for s in self.samples], "raised": self.raised}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ledger:
        """Raise ValueError (or TypeError, KeyError) on anything but this version's shape."""
        if data.get("version") != 1:
            raise ValueError(f"version {str(data.get('version'))[:20]} is not 1")

        def count(value: Any) -> int:
            if type(value) is not int or value < 0:
                raise ValueError(f"{str(value)[:20]} is not a byte count")
            return value

        def pair(value: Any) -> list[int]:
            rx, tx = value
            return [count(rx), count(tx)]

        return cls(
            boot_id=str(data["boot_id"]),
            seen={str(n): Seen(count(i), count(rx), count(tx))
                  for n, (i, rx, tx) in data["seen"].items()},
            totals={str(n): pair(v) for n, v in data["totals"].items()},
            days={str(dt.date.fromisoformat(d)): {str(n): pair(v) for n, v in per.items()}
                  for d, per in data["days"].items()},
            samples=[(float(t), count(b)) for t, b in data["samples"]],
            raised={str(k): str(v) for k, v in data["raised"].items()})
