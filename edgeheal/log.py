"""One structured line per event on stderr, which journald (or a terminal) takes.

``level=warning logger=edgeheal.agent check=wireguard msg="check wireguard: ok -> failed"``:
logfmt, so ``journalctl -u edgeheal | grep check=wireguard`` works and log shippers can parse
it. Context (check, interface, peer, kind) is passed with ``extra=`` and appended as
key=value pairs. Under journald (``$JOURNAL_STREAM`` set) the timestamp is left to the
journal; elsewhere each line starts with an RFC 3339 time. Messages are %-style and lazy.
Nothing logged may carry a secret: keys and passwords never reach a log call.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime

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
            moment = datetime.fromtimestamp(record.created, UTC)
            parts.append("time=" + moment.isoformat(timespec="milliseconds").replace(
                "+00:00", "Z"))
        parts += [f"level={record.levelname.lower()}", f"logger={record.name}"]
        parts += [f"{k}={_quote(v)}" for k, v in vars(record).items() if k not in _STANDARD]
        parts.append(f"msg={_quote(record.getMessage())}")
        if record.exc_info:
            parts.append(f"error={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter(timestamps="JOURNAL_STREAM" not in os.environ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiohttp.access", "pyroute2", "asyncio", "httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
