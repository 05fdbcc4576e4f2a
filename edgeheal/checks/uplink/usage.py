"""Data accounting for the uplink: bytes per interface, per UTC day and per billing period.

Why: edge nodes reach the cloud over 4G/5G SIMs whose plans are often 100 MB to a few GB a
month; a plan that runs out is a throttled or dead node. The ``uplink`` check already reads
each uplink interface every run, so it counts their bytes too (``rx_bytes``/``tx_bytes``:
the kernel's ``rtnl_link_stats64``, what ``ip -s link`` prints; from sysfs on the fast path,
from ``IFLA_STATS64`` on a netlink read) and keeps them here.

**Counting** is the ledger's (:mod:`edgeheal.checks.uplink.ledger`): what each reading
adds, across re-created links, counter resets and reboots. This module is the meter around
it: it feeds it, keeps it on disk, exports it and raises the plan's alerts.

**Durable and cheap.** The ledger lives in memory; it is written to
``<state_dir>/uplink-usage.json`` (temp file, fsync, rename) every :data:`SAVE_EVERY`
seconds and when the agent stops, on a writer thread of its own
(:class:`edgeheal.base.writer.Writer`), never on the loop: 4 small writes an hour. A file
that cannot be used (damaged, another version's) is moved aside and counting starts afresh
(logged). Days are kept for :data:`~edgeheal.checks.uplink.ledger.KEEP_DAYS`; the 24 h
rate comes from one sample per :data:`~edgeheal.checks.uplink.ledger.SAMPLE_EVERY` over the
last 25 h. Memory: a few KiB.

**Plan.** With ``[uplink] plan``, the billing period runs from ``plan_start_day`` (UTC) to
the same day next month; usage is the period's days summed over the uplink interfaces.
The forecast is the period's usage plus the last 24 h's rate (over at least an hour of
history) until the period ends. ``uplink.plan_forecast`` is raised once a period, when the
usage reaches ``plan_warn`` percent of the plan or the forecast goes past the plan;
``uplink.plan_exceeded`` once a period at ``plan_exceeded`` percent. Both are events
(alerts), not a state of the check: a plan running out does not make the uplink unhealthy,
and ``/readyz`` never depends on it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from edgeheal.base import statefile
from edgeheal.base.statefile import StateFileError
from edgeheal.base.writer import Writer
from edgeheal.checks.uplink.ledger import Ledger, period
from edgeheal.model import Context, Event

log = logging.getLogger("edgeheal.checks.uplink")  # the parent's name: operators grep it

FILE = "uplink-usage.json"
SAVE_EVERY = 900.0
"""Seconds between two writes of the ledger (and one at stop)."""
FORECAST = "uplink.plan_forecast"
EXCEEDED = "uplink.plan_exceeded"
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """``"1GB"`` -> 10**9; a :class:`ValueError` that names what is wrong."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in UNITS or (unit == "b" and "." in match.group(1)):
        raise ValueError(f"expected a size such as \"1GB\", \"500MB\" or \"2GiB\" "
                         f"(units: {', '.join(sorted(UNITS, key=UNITS.__getitem__))}), "
                         f"got {text!r}")
    size = int(float(match.group(1)) * UNITS[unit])
    if size <= 0:
        raise ValueError(f"expected a plan larger than zero, got {text!r}")
    return size


