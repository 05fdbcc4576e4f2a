"""The state directory: one agent's, trusted only when nobody else can write it.

Why a boundary of its own: ``state_dir`` holds what a root agent writes and reads back (the
lock, the outbox, the histories, the markers, the control socket). A directory another
user can write lets that user plant symlinks the agent would follow (truncating or
chmodding a root-only file) or a socket the root CLI would believe. So :func:`check` refuses
(:class:`StateDirUnsafe`, a configuration error: exit 2) a ``state_dir`` that is a symlink,
not a directory, not owned by the agent's user (root's is accepted too), or writable by
group or others; inside a directory that passes, only its owner can create names.

The directory belongs to one agent at a time: :func:`lock_state_dir` takes an exclusive
``flock`` on ``<state_dir>/agent.lock`` (which records the holder's PID) before anything
else in it is touched, so a second ``edgeheal run`` stops with :class:`StateDirBusy`
naming that PID instead of replacing the first one's socket.

**Degraded, never dead.** An SD card remounts ext4 read-only on errors, exactly when the
node needs its probes and offload enforcement. On a read-only or full state directory the
lock is still taken when it can be (``flock`` needs only a read-only descriptor of an
existing lock file, so a second agent is still refused), and :attr:`StateLock.degraded`
says what the agent cannot do; the agent runs on (the outbox holds alerts in memory,
``/status`` and the metrics say so) instead of exiting.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from pathlib import Path

from edgeheal.config import ConfigError

log = logging.getLogger("edgeheal.control")  # the name operators grep for (was control's)

LOCK_NAME = "agent.lock"
_DEGRADED = {errno.EROFS: "read_only", errno.ENOSPC: "disk_full", errno.EDQUOT: "disk_full",
             errno.EACCES: "permission", errno.EPERM: "permission"}


class StateDirUnsafe(ConfigError):
    """The state directory is one another user could write into (the message says how)."""

    def __init__(self, problem: str) -> None:
        super().__init__("agent.state_dir", problem)


class StateDirBusy(OSError):
    """Another process holds the state directory's lock (``pid`` is None when unknown)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        holder = f"PID {pid}" if pid is not None else "another process"
        super().__init__(errno.EBUSY, f"the state directory {path.parent} is in use by "
                         f"{holder} (it holds {path}): is edgeheal already running?")
        self.pid = pid


class StateLock:
    """An exclusive lock on a state directory, held until :meth:`release` (or exit)."""

    def __init__(self, path: Path, fd: int, degraded: str | None = None) -> None:
        self.path, self._fd = path, fd
        self.degraded = degraded
        """None, or why the directory cannot be written (``read_only``, ``disk_full``,
        ``permission``): the agent runs on without writing there."""

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = -1

    def __enter__(self) -> StateLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def trusted_uids() -> set[int]:
    """Who may own the state directory and its socket: root and this process's user."""
    return {0, os.geteuid()}


def check(directory: Path, *, owners: set[int] | None = None) -> os.stat_result:
    """Raise :class:`StateDirUnsafe` unless ``directory`` is a real directory (not a
    symlink), owned by one of ``owners`` (default :func:`trusted_uids`), and not writable
    by group or others; return its ``lstat``."""
    allowed = trusted_uids() if owners is None else owners
    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode):
        raise StateDirUnsafe(f"{directory} is a symlink: point state_dir at the "
                             "real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirUnsafe(f"{directory} is not a directory")
    if st.st_uid not in allowed:
        raise StateDirUnsafe(f"{directory} is owned by uid {st.st_uid}, not by the "
                             f"agent's user (uid {os.geteuid()}) or root: chown it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StateDirUnsafe(f"{directory} is writable by group or others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}): chmod go-w it (0700)")
    return st


def lock_state_dir(state_dir: str | os.PathLike[str]) -> StateLock:
    """Check the directory (:func:`check`; creating it, mode 0700, if needed), take
    ``<state_dir>/agent.lock`` and write our PID into it; raise :class:`StateDirBusy` if
    another process holds it. A read-only or full directory gives a degraded lock (module
    docstring), never an error.

    The lock file is never deleted (deleting a lock file others may have open is a race);
    what matters is whether a live process holds the ``flock``, which the kernel drops when
    that process exits, however it exits."""
    directory = Path(state_dir)
    degraded: str | None = None
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        if err.errno not in _DEGRADED:
            raise
        degraded = _DEGRADED[err.errno]
    check(directory)
    path = directory / LOCK_NAME
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o600)
    except OSError as err:
        if err.errno not in _DEGRADED:
            raise
        degraded = _DEGRADED[err.errno]
        try:  # flock needs no write access: an existing lock file still keeps others out
            fd = os.open(path, os.O_RDONLY | flags)
        except FileNotFoundError:
            log.error("state_dir %s cannot be written (%s) and has no %s: running without "
                      "the lock", directory, degraded, LOCK_NAME)
            return StateLock(path, -1, degraded)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as err:
            if err.errno not in (*_DEGRADED, errno.EBADF, errno.EINVAL):
                raise
            degraded = degraded or _DEGRADED.get(err.errno, "read_only")
    except BlockingIOError:
        try:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        raise StateDirBusy(path, int(text) if text.isdigit() else None) from None
    except BaseException:
        os.close(fd)
        raise
    if degraded:
        log.error("state_dir %s cannot be written (%s): the agent runs on, serving its "
                  "probes and enforcing offload; alerts are held in memory and the control "
                  "socket may be missing", directory, degraded)
    return StateLock(path, fd, degraded)
