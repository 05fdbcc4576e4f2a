"""The agent's run marker: did the last run end cleanly?

Why a file beside the outbox: ``agent.started`` tells subscribers whether the previous run
was killed (``kill -9``, a crash, power loss), and only something written at start and
removed at a clean exit survives all of those (written with an fsync of the file and of
the directory, so a power cut right after the start still finds it). The outbox's own
existence tells a first start (``none``) from a clean restart. Faults of ``state_dir`` are
logged, never raised: the outbox reports them to operators, and alerts must flow
regardless.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from edgeheal.base import statefile

log = logging.getLogger("edgeheal.alerts.engine")  # the name operators grep for

RUNNING_MARKER = "agent.running"
"""Present while the agent runs; found at start-up, it means the last run did not end
cleanly (kill -9, crash, power loss)."""


def previous_run(state_dir: Path, *, outbox_existed: bool) -> str:
    """``unclean``, ``clean`` or ``none`` (no earlier run left an outbox)."""
    if (state_dir / RUNNING_MARKER).exists():
        return "unclean"
    return "clean" if outbox_existed else "none"


def mark_running(state_dir: Path) -> None:
    marker = state_dir / RUNNING_MARKER
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.write(fd, f"{os.getpid()}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        # the name too: else a power cut before ext4's next journal commit (up to 5 s)
        # loses the marker, and the next start calls this run's end clean
        statefile.fsync_dir(state_dir)
    except OSError as err:  # a full or read-only state_dir: the outbox reports it
        log.error("cannot write %s (%s): the next start cannot tell whether this run "
                  "ended cleanly", marker, err.strerror or err)


def mark_stopped(state_dir: Path) -> None:
    """The clean-exit mark: the next start reports ``clean``."""
    try:
        (state_dir / RUNNING_MARKER).unlink(missing_ok=True)
    except OSError as err:
        log.error("cannot remove %s: %s", RUNNING_MARKER, err.strerror or err)