def _size(n: float) -> str:
    """Bytes for people: 3 significant digits in decimal units (the plans' units)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"




def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def save(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (temp file, fsync, rename); an error is logged, never raised."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as err:
        log.error("cannot write the uplink's data usage to %s: %s", path, err.strerror)


class Meter:
    """The ledger of one agent: loaded at start, fed by every uplink run, saved every
    :data:`SAVE_EVERY`, exported as metrics and ``detail.data``, and the plan's alerts."""

    def __init__(self, ctx: Context, *, plan: int | None, start_day: int, warn: float,
                 exceeded: float, boot: str | None = None) -> None:
        self.ctx = ctx
        self.plan, self.start_day, self.warn, self.exceeded = plan, start_day, warn, exceeded
        self._boot = boot_id() if boot is None else boot
        self.path = Path(ctx.config.agent.state_dir) / FILE
        self._writer = Writer("edgeheal-usage")
        self.ledger = self._load()
        self._saved_at = ctx.clock()
        self._metrics = _Metrics(ctx.registry)
        self._metrics.declare(self.ledger)

    def _load(self) -> Ledger:
        try:
            data = statefile.read(self.path)
            return Ledger() if data is None else Ledger.from_json(data)
        except (StateFileError, ValueError, TypeError, KeyError, AttributeError,
                OverflowError) as err:
            aside = statefile.move_aside(self.path, time.time())
            log.error("uplink data usage %s is unusable (%s); %s, counting afresh",
                      self.path, str(err)[:120] or type(err).__name__,
                      f"moved aside to {aside}" if aside else "it could not be moved aside")
        except OSError as err:
            log.error("cannot read the uplink's data usage %s: %s; counting afresh",
                      self.path, err.strerror)
        return Ledger()

    def observe(self, readings: Iterable[tuple[str, int, int, int]]) -> dict[str, Any]:
        """Count one run's readings; raise the plan's alerts; return ``detail.data``."""
        now = self.ctx.wall().timestamp()
        added = self.ledger.observe(readings, self._boot, now)
        self._metrics.count(added)
        self._metrics.own()
        view = self.view(now)
        self._metrics.show(view)
        self._alerts(view)
        if self.ctx.clock() - self._saved_at >= SAVE_EVERY:
            self.flush()
        return view

    def view(self, now: float) -> dict[str, Any]:
        today = dt.datetime.fromtimestamp(now, dt.timezone.utc).date()
        start, end = period(today, self.start_day)
        used = self.ledger.used(start)
        rate = self.ledger.rate(now)
        out: dict[str, Any] = {
            "today_bytes": self.ledger.used(today),
            "period": {"start": start.isoformat(), "end": end.isoformat(),
                       "used_bytes": used},
            "interfaces": {n: {"rx_bytes": rx, "tx_bytes": tx}
                           for n, (rx, tx) in sorted(self.ledger.totals.items())},
            "rate_24h_bytes_per_day": None if rate is None else round(rate * 86400),
            "edgeheal_bytes": _own()}
        left = dt.datetime.combine(end, dt.time(), dt.timezone.utc).timestamp() - now
        forecast = None if rate is None else used + rate * max(0.0, left)
        out["period"]["forecast_bytes"] = None if forecast is None else round(forecast)
        if self.plan is not None:
            out["plan_bytes"] = self.plan
            out["period"]["used_percent"] = round(100 * used / self.plan, 1)
            runs_out = None
            if used >= self.plan:
                runs_out = today
            elif rate:
                runs_out = dt.datetime.fromtimestamp(
                    now + (self.plan - used) / rate, dt.timezone.utc).date()
            out["period"]["runs_out_on"] = (
                runs_out.isoformat() if runs_out is not None and runs_out < end else None)
        return out

    def _alerts(self, view: dict[str, Any]) -> None:
        if self.plan is None:
            return
        p = view["period"]
        start, used, forecast = p["start"], p["used_bytes"], p["forecast_bytes"]
        detail = {"plan_bytes": self.plan, "used_bytes": used, "forecast_bytes": forecast,
                  "period_start": start, "period_end": p["end"],
                  "runs_out_on": p["runs_out_on"]}
        plan, pct = _size(self.plan), f"{p['used_percent']:g} %"
        if used >= self.plan * self.exceeded / 100:
            self._raise(EXCEEDED, start, f"the uplink used {_size(used)} of its {plan} plan "
                        f"this period ({pct})", detail)
        if used >= self.plan * self.warn / 100 or (forecast is not None
                                                    and forecast > self.plan):
            if forecast is None:
                outlook = "under an hour of history: no forecast yet"
            else:
                outlook = f"at the last 24 h's rate the period ends at {_size(forecast)}" + (
                    f", past the plan on {p['runs_out_on']}" if p["runs_out_on"] else "")
            self._raise(FORECAST, start, f"the uplink used {_size(used)} of its {plan} plan "
                        f"({pct}); {outlook}", detail)

    def _raise(self, kind: str, start: str, message: str, detail: dict[str, Any]) -> None:
        if self.ledger.raised.get(kind) == start:
            return
        self.ledger.raised[kind] = start
        self.ctx.emit(Event(kind, message, detail, correlation=f"{kind}:{start}"))
        self.flush()  # raised once a period, also across a restart

    def flush(self) -> None:
        """Queue a write of the ledger (off the loop)."""
        self._saved_at = self.ctx.clock()
        if not self.ledger.totals:  # nothing counted yet: nothing to keep
            return
        self._writer.post(save, self.path, self.ledger.to_json())

    async def written(self) -> None:
        await self._writer.run(lambda: None)


def _own() -> dict[str, int]:
    """edgeheal's own MQTT bytes since the agent started (TCP payload; see ``OwnBytes``)."""
    from edgeheal.boundaries.mqtt.transport import OwnBytes

    return {"rx_bytes": OwnBytes.rx, "tx_bytes": OwnBytes.tx}


class _Metrics:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge

        self.mine = Counter(
            "edgeheal_own_bytes", "Bytes edgeheal's own MQTT connections sent and received "
            "since the agent started (TCP payload: without IP/TCP headers or WireGuard "
            "framing), for comparison with edgeheal_uplink_bytes_total", ["direction"],
            registry=registry)
        self._mine = {"rx_bytes": 0, "tx_bytes": 0}

        self.bytes = Counter(
            "edgeheal_uplink_bytes", "Bytes through the uplink interfaces (the kernel's "
            "counters, kept across restarts, reboots and counter resets)",
            ["interface", "direction"], registry=registry)
        self.period = Gauge("edgeheal_uplink_period_bytes", "Bytes (rx + tx, every uplink "
                            "interface) used in the current billing period", registry=registry)
        self.forecast = Gauge(
            "edgeheal_uplink_period_forecast_bytes", "Bytes the billing period ends at, at "
            "the last 24 h's rate (NaN: under an hour of history)", registry=registry)
        self.plan = Gauge("edgeheal_uplink_plan_bytes", "The data plan per billing period "
                          "(`[uplink] plan`; 0: none)", registry=registry)

    def declare(self, ledger: Ledger) -> None:
        for name, (rx, tx) in ledger.totals.items():
            self.bytes.labels(name, "rx").inc(rx)
            self.bytes.labels(name, "tx").inc(tx)

    def count(self, added: dict[str, tuple[int, int]]) -> None:
        for name, (rx, tx) in added.items():
            self.bytes.labels(name, "rx").inc(rx)
            self.bytes.labels(name, "tx").inc(tx)

    def own(self) -> None:
        now = _own()
        for key, direction in (("rx_bytes", "rx"), ("tx_bytes", "tx")):
            self.mine.labels(direction).inc(max(0, now[key] - self._mine[key]))
        self._mine = now

    def show(self, view: dict[str, Any]) -> None:
        self.period.set(view["period"]["used_bytes"])
        forecast = view["period"]["forecast_bytes"]
        self.forecast.set(float("nan") if forecast is None else forecast)
        self.plan.set(view.get("plan_bytes", 0))
