"""The fast (unit) tier as arm64 code: ``scripts/test --arm64-unit`` runs ``scripts/test
--fast``'s selection in a Debian 12 arm64 chroot, every program in it run by qemu-user.

The arm64 guest (:mod:`tests.qemu.test_guest_arm64`) proves the kernel paths on an arm64
kernel; this runs the whole unit tier -- the pure core, the readers against recorded data,
the fakes, the CLI -- as aarch64 code against the aarch64 builds of every compiled
dependency, which the amd64 suite cannot.

- :func:`tree`: :func:`tests.qemu.arm64.first_stage` with :data:`PACKAGES` (the guest's
  userland without its kernel, plus :data:`TOOLS`, the programs the tier's tests run), then
  debootstrap's second stage *inside* the tree, emulated: every maintainer script runs, so
  dpkg and apt work in it as on a board. Cached under ``$EDGEHEAL_TEST_CACHE``.
- :func:`site`: the agent's dependencies and the ``dev`` extra's test tools (pytest, xdist,
  hypothesis, kubectl...; not ruff, mypy, import-linter: the checks run once, on the host)
  as aarch64 wheels (:func:`tests.qemu.arm64.site`). Cached.
- :func:`namespaced`: the private namespaces everything runs in. binfmt_misc is per user
  namespace from Linux 6.7, so a user namespace of our own (uids and gids mapped 1:1: the
  tree's owners stay its owners), with a mount and a PID namespace (and, for the tests, a
  network namespace), mounts its own binfmt_misc and registers Debian's
  ``qemu-aarch64-static`` there (:data:`BINFMT`). The registration, every mount and every
  process end with the namespaces: the host's binfmt_misc is never touched, so there is
  nothing to undo, even after a kill.
- :func:`run_tests`: the tests see an overlay of the cached tree (their writes go to a
  temporary upper directory, removed after), the checkout and the site-packages read-only
  (``/src``, ``/site``), a fresh ``/tmp``, the ``/proc`` of their PID namespace, and only a
  loopback. Inside, what ``scripts/test --fast`` does: capabilities dropped (``setpriv``),
  ``EDGEHEAL_TEST_TIER=fast``, the tier's marker expression, plus
  ``EDGEHEAL_TEST_QEMU_USER=aarch64``: :mod:`tests.qemu_user` then deselects what qemu-user
  cannot run, by name and with its reason, and fails the run unless it ran as aarch64 code
  with aarch64 compiled modules.

The interpreter is Debian's ``qemu-aarch64-static`` (package qemu-user-static), which
``install.sh --dev`` unpacks into ``/opt/edgeheal/libexec`` instead of installing the
package: on a systemd host the package's ``/usr/lib/binfmt.d`` entries would be registered
for the whole host (systemd's trigger at install, ``systemd-binfmt`` at every boot). It is
static, as it must be: the chroot has no amd64 loader.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from edgeheal.base import compat
from edgeheal.lab import nspawn
from tests.qemu import arm64, bed

TOOLS = ("systemd", "prometheus", "prometheus-alertmanager", "modemmanager", "nodejs",
         "util-linux", "dbus", "libpam-systemd")
"""What the fast tier's tests run besides Python (``systemd-analyze``, ``promtool``,
``amtool``, ModemManager's D-Bus policy, ``node`` for the polkit rules, ``setpriv``); ``dbus``
and ``libpam-systemd`` provide what polkitd (ModemManager's) depends on by virtual names
(``default-dbus-system-bus``, ``default-logind``), which debootstrap does not resolve."""
PACKAGES = tuple(sorted({*arm64.PACKAGES, *TOOLS} - {"linux-image-arm64", "busybox-static"}))
"""The guest's userland (:data:`tests.qemu.arm64.PACKAGES` without the kernel and the
initramfs's busybox) and :data:`TOOLS`."""
FORMAT = 1
"""Bump when what :func:`tree` or :func:`site` puts into a cached entry changes."""
QEMU_ENV = "EDGEHEAL_QEMU_AARCH64"
QEMU = Path("/opt/edgeheal/libexec/qemu-aarch64-static")
"""Where ``install.sh --dev`` puts Debian's interpreter (``$EDGEHEAL_QEMU_AARCH64`` wins)."""
MAGIC = r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
"""An ELF64 little-endian executable or shared object for machine 183 (AArch64): the magic
and mask of qemu-user-static's ``/usr/lib/binfmt.d/qemu-aarch64.conf`` (Debian 12)."""
BINFMT = ":edgeheal-aarch64:M::" + MAGIC + ":" + MASK + ":{interpreter}:FP"
"""The registration. ``F``: the interpreter is opened now, in the host's file system, so the
chroot needs no copy of it; ``P``: argv[0] is kept (QEMU reads the flag from AT_FLAGS)."""
DEV_EXCLUDED = re.compile(r"(edgeheal|ruff|mypy|import-linter)\b")
"""The ``dev`` extra's entries the chroot does without (the checks run on the host, once;
the self-reference brings the extras :func:`tests.qemu.arm64.requirements` lists)."""
MAP_TIMEOUT = 10.0
"""How long ``unshare`` may take to make its user namespace (s)."""
PTH = f"/usr/local/lib/python{arm64.PYTHON}/dist-packages/edgeheal-test.pth"
"""Puts ``/src`` and ``/site`` on the path of every Python in the chroot, also of a test's
child started with an empty environment (as the dev venv's editable install does)."""
WORK = "chroot-run"
"""The cache's directory of the runs' overlays (one per run, removed after it)."""


class ChrootError(bed.BedError):
    """The chroot cannot be made or entered (the message says what is missing)."""


def interpreter() -> Path:
    path = Path(os.environ.get(QEMU_ENV) or QEMU)
    if not os.access(path, os.X_OK):
        raise ChrootError(f"no qemu-aarch64-static at {path}: ./install.sh --dev unpacks "
                          f"Debian's (qemu-user-static) there, or set ${QEMU_ENV}")
    return path


def requirements(pyproject: Path = bed.CHECKOUT / "pyproject.toml") -> list[str]:
    """:func:`tests.qemu.arm64.requirements` and the ``dev`` extra's test tools."""
    dev = compat.tomllib.loads(pyproject.read_text())["project"][
        "optional-dependencies"]["dev"]
    return [*arm64.requirements(pyproject), *(r for r in dev if not DEV_EXCLUDED.match(r))]


def site(cache: Path) -> Path:
    return arm64.site(cache, requirements(), name="site-arm64-dev")


# --- the namespaces ------------------------------------------------------------------------------

ENTER = r"""
work=$1 tree=$2 qemu=$3 net=$4 overlay=$5; shift 5
mkdir -p "$work/binfmt"
mount -t binfmt_misc edgeheal "$work/binfmt"
printf '%s' "$BINFMT" > "$work/binfmt/register"
root=$tree
if [ "$overlay" = 1 ]; then
  mkdir -p "$work/upper" "$work/ovl" "$work/root"
  mount -t overlay edgeheal -o "lowerdir=$tree,upperdir=$work/upper,workdir=$work/ovl" \
    "$work/root"
  root=$work/root
fi
mount --rbind /dev "$root/dev"
mount -t proc proc "$root/proc"
if [ "$net" = 1 ]; then
  ip link set lo up
  mount -t sysfs sysfs "$root/sys"
else
  mount --rbind /sys "$root/sys"
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
fi
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
if [ -n "${PTH:-}" ]; then  # the binds on every Python's path, as an editable install would
  mkdir -p "$root${PTH%/*}"
  printf '%s\n' $PTH_LINES > "$root$PTH"
fi
while [ "$1" != -- ]; do
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  mount -o remount,bind,ro "$root$2"
  shift 2
done
shift
exec chroot "$root" "$@"
"""
"""Run by the host's ``sh`` inside the namespaces, as their root: binfmt_misc, the mounts,
then ``chroot`` and the command (from there on, arm64 code)."""


def namespaced(work: Path, tree: Path, argv: Sequence[str], *, net: bool, overlay: bool,
               binds: Sequence[tuple[Path, str]] = (), timeout: float,
               capture: bool = False, env: Mapping[str, str] | None = None,
               ) -> subprocess.CompletedProcess[str]:
    """``argv`` in ``tree`` (chrooted, emulated), in new user, mount and PID namespaces (and a
    network namespace with a loopback when ``net``); ``binds`` mounted read-only. Everything
    it started is killed with the PID namespace when it ends or times out."""
    qemu = interpreter()
    for program in ("unshare", "chroot", "mount", "ip"):
        if shutil.which(program) is None:
            raise ChrootError(f"{program} is not installed (util-linux, coreutils, iproute2)")
    work.mkdir(parents=True, exist_ok=True)
    read, write = os.pipe()
    flags = ["--user", "--mount", "--pid", "--fork", "--kill-child", *(["--net"] if net else [])]
    # stdin is the go-ahead (dash cannot name a descriptor above 9), then /dev/null
    wait = 'read -r _ && exec sh -eu "$0" "$@" </dev/null'
    (work / "enter.sh").write_text(ENTER)
    bound = [w for src, dst in binds for w in (str(src), dst)]
    env = {**os.environ, **(env or {}), "BINFMT": BINFMT.format(interpreter=qemu)}
    proc = subprocess.Popen(
        ["unshare", *flags, "--", "sh", "-c", wait, str(work / "enter.sh"), str(work),
         str(tree), str(qemu), str(int(net)), str(int(overlay)), *bound, "--", *argv],
        stdin=read, env=env, text=True, start_new_session=True,
        stdout=subprocess.PIPE if capture else None, stderr=subprocess.STDOUT if capture
        else None)
    os.close(read)
    try:
        _map_ids(proc.pid)
        os.write(write, b"go\n")
        os.close(write)
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(write)
        proc.kill()  # unshare --kill-child takes the PID namespace with it
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out or "", "")


