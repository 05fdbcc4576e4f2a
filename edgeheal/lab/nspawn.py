"""A real, booted systemd in a Debian 12 container (``systemd-nspawn --boot``) — always removed.

Why: edgeheal lives or dies as a systemd service, and the machines that build and test it do
not run systemd as PID 1. ``systemd-analyze verify`` cannot tell whether a ``Type=notify``
unit ever becomes active, whether the watchdog fires, what the ordering at boot really is,
or whether the hardening breaks netlink. A container booted with ``systemd-nspawn`` runs the
same systemd as an edge node (Debian 12's 252), with its own journal, polkit and D-Bus.

Three pieces:

- :func:`debian_rootfs` builds a minimal Debian root file system with ``debootstrap`` from
  the Debian mirror that apt on this machine is configured with (:func:`apt_mirror`, read at
  run time) and caches it under a directory keyed by its inputs (suite, packages, format), so
  only the first run pays for it (about 1.5 min); the build is atomic and serialized by a
  lock, so parallel or aborted runs never see half a tree.
- :class:`Container` boots that tree on a throw-away overlay (the cache stays pristine), in a
  network namespace of the caller's (``--network-veth``: the container gets a NIC ``host0``
  whose TX checksum offload starts on), with read-only bind mounts (the checkout, a
  wheelhouse).
- Commands run inside through ``nsenter`` into the container's namespaces — no machined, no
  D-Bus needed on the host. ``systemctl`` and ``journalctl`` inside talk to the container's
  systemd over its private socket, so they work even while the container's bus is down.

Lab code: it runs ``debootstrap``, ``systemd-nspawn``, ``nsenter`` and ``mount`` as
subprocesses, which the agent itself never does.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from edgeheal.lab.netns import owner_of, unique

log = logging.getLogger(__name__)

T = TypeVar("T")

SUITE = "bookworm"
"""Debian 12: what the edge nodes run."""
PACKAGES = ("systemd", "systemd-sysv", "dbus", "libpam-systemd", "polkitd", "iproute2",
            "ethtool", "python3", "python3-venv")
"""What the container needs: systemd as init, the system bus and polkit (the k3s-service
remedy's privilege model; polkitd depends on a logind, which ``debootstrap`` does not pick
by itself, hence libpam-systemd), ip/ethtool to look at the NIC, and what install.sh needs."""
FORMAT = 1
"""Bump when :func:`_finish_rootfs` changes what a cached tree contains."""
DEFAULT_CACHE = Path("/var/cache/edgeheal-test")
MIRROR_ENV = "EDGEHEAL_DEBIAN_MIRROR"
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class NspawnError(Exception):
    """Building, booting or talking to the container failed; the message says which step."""


class CannotBoot(NspawnError):
    """``systemd-nspawn`` cannot boot a container on this machine (tests skip on this)."""


# --- the root file system ------------------------------------------------------------------

def apt_mirror(suite: str = SUITE, apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt is configured with for ``suite`` (``$EDGEHEAL_DEBIAN_MIRROR``
    wins). Reads one-line ``sources.list`` entries and deb822 ``.sources`` files."""
    if os.environ.get(MIRROR_ENV):
        return os.environ[MIRROR_ENV]
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list")),
             *sorted((apt_dir / "sources.list.d").glob("*.sources"))]
    for path in files:
        with contextlib.suppress(OSError):
            for uri, suites, components in _sources(path.read_text()):
                if suite in suites and "main" in components:
                    return uri
    raise NspawnError(
        f"no Debian mirror for {suite!r} (component main) in {apt_dir}/sources.list*; "
        f"set ${MIRROR_ENV} to one")


def _sources(text: str) -> Iterable[tuple[str, list[str], list[str]]]:
    """(uri, suites, components) of every ``deb`` entry, in either format."""
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 4 and words[0] == "deb":
            yield words[1], [words[2]], words[3:]
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            m = re.match(r"^([A-Za-z-]+):\s*(.*)$", line)
            if m:
                fields[m.group(1).lower()] = m.group(2)
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
            for uri in fields.get("uris", "").split():
                yield uri, fields.get("suites", "").split(), fields.get("components", "").split()


def cache_key(suite: str, packages: Sequence[str]) -> str:
    """The cache entry's name: a digest of everything that decides the tree's content."""
    inputs = json.dumps({"suite": suite, "variant": "minbase", "packages": sorted(packages),
                         "arch": os.uname().machine, "format": FORMAT}, sort_keys=True)
    return f"debian-{suite}-{hashlib.sha256(inputs.encode()).hexdigest()[:16]}"


