"""The outbox's fault classes: what is wrong with its database, told apart.

Why a module of its own: the outbox reacts to each class differently (only a *corrupt*
file is moved aside; a read-only, foreign-owned or full ``state_dir``, a lock held by
another process or an I/O error leave the file alone and hold alerts in memory), and
``/status``, the metrics and ``edgeheal doctor`` name the same classes. The decision is a
pure function of the error (and, for the vague ones, of the directory), so it is tested
on its own (``tests/hardening/test_alerts_outbox_faults.py``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

FAULTS = ("corrupt", "permission", "read_only", "locked", "disk_full", "io_error",
          "seq_exhausted", "newer_format")
"""What can be wrong with the outbox database (:func:`classify`; ``seq_exhausted``, which
SQLite reports as ``disk_full``, is told apart by the outbox, which can look at the file;
``newer_format``, a file of a later release, is found before SQLite is asked to write)."""

# SQLite primary result codes (extended codes carry them in the low byte)
_SQLITE = {11: "corrupt", 26: "corrupt", 13: "disk_full", 8: "read_only", 5: "locked",
           6: "locked", 3: "permission", 23: "permission", 10: "io_error"}
_ERRNO = {errno.EACCES: "permission", errno.EPERM: "permission", errno.EROFS: "read_only",
          errno.ENOSPC: "disk_full", errno.EDQUOT: "disk_full"}


def classify(err: BaseException, directory: Path | None = None) -> str:
    """The fault class of an error from SQLite or the filesystem (one of :data:`FAULTS`)."""
    if isinstance(err, OSError):
        return _ERRNO.get(err.errno or 0, "io_error")
    code = getattr(err, "sqlite_errorcode", None)
    text = str(err).lower()
    fault = _SQLITE.get(code & 0xFF) if isinstance(code, int) else None
    if fault is None:
        if "not a database" in text or "malformed" in text:
            fault = "corrupt"
        elif "disk is full" in text:
            fault = "disk_full"
        elif "readonly" in text or "read-only" in text:
            fault = "read_only"
        elif "locked" in text or "busy" in text:
            fault = "locked"
        else:
            fault = "io_error"
    if fault == "io_error" or "unable to open" in text:  # SQLITE_CANTOPEN and friends
        fault = _directory_fault(directory) or fault
    return fault


def _directory_fault(directory: Path | None) -> str | None:
    if directory is None:
        return None
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return "read_only"
        if not os.access(directory, os.W_OK):
            return "permission"
    except OSError as err:
        return _ERRNO.get(err.errno or 0)
    return None