def _map_ids(pid: int) -> None:
    """Map every uid and gid 1:1 into ``unshare``'s new user namespace, once it has made it
    (``unshare --map-users`` would need newuidmap; root may write the maps itself)."""
    ours = os.readlink("/proc/self/ns/user")
    deadline = time.monotonic() + MAP_TIMEOUT
    while os.readlink(f"/proc/{pid}/ns/user") == ours:
        if time.monotonic() > deadline:
            raise ChrootError(f"unshare made no user namespace in {MAP_TIMEOUT:g} s")
        time.sleep(0.01)
    for name in ("uid_map", "gid_map"):
        Path(f"/proc/{pid}/{name}").write_text("0 0 4294967295\n")


# --- the tree ------------------------------------------------------------------------------------

def tree(cache: Path, mirror: str | None = None) -> Path:
    """The cached arm64 chroot: the first stage on the host, the second emulated in it."""
    key = hashlib.sha256(json.dumps({"suite": nspawn.SUITE, "packages": PACKAGES,
                                     "format": FORMAT}).encode()).hexdigest()[:16]

    def build(root: Path) -> None:
        arm64.first_stage(root, PACKAGES, mirror)
        for mount in ("proc", "sys"):  # debootstrap in a container links them to the host's
            if (root / mount).is_symlink():
                (root / mount).unlink()
                (root / mount).mkdir()
        with tempfile.TemporaryDirectory(dir=cache, prefix=f"{WORK}-") as work:
            # container=lxc: debootstrap's own name for "no mknod here" (a user namespace
            # may not make device nodes; /dev is the host's, bound)
            done = namespaced(Path(work), root, ["/debootstrap/debootstrap", "--second-stage"],
                              net=False, overlay=False, timeout=3600, capture=True,
                              env={"container": "lxc"})
        if done.returncode != 0:
            raise ChrootError(f"debootstrap --second-stage under qemu-user -> exit "
                              f"{done.returncode}: {done.stdout[-3000:]}")
        (root / "etc" / "machine-id").write_text("")
        for download in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            download.unlink()

    return arm64._cached(cache, f"debian-{nspawn.SUITE}-arm64-chroot-{key}", build)


