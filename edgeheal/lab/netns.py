"""Network namespaces, veth pairs and processes for the lab and the tests — always removed.

Everything made here is recorded in a :class:`Sandbox`; ``close()`` (also on exceptions,
Ctrl-C, or from a pytest fixture's finalizer) kills its processes, deletes its namespaces
(which takes their veths and nftables tables with them) and removes its files. Names are
unique per run (``eh<pid><rand>``) so an aborted run can never break the next one, and
:func:`sweep` removes leftovers of *dead* runs by that prefix.

This is lab code: it runs ``ip``, ``nft`` and friends as subprocesses, which the agent
itself never does in its steady state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "eh"
"""Every namespace and interface name made by the lab starts with this."""


class LabError(Exception):
    """A lab command failed; the message carries the command and its stderr."""


def run(argv: Sequence[str], *, ns: str | None = None, check: bool = True,
        input: str | None = None, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run a command (inside namespace ``ns`` when given) and return its output."""
    full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    proc = subprocess.run(full, capture_output=True, text=True, input=input,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(full)} -> exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def prefix_of(pid: int) -> str:
    """The start of every name :func:`unique` gives in process ``pid``: ``eh`` and the
    whole PID in six hex digits (``pid_max`` is at most 2**22). Four decimal digits of it
    were not enough: with ``pid_max`` 32768 a long test run reuses PIDs, and one worker took
    another's lab for its own leak and deleted it."""
    return f"{PREFIX}{pid:06x}"


def owner_of(name: str) -> int | None:
    """The PID whose :func:`prefix_of` ``name`` starts with, or None (not a lab name)."""
    if not name.startswith(PREFIX) or len(name) < len(PREFIX) + 10:
        return None
    try:
        return int(name[len(PREFIX):len(PREFIX) + 6], 16)
    except ValueError:
        return None


def unique(tag: str = "") -> str:
    """A short unique name (<= 15 chars, fits an interface name): ``eh<pid6><hex4><tag>``."""
    name = f"{prefix_of(os.getpid())}{secrets.token_hex(2)}{tag}"
    if len(name) > 15:
        raise ValueError(f"name {name!r} is longer than an interface name may be")
    return name


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, veth, nftables)")


def require_programs(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise LabError(f"missing program(s): {', '.join(missing)} "
                       "(install them with `install.sh --lab`)")


@dataclass
class Sandbox:
    """Owns every namespace, process and file a lab run or test makes."""

    namespaces: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)

    def netns(self, tag: str = "") -> str:
        name = unique(tag)
        run(["ip", "netns", "add", name])
        self.namespaces.append(name)
        run(["ip", "link", "set", "lo", "up"], ns=name)
        return name

    def veth(self, ns_a: str, ns_b: str, *, addr_a: str, addr_b: str,
             name_a: str | None = None, name_b: str | None = None) -> tuple[str, str]:
        """A veth pair between two namespaces, addressed (``10.x.y.z/24``) and up."""
        a, b = name_a or unique("a"), name_b or unique("b")
        run(["ip", "link", "add", a, "netns", ns_a, "type", "veth", "peer", "name", b,
             "netns", ns_b])
        for ns, ifname, addr in ((ns_a, a, addr_a), (ns_b, b, addr_b)):
            run(["ip", "addr", "add", addr, "dev", ifname], ns=ns)
            run(["ip", "link", "set", ifname, "up"], ns=ns)
        return a, b

    def spawn(self, argv: Sequence[str], *, ns: str | None = None,
              log_path: Path | None = None, env: dict[str, str] | None = None,
              ) -> subprocess.Popen[bytes]:
        """Start a process (in ``ns``) that is killed on close; output to ``log_path``.

        Started from the main thread, it also dies with this process (``setpriv
        --pdeathsig KILL``: the signal follows the exec chain), so a test worker or a lab
        killed before its cleanup leaves no broker or wireguard-go behind. Not from another
        thread: the kernel sends the signal when the *thread* that forked exits, and a
        pool thread may end long before the process does.
        """
        full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
        setpriv = shutil.which("setpriv")
        if threading.current_thread() is threading.main_thread() and setpriv:
            full = [setpriv, "--pdeathsig", "KILL", "--", *full]
        else:
            setpriv = None
        out = log_path.open("ab") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        finally:
            if log_path:
                out.close()  # type: ignore[union-attr]
        self.processes.append(proc)
        if setpriv:
            _past(proc.pid, setpriv)
        return proc

    def nft(self, ns: str, script: str) -> None:
        """Apply an nftables script inside ``ns`` (tables vanish with the namespace)."""
        run(["nft", "-f", "-"], ns=ns, input=script)

    def track(self, path: Path) -> Path:
        self.paths.append(path)
        return path

    def close(self) -> None:
        for proc in reversed(self.processes):
            stop_process(proc)
        self.processes.clear()
        for ns in reversed(self.namespaces):
            for pid in run(["ip", "netns", "pids", ns], check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            run(["ip", "netns", "del", ns], check=False)
        self.namespaces.clear()
        for path in reversed(self.paths):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        self.paths.clear()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop_process(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
    """SIGTERM the process group, then SIGKILL after ``grace`` seconds; always reaps."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def sweep() -> list[str]:
    """Delete namespaces left by lab runs whose process is gone, with what still runs in
    them; return their names."""
    removed = []
    out = run(["ip", "netns", "list"], check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = owner_of(name)
        if owner is None:
            continue
        if not Path(f"/proc/{owner}").exists():
            for pid in run(["ip", "netns", "pids", name], check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            run(["ip", "netns", "del", name], check=False)
            removed.append(name)
    return removed + _sweep_wireguard_sockets()


WG_SOCKETS = Path("/var/run/wireguard")
"""Where wireguard-go puts its UAPI sockets (one per interface, ``<ifname>.sock``)."""


def _sweep_wireguard_sockets() -> list[str]:
    """Remove lab wireguard-go sockets that nothing listens on any more: a wireguard-go
    killed with its namespace (SIGKILL, a test worker killed) leaves its socket file, and
    the per-test leak checks only see their own process's names."""
    removed = []
    for path in sorted(WG_SOCKETS.glob(f"{PREFIX}*.sock")) if WG_SOCKETS.is_dir() else []:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(1.0)
            probe.connect(str(path))
        except ConnectionRefusedError:  # no listener: a stale file
            path.unlink(missing_ok=True)
            removed.append(path.name)
        except OSError:
            pass  # busy or odd: leave it
        finally:
            probe.close()
    return removed


def _past(pid: int, program: str, within: float = 5.0) -> None:
    """Wait until process ``pid`` has exec'd past ``program`` (setpriv), so its death signal
    is set: killed in between, this process would leave it behind (setpriv never checks
    whether its parent already died). Read from ``comm``, not ``exe``: under qemu-user
    ``exe`` names the emulator from the start. Milliseconds; bounded."""
    deadline = time.monotonic() + within
    name = os.path.basename(program)[:15]  # the kernel's TASK_COMM_LEN - 1
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
                if f.read().strip() != name:
                    return
        except OSError:  # gone: nothing to wait for
            return
        time.sleep(0.001)