def debian_rootfs(cache_dir: Path = DEFAULT_CACHE, *, suite: str = SUITE,
                  packages: Sequence[str] = PACKAGES, mirror: str | None = None,
                  timeout: float = 900.0) -> Path:
    """A cached minimal Debian root file system with ``packages``; built when missing.

    Never modify the returned tree: boot it through :class:`Container` (an overlay)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / cache_key(suite, packages)
    with (cache_dir / f"{final.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a parallel run builds it once, the others wait
        if (final / "etc" / "os-release").exists():
            return final
        if shutil.which("debootstrap") is None:
            raise NspawnError("debootstrap is not installed (apt-get install debootstrap)")
        url = mirror or apt_mirror(suite)
        partial = cache_dir / f"{final.name}.partial-{os.getpid()}"
        log.info("building %s from %s (once; cached in %s)", suite, url, cache_dir)
        began = time.monotonic()
        try:
            proc = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
                 suite, str(partial), url],
                capture_output=True, text=True, timeout=timeout, check=False)
            if proc.returncode != 0:
                detail = (partial / "debootstrap" / "debootstrap.log")
                tail = detail.read_text()[-2000:] if detail.exists() else proc.stderr[-2000:]
                raise NspawnError(f"debootstrap {suite} from {url} -> exit "
                                  f"{proc.returncode}:\n{tail}")
            _finish_rootfs(partial)
            partial.rename(final)
        finally:
            if partial.exists():
                remove_tree(partial)
        log.info("built %s in %.0f s", final, time.monotonic() - began)
        return final


def _finish_rootfs(root: Path) -> None:
    """Make the tree boot quietly and alike every time."""
    # systemd makes a fresh transient machine id per boot when the file is empty
    (root / "etc" / "machine-id").write_text("")
    # nothing in the container may try to reach the network or run on a timer
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer",
                 "fstrim.timer", "dpkg-db-backup.timer"):
        (root / "etc" / "systemd" / "system" / unit).unlink(missing_ok=True)
        with contextlib.suppress(FileExistsError):
            (root / "etc" / "systemd" / "system" / unit).symlink_to("/dev/null")


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path``, deepest first."""
    base = str(path.resolve())
    found = []
    with Path("/proc/self/mountinfo").open() as info:
        for line in info:
            point = line.split()[4].replace("\\040", " ")
            if point == base or point.startswith(base + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def remove_tree(path: Path) -> None:
    """``rm -rf`` that first unmounts whatever is mounted inside (a failed debootstrap can
    leave /proc, /sys or a /dev bind there) and refuses to delete through a mount."""
    for point in mounts_under(path):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
    left = mounts_under(path)
    if left:
        raise NspawnError(f"not removing {path}: still mounted: {', '.join(map(str, left))}")
    shutil.rmtree(path, ignore_errors=True)


# --- the container ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Bind:
    source: Path
    target: str
    read_only: bool = True


@dataclass
class Container:
    """A booted container on an overlay of ``lower``; :meth:`close` removes everything.

    ``netns``: the (caller-made) network namespace ``systemd-nspawn`` runs in, so the host
    side of ``--network-veth`` lives there and dies with it."""

    lower: Path
    workdir: Path
    netns: str | None = None
    binds: tuple[Bind, ...] = ()
    name: str = field(default_factory=lambda: unique("c"))
    process: subprocess.Popen[bytes] | None = None
    boot_seconds: list[float] = field(default_factory=list)
    """How long each boot took, up to systemd's ``running``/``degraded``."""

    @property
    def boots(self) -> int:
        return len(self.boot_seconds)

    @property
    def root(self) -> Path:
        return self.workdir / "merged"

    @property
    def console_log(self) -> Path:
        """The current (last) boot's console output."""
        return self.workdir / f"console-{max(self.boots, 1)}.log"

    # --- life cycle --------------------------------------------------------------------

    def mount(self) -> None:
        for sub in ("upper", "work", "merged"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        opts = (f"lowerdir={self.lower},upperdir={self.workdir / 'upper'},"
                f"workdir={self.workdir / 'work'}")
        proc = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(self.root)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise CannotBoot(f"cannot mount an overlay on {self.root}: {proc.stderr.strip()}")

    def boot(self, *, timeout: float = 120.0, extra_args: Sequence[str] = ()) -> float:
        """Start ``systemd-nspawn --boot`` and wait until systemd finished starting up
        (``is-system-running`` says running or degraded). Returns the seconds it took."""
        if shutil.which("systemd-nspawn") is None:
            raise CannotBoot("systemd-nspawn is not installed "
                             "(apt-get install systemd-container)")
        if not mounts_under(self.root):
            self.mount()
        argv = ["systemd-nspawn", "--quiet", "--boot", f"--directory={self.root}",
                f"--machine={self.name}", "--register=no", "--keep-unit", "--network-veth",
                "--private-users=no", *extra_args]
        for bind in self.binds:
            argv.append(f"--bind{'-ro' if bind.read_only else ''}={bind.source}:{bind.target}")
        if self.netns:  # only the network namespace: `ip netns exec` would also remount
            # /sys, hiding /sys/fs/cgroup, and nspawn could not set up the container's cgroup
            argv = ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]
        began = time.monotonic()
        with (self.workdir / f"console-{self.boots + 1}.log").open("ab") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self.boot_seconds.append(0.0)
        try:
            self.wait_for(lambda: self._leader() is not None, timeout=30.0,
                          what="the container's init to start")
        except NspawnError as err:
            raise CannotBoot(str(err)) from err
        self.wait_for(self._booted, timeout=timeout, what="systemd to finish booting")
        self.boot_seconds[-1] = time.monotonic() - began
        return self.boot_seconds[-1]

    def _booted(self) -> bool:
        state = self.run(["systemctl", "is-system-running"], check=False).stdout.strip()
        return state in ("running", "degraded")

    def poweroff(self, timeout: float = 60.0) -> None:
        """Shut the container down cleanly (the overlay, i.e. its disk, stays)."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        self.run(["systemctl", "--no-block", "poweroff"], check=False)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("container %s did not power off within %g s: killing it",
                        self.name, timeout)
            self._kill()
        self.process = None

    def reboot(self, *, timeout: float = 120.0) -> float:
        """Power off and boot again on the same disk: a real second boot."""
        self.poweroff()
        return self.boot(timeout=timeout)

    def _kill(self) -> None:
        leader = self._leader()
        if leader is not None:  # killing init tears the whole pid namespace down
            with contextlib.suppress(ProcessLookupError):
                os.kill(leader, signal.SIGKILL)
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)

    def close(self) -> None:
        """Stop the container (cleanly if it can) and remove the overlay and its files."""
        try:
            if self.process is not None and self.process.poll() is None:
                self.poweroff(timeout=30.0)
        except (NspawnError, OSError, subprocess.SubprocessError) as err:
            log.warning("container %s: clean poweroff failed: %s", self.name, err)
        finally:
            self._kill()
            self.process = None
            remove_tree(self.workdir)
            collect_garbage()

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- inside ------------------------------------------------------------------------

    def _leader(self) -> int | None:
        """PID (on the host) of the container's init: the process below nspawn that lives
        in another pid namespace."""
        if self.process is None or self.process.poll() is not None:
            return None
        own = os.readlink("/proc/self/ns/pid")
        todo = [self.process.pid]
        for _ in range(4):  # nsenter -> nspawn -> (outer child) -> init
            nxt = []
            for pid in todo:
                for child in _children(pid):
                    try:
                        if os.readlink(f"/proc/{child}/ns/pid") != own:
                            return child
                    except OSError:
                        continue
                    nxt.append(child)
            todo = nxt
        return None

    def leader(self) -> int:
        pid = self._leader()
        if pid is None:
            raise NspawnError(f"container {self.name} is not running "
                              f"(console: {self.console_tail()})")
        return pid

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0,
            input: str | None = None, env: Mapping[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the container as root (all its namespaces, its root)."""
        environment = {"PATH": CONTAINER_PATH, "HOME": "/root", "LANG": "C.UTF-8",
                       "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", **(env or {})}
        full = ["nsenter", f"--target={self.leader()}", "--mount", "--uts", "--ipc", "--net",
                "--pid", "--root", "--wd", "--", "/usr/bin/env", "-i",
                *(f"{k}={v}" for k, v in environment.items()), *argv]
        try:
            proc = subprocess.run(full, capture_output=True, text=True, input=input,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired as err:
            raise NspawnError(f"in {self.name}: {' '.join(argv)}: no exit within "
                              f"{timeout:g} s") from err
        if check and proc.returncode != 0:
            raise NspawnError(f"in {self.name}: {' '.join(argv)} -> exit {proc.returncode}: "
                              f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
        return proc

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write a file inside the (running) container."""
        self.run(["sh", "-c", f'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod {mode:o} "$1"',
                  "sh", path], input=text)

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(["systemctl", *args], check=check)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.systemctl("show", unit, "--property=" + ",".join(props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def cursor(self) -> str:
        """The journal's current end, for :meth:`journal` ``after=``."""
        out = self.run(["journalctl", "--lines=1", "--no-pager", "--output=json"]).stdout
        return str(json.loads(out.splitlines()[-1])["__CURSOR"])

    def journal(self, *args: str, after: str | None = None) -> list[dict[str, str]]:
        """This boot's journal entries (``journalctl -o json`` objects), oldest first;
        only those after the cursor ``after`` when given."""
        if after is not None:
            args = (f"--after-cursor={after}", *args)
        out = self.run(["journalctl", "--boot", "--no-pager", "--output=json",
                        "--output-fields=MESSAGE,_SYSTEMD_UNIT,UNIT,SYSLOG_IDENTIFIER,"
                        "_PID,__MONOTONIC_TIMESTAMP,JOB_RESULT,JOB_TYPE", *args]).stdout
        entries = []
        for line in out.splitlines():
            entry = json.loads(line)
            msg = entry.get("MESSAGE")
            if isinstance(msg, list):  # journald stores non-UTF-8 messages as byte arrays
                entry["MESSAGE"] = bytes(msg).decode(errors="replace")
            entries.append({k: str(v) for k, v in entry.items()})
        return entries

    def console_tail(self, limit: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.console_log.read_text(errors="replace")[-limit:]
        return ""

    def wait_for(self, predicate: Callable[[], T | None], *, timeout: float, what: str,
                 interval: float = 0.25) -> T:
        """Poll ``predicate`` until it returns something truthy (and return that); bounded
        in time, and cut short when the container stops."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if self.process is not None and self.process.poll() is not None:
                raise NspawnError(f"container {self.name} exited ({self.process.returncode}) "
                                 f"while waiting for {what}; console:\n{self.console_tail()}")
            if time.monotonic() >= deadline:
                raise NspawnError(f"container {self.name}: timed out after {timeout:g} s "
                                  f"waiting for {what}")
            time.sleep(interval)


def sweep() -> list[str]:
    """Remove containers of runs that died without :meth:`Container.close` (SIGKILL).

    A ``systemd-nspawn --machine=eh<pid6>...`` whose owner (the process of that PID, as in
    :func:`edgeheal.lab.netns.sweep`) is gone is killed with its container; its overlay is
    unmounted and removed. Returns the machine names removed."""
    removed = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = [a.decode(errors="replace")
                    for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if not args or Path(args[0]).name != "systemd-nspawn":
            continue
        opts = dict(a[2:].split("=", 1) for a in args[1:] if a.startswith("--") and "=" in a)
        machine, directory = opts.get("machine", ""), opts.get("directory", "")
        owner = owner_of(machine)
        if (owner is None or Path(f"/proc/{owner}").exists()
                or not directory.endswith("/merged")):
            continue
        pid = int(proc.name)
        for child in _children(pid):  # init, and with it the container's pid namespace
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        workdir = Path(directory).parent
        if (workdir / "upper").is_dir() and (workdir / "work").is_dir():
            remove_tree(workdir)
        removed.append(machine)
    if removed:
        log.info("removed containers of dead runs: %s", ", ".join(removed))
    collect_garbage()
    return removed


NSPAWN_RUN = Path("/run/systemd/nspawn")


def collect_garbage() -> None:
    """Remove what ``systemd-nspawn`` leaves in /run when /run is not a tmpfs (it refuses
    to delete on a disk file system) or when it was killed: the mount-propagation directory
    of each of our machines that no longer runs, and image lock files nobody holds."""
    running = set()
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit():
                args = (proc / "cmdline").read_bytes().split(b"\0")
                if args and Path(args[0].decode(errors="replace")).name == "systemd-nspawn":
                    running |= {a[10:].decode() for a in args if a.startswith(b"--machine=")}
    with contextlib.suppress(OSError):
        for entry in (NSPAWN_RUN / "propagate").iterdir():
            if entry.name.startswith("eh") and entry.name not in running:
                with contextlib.suppress(NspawnError):
                    remove_tree(entry)
    with contextlib.suppress(OSError):
        for lock in (NSPAWN_RUN / "locks").glob("inode-*"):
            with contextlib.suppress(OSError), lock.open("rb") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: the image is in use
                lock.unlink()


def inotify_headroom() -> str:
    """How many inotify instances this host's processes hold against the per-user limit —
    the first thing to look at when the container's dbus-daemon or systemd cannot set up
    inotify (the container's root is the host's root: one shared budget)."""
    used = 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                used += sum(1 for fd in (proc / "fd").iterdir()
                            if os.readlink(fd) == "anon_inode:inotify")
    limit = Path("/proc/sys/fs/inotify/max_user_instances").read_text().strip()
    return f"{used} inotify instances in use on the host (all users), " \
           f"fs.inotify.max_user_instances = {limit}"


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found