# --- the run -------------------------------------------------------------------------------------

def run_tests(cache: Path, pytest_args: Sequence[str], *, markers: str, workers: int,
              timeout: float, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """The fast tier in the chroot: pytest's exit status (and its output, if captured)."""
    began = time.monotonic()
    root = tree(cache)
    packages = site(cache)
    prepared = time.monotonic() - began
    built = {root.name, packages.parent.name} & arm64.BUILT
    print(f"arm64 chroot: {root.name}, {packages.parent.name} "
          f"({'built' if built else 'cached'}, {prepared:.0f} s)", flush=True)
    env = {"HOME": "/root", "LANG": "C.UTF-8", "PYTHONPATH": "/src:/site",
           "PATH": "/site/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "PYTHONDONTWRITEBYTECODE": "1", "EDGEHEAL_TEST_TIER": "fast",
           "EDGEHEAL_TEST_QEMU_USER": "aarch64", "CI": os.environ.get("CI", "")}
    env.update({k: v for k, v in os.environ.items() if k.startswith("EDGEHEAL_HYPOTHESIS")})
    inside = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()),
              "/usr/bin/setpriv", "--bounding-set=-all", "--inh-caps=-all",
              "--ambient-caps=-all", "--", "/bin/sh", "-c", 'cd /src && exec "$@"', "sh",
              "/usr/bin/python3", "-m", "pytest", "-p", "no:cacheprovider",
              "-n", str(workers), "--dist", "loadfile", "-m", markers, *pytest_args]
    print("arm64 chroot: " + shlex.join(inside[inside.index("/usr/bin/python3"):]), flush=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f"{WORK}-") as work:
        done = namespaced(Path(work), root, inside, net=True, overlay=True,
                          binds=((bed.CHECKOUT, "/src"), (packages, "/site")), timeout=timeout,
                          capture=capture, env={"PTH": PTH, "PTH_LINES": "/src /site"})
    print(f"arm64 chroot: pytest exit {done.returncode} after "
          f"{time.monotonic() - began - prepared:.0f} s", flush=True)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    """``[--prepare] [PYTEST-ARGS]`` (scripts/test --arm64-unit)."""
    args = list(sys.argv[1:] if argv is None else argv)
    cache = Path(os.environ.get("EDGEHEAL_TEST_CACHE", str(nspawn.DEFAULT_CACHE)))
    if os.geteuid() != 0:
        print("scripts/test --arm64-unit: run it as root (the namespaces' mounts)",
              file=sys.stderr)
        return 2
    try:
        if args[:1] == ["--prepare"]:
            began = time.monotonic()
            root, packages = tree(cache), site(cache)
            print(f"arm64 chroot: {root} and {packages} ready in "
                  f"{time.monotonic() - began:.0f} s")
            return 0
        markers = os.environ.get("EDGEHEAL_TEST_MARKERS",
                                 "not root and not daemon and not vm and not slow")
        workers = int(os.environ.get("EDGEHEAL_TEST_WORKERS") or
                      len(os.sched_getaffinity(0)))
        timeout = float(os.environ.get("EDGEHEAL_TEST_ARM64_UNIT_TIMEOUT", "10800"))
        return run_tests(cache, args, markers=markers, workers=workers,
                         timeout=timeout).returncode
    except bed.BedError as err:
        print(f"scripts/test --arm64-unit: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
