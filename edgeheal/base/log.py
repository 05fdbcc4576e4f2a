"""One structured line per event on stderr, which journald (or a terminal) takes.

``level=warning logger=edgeheal.agent check=wireguard msg="check wireguard: ok -> failed"``:
logfmt, so ``journalctl -u edgeheal | grep check=wireguard`` works and log shippers can parse
it. Context (check, interface, peer, kind) is passed with ``extra=`` and appended as
key=value pairs. Under journald (``$JOURNAL_STREAM`` set) the timestamp is left to the
journal; elsewhere each line starts with an RFC 3339 time. Messages are %-style and lazy.
Nothing logged may carry a secret: keys and passwords never reach a log call.

Repeats are collapsed (:class:`RepeatFilter`): one message template may print at most
:data:`BURST` lines per :data:`WINDOW` seconds; the rest are counted and reported in one
line (``suppressed=N``) when the window ends, so a fault that repeats thousands of times a
second (a flood of idle connections, a dead disk) cannot fill the journal.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

BURST = 10
"""Lines one message template may print per :data:`WINDOW` before repeats are counted."""
WINDOW = 10.0
"""Seconds of one rate-limit window."""
MAX_TEMPLATES = 512
"""Templates tracked at once (the oldest window is closed, and reported, beyond that)."""

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _quote(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\n\t'):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class LogfmtFormatter(logging.Formatter):
    def __init__(self, *, timestamps: bool) -> None:
        super().__init__()
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        parts = []
        if self.timestamps:
            moment = datetime.fromtimestamp(record.created, timezone.utc)
            parts.append("time=" + moment.isoformat(timespec="milliseconds").replace(
                "+00:00", "Z"))
        parts += [f"level={record.levelname.lower()}", f"logger={record.name}"]
        parts += [f"{k}={_quote(v)}" for k, v in vars(record).items()
                  if k not in _STANDARD and not k.startswith("_")]
        parts.append(f"msg={_quote(record.getMessage())}")
        if record.exc_info:
            parts.append(f"error={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


@dataclass
class _Window:
    end: float
    seen: int = 0
    suppressed: int = 0


_SUMMARY = "_edgeheal_summary"


class RepeatFilter(logging.Filter):
    """A handler filter: at most ``burst`` records per ``window`` seconds for each
    (logger, level, message template); the others are dropped and counted, and one summary
    line reports the count once the window has ended (on the next record, or :meth:`flush`).

    The template (``record.msg``, before %-formatting) is the key, so a flood whose lines
    differ only in their arguments (a peer's port, a descriptor number) still collapses.
    """

    def __init__(self, handler: logging.Handler, *, burst: int = BURST,
                 window: float = WINDOW, clock: Callable[[], float] = time.monotonic,
                 max_templates: int = MAX_TEMPLATES) -> None:
        super().__init__()
        self.handler, self.burst, self.window, self.clock = handler, burst, window, clock
        self.max_templates = max_templates
        self.suppressed_total = 0
        self._windows: dict[tuple[str, int, str], _Window] = {}
        self._next_end = float("inf")
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SUMMARY, False):
            return True
        key = (record.name, record.levelno, str(record.msg)[:200])
        with self._lock:
            now = self.clock()
            ended = self._take_ended(now) if now >= self._next_end else []
            win = self._windows.get(key)
            if win is None:
                if len(self._windows) >= self.max_templates:
                    oldest = next(iter(self._windows))
                    ended.append((oldest, self._windows.pop(oldest)))
                win = self._windows[key] = _Window(end=now + self.window)
                self._next_end = min(self._next_end, win.end)
            win.seen += 1
            passed = win.seen <= self.burst
            if not passed:
                win.suppressed += 1
                self.suppressed_total += 1
        self._report(ended)
        return passed

    def flush(self) -> None:
        """Report every count now (at exit): nothing suppressed goes unsaid."""
        with self._lock:
            ended = list(self._windows.items())
            self._windows.clear()
            self._next_end = float("inf")
        self._report(ended)

    def _take_ended(self, now: float) -> list[tuple[tuple[str, int, str], _Window]]:
        ended = [(k, w) for k, w in self._windows.items() if w.end <= now]
        for key, _ in ended:
            del self._windows[key]
        self._next_end = min((w.end for w in self._windows.values()), default=float("inf"))
        return ended

    def _report(self, ended: list[tuple[tuple[str, int, str], _Window]]) -> None:
        if getattr(getattr(self.handler, "stream", None), "closed", False):
            return  # stderr is gone (a test's captured stream at exit): nowhere to say it
        for (name, level, template), win in ended:
            if not win.suppressed:
                continue
            summary = logging.LogRecord(
                name, level, __file__, 0,
                "suppressed %d repeat(s) of %r in %gs", (win.suppressed, template,
                                                         self.window), None)
            summary.suppressed = win.suppressed
            setattr(summary, _SUMMARY, True)
            self.handler.handle(summary)


_active: RepeatFilter | None = None


def setup(level: str = "info") -> None:
    global _active  # noqa: PLW0603 - one stderr handler per process
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter(timestamps="JOURNAL_STREAM" not in os.environ))
    if _active is not None:
        # the old handler's stream may be gone (a redirected stderr): its counts are said
        # through the new one, so nothing suppressed goes unsaid and nothing writes to a
        # closed file
        atexit.unregister(_active.flush)
        _active.handler = handler
        _active.flush()
    _active = RepeatFilter(handler)
    handler.addFilter(_active)
    atexit.register(_active.flush)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access", "pyroute2", "asyncio", "httpx", "httpx2", "httpcore",
                  "httpcore2"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
