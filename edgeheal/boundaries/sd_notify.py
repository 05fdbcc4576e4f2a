"""systemd's notify protocol, natively: datagrams to ``$NOTIFY_SOCKET`` (no libsystemd).

``READY=1`` after the first full round of checks, ``WATCHDOG=1`` from the supervisor's own
tick (so a wedged event loop or a dead supervisor stops the pings and systemd restarts us),
``STATUS=`` with a one-line health summary, ``STOPPING=1`` on shutdown. Outside systemd
(no ``$NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("edgeheal.notify")  # the name operators grep for


class Notifier:
    def __init__(self, address: str | None = None, watchdog_usec: str | None = None) -> None:
        addr = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        if addr.startswith("@"):  # abstract namespace
            addr = "\0" + addr[1:]
        self._address = addr
        self._sock: socket.socket | None = None
        if addr:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        usec = watchdog_usec if watchdog_usec is not None else os.environ.get(
            "WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID")
        self.watchdog_interval: float | None = None
        if usec.isdigit() and int(usec) > 0 and (pid is None or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6 / 2

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *lines: str) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(lines).encode(), self._address)
        except OSError as err:  # systemd gone or socket full: never fatal
            log.debug("sd_notify failed: %s", err)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
