"""The arm64 guest of the QEMU bed: Debian 12's ``linux-image-arm64`` and an arm64 userland,
built on this (amd64) machine without running one arm64 instruction, then booted by
:class:`tests.qemu.bed.VM` under ``qemu-system-aarch64 -M virt`` (TCG).

- :func:`rootfs`: ``debootstrap --foreign --arch=arm64`` downloads the packages and unpacks
  the required ones; the rest (the kernel, Python, the tools: :data:`PACKAGES`) are unpacked
  here the way debootstrap's first stage does it (``dpkg-deb --fsys-tarfile | tar
  --keep-directory-symlink``, merged /usr kept). No maintainer script runs (they are arm64
  programs; :mod:`tests.qemu.arm64_chroot` runs them under qemu-user for its chroot, which
  takes ~10 min that the guest does not need):
  what the guest needs of them is done here -- the users and groups base-passwd's preinst
  writes, two alternatives (``awk``, ``which``), mosquitto's user, and ``depmod`` (the host's
  kmod reads arm64 modules; the kernel's postinst would run it). The guest needs nothing else
  of dpkg: its PID 1 is the bed's shell script, not systemd. No ``ld.so.cache``: Debian's
  loader searches ``/lib/aarch64-linux-gnu`` and ``/usr/lib/aarch64-linux-gnu`` built in.
- :func:`site`: the agent's dependencies for the guest's Python (Debian 12's 3.11 on
  aarch64): the project's dependencies with the ``kubernetes``, ``dbus`` and ``lab`` extras, as
  manylinux aarch64 wheels (what ``packaging/build --arch arm64`` bundles), installed with
  ``pip install --target``. The host's site-packages cannot be shared as on amd64: its
  compiled modules are x86-64.
- :func:`image`: both cached under ``$EDGEHEAL_TEST_CACHE`` by a hash of their inputs, built
  under a lock and renamed into place (as :func:`tests.qemu.bed.image`).

Cold: the download and unpacking about 1 min, the wheels well under one, the disk image
seconds. Nothing runs under emulation until the VM boots.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from edgeheal.base import compat
from edgeheal.lab import nspawn
from tests.qemu import bed

PACKAGES = ("linux-image-arm64", "busybox-static", "python3", "wireguard-tools", "iproute2",
            "ethtool", "udev", "nftables", "kmod", "iputils-ping", "mosquitto")
"""bed.PACKAGES for arm64, plus ``busybox-static``: the initramfs needs an arm64 busybox
(the amd64 bed takes the host's)."""
FORMAT = 2
"""Bump when what :func:`rootfs` or :func:`site` puts into a cached tree changes."""
WANTED_BOOT = ("virtio_pci", "virtio_blk", "crc32c_generic", "ext4")
"""What mounts the root disk; :func:`boot_modules` adds their dependencies (``virtio`` and
``virtio_ring`` are built into Debian's arm64 kernel, unlike amd64's)."""
EXTRAS = ("kubernetes", "dbus", "lab")
"""The agent's, and ``lab`` for ``edgeheal diagnose`` (scapy)."""
BUILT: set[str] = set()
"""The cache entries this process built (the image reports its build time from it)."""
DONE = ".edgeheal-complete"
"""The marker of a finished cache entry (written last)."""
PYTHON = "3.11"
"""Debian 12's Python: the guest's, and the wheels'."""
TARGET = ("--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
          "--abi", "cp311", "--abi", "abi3", "--abi", "none",
          *(f"--platform=manylinux_2_{g}_aarch64" for g in (17, 28, 31, 34, 35, 36)),
          "--platform=manylinux2014_aarch64", "--platform=any")
"""pip's target: Debian 12's CPython on aarch64 (glibc 2.36), as packaging/build's."""


def _cached(cache: Path, name: str, build: Callable[[Path], None]) -> Path:
    """``cache/name``, built by ``build(partial)`` once, under a lock, renamed into place
    (:data:`BUILT` records that it was built here)."""
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / name
    with (cache / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / DONE).exists():
            partial = cache / f"{name}.partial-{os.getpid()}"
            nspawn.remove_tree(partial)
            partial.mkdir(parents=True)
            try:
                build(partial)
                BUILT.add(name)
                (partial / DONE).write_text("")
                nspawn.remove_tree(final)
                partial.rename(final)
            finally:
                if partial.exists():
                    nspawn.remove_tree(partial)
    return final


def _run(argv: Sequence[str], what: str, timeout: float) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise bed.BedError(f"{what}: not done in {timeout:g} s") from None
    if proc.returncode != 0:
        raise bed.BedError(f"{what} -> exit {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout)[-2000:]}")
    return str(proc.stdout)


# --- the root file system ----------------------------------------------------------------------

def rootfs(cache: Path, mirror: str | None = None) -> Path:
    """The cached arm64 tree of :data:`PACKAGES` (bookworm, minbase)."""
    key = hashlib.sha256(json.dumps({"suite": nspawn.SUITE, "packages": sorted(PACKAGES),
                                     "format": FORMAT}).encode()).hexdigest()[:16]

    def build(root: Path) -> None:
        first_stage(root, PACKAGES, mirror)
        unpack(root)

    return _cached(cache, f"debian-{nspawn.SUITE}-arm64-{key}", build)


def first_stage(root: Path, packages: Sequence[str], mirror: str | None = None) -> None:
    """``debootstrap --foreign --arch=arm64`` of bookworm (minbase) with ``packages`` into
    ``root``: downloaded and unpacked on this machine, nothing arm64 run (the guest's tree and
    :mod:`tests.qemu.arm64_chroot`'s both start here)."""
    url = mirror or nspawn.apt_mirror()
    _run(["debootstrap", "--arch=arm64", "--foreign", "--variant=minbase",
          f"--include={','.join(packages)}", nspawn.SUITE, str(root), url],
         f"debootstrap --foreign --arch=arm64 {nspawn.SUITE} from {url}", 900)


def unpack(root: Path) -> None:
    """The first stage's leftovers: every downloaded package unpacked, what the guest needs
    of their maintainer scripts done, the downloads removed."""
    debs = [line.split()[1] for line in (root / "debootstrap" / "debpaths").read_text()
            .splitlines() if line.strip()]
    for deb in debs:
        _run(["sh", "-c", 'dpkg-deb --fsys-tarfile "$1" | tar -C "$2" --keep-directory-symlink '
              "-xf -", "unpack", str(root / deb.lstrip("/")), str(root)],
             f"unpacking {deb}", 300)
    for mount in ("proc", "sys", "dev", "run", "tmp"):
        # in a container debootstrap makes proc a symlink to the host's /proc: a mount point
        # in the guest (its PID 1 would loop on it)
        if (root / mount).is_symlink():
            (root / mount).unlink()
            (root / mount).mkdir(mode=0o1777 if mount == "tmp" else 0o755)
    etc = root / "etc"
    base = root / "usr" / "share" / "base-passwd"
    for name in ("passwd", "group"):  # base-passwd's preinst
        if not (etc / name).exists():
            shutil.copy2(base / f"{name}.master", etc / name)
    with (etc / "group").open("a") as group:  # mosquitto's postinst (adduser --system)
        group.write("mosquitto:x:101:\n")
    with (etc / "passwd").open("a") as passwd:
        passwd.write("mosquitto:x:101:101::/var/lib/mosquitto:/usr/sbin/nologin\n")
    for link, target in (("usr/bin/awk", "mawk"), ("usr/bin/which", "which.debianutils")):
        if not (root / link).exists():
            (root / link).symlink_to(target)
    (etc / "machine-id").write_text("")
    (version,) = [p.name for p in (root / "lib" / "modules").iterdir()]
    _run(["depmod", "-b", str(root), version], "depmod for the arm64 kernel", 120)
    shutil.rmtree(root / "debootstrap")
    for download in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        download.unlink()


def boot_modules(modules_dep: str, wanted: Sequence[str] = WANTED_BOOT) -> tuple[str, ...]:
    """``wanted`` and what they depend on (``modules.dep``), each after its dependencies."""
    deps = {}
    for line in modules_dep.splitlines():
        mod, _, needs = line.partition(":")
        deps[Path(mod).name.removesuffix(".ko")] = [Path(n).name.removesuffix(".ko")
                                                    for n in needs.split()]
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name not in deps:
            raise bed.BedError(f"the arm64 kernel has no module {name}")
        for need in deps[name]:
            visit(need)
        order.append(name)

    for name in wanted:
        visit(name)
    return tuple(order)


# --- the agent's dependencies ------------------------------------------------------------------

def requirements(pyproject: Path = bed.CHECKOUT / "pyproject.toml") -> list[str]:
    project = compat.tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    return [*project["dependencies"], *(r for e in EXTRAS for r in extras[e])]


def site(cache: Path, reqs: Sequence[str] | None = None, name: str = "site-arm64") -> Path:
    """A site-packages of aarch64 wheels for the guest's Python 3.11 (cached by the
    requirements: :func:`requirements` unless given); its wheels kept in
    ``qemu-wheels-arm64`` so a rebuild needs no network."""
    reqs = requirements() if reqs is None else list(reqs)
    key = hashlib.sha256(json.dumps({"reqs": reqs, "target": TARGET, "format": FORMAT})
                         .encode()).hexdigest()[:16]
    wheels = cache / "qemu-wheels-arm64"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]

    def build(out: Path) -> None:
        wheels.mkdir(parents=True, exist_ok=True)
        offline = [*pip, "install", "--no-index", "--find-links", str(wheels), "--no-compile",
                   "--target", str(out / "site"), *TARGET, *reqs]
        proc = subprocess.run(offline, capture_output=True, text=True, timeout=300,
                              check=False)
        if proc.returncode != 0:  # a wheel is missing: download them (once)
            _run([*pip, "download", "--dest", str(wheels), *TARGET, *reqs],
                 "downloading the arm64 wheels", 600)
            shutil.rmtree(out / "site", ignore_errors=True)
            _run(offline, "installing the arm64 wheels", 300)

    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "qemu-wheels-arm64.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one downloader into the wheel directory
        return _cached(cache, f"{name}-{key}", build) / "site"


# --- the image -----------------------------------------------------------------------------------

def image(cache: Path) -> bed.Image:
    """The arm64 guest: kernel, initramfs, root disk and site-packages (cached)."""
    began = time.monotonic()
    for program in ("qemu-system-aarch64", "mke2fs", "cpio", "debootstrap", "dpkg-deb",
                    "depmod"):
        if shutil.which(program) is None:
            raise bed.BedError(f"{program} is not installed (install.sh --dev installs "
                               "qemu-system-arm, kmod, cpio, e2fsprogs, debootstrap)")
    tree = rootfs(cache)
    packages = site(cache)
    (version,) = [p.name for p in (tree / "lib" / "modules").iterdir()]
    modules = boot_modules((tree / "lib" / "modules" / version / "modules.dep").read_text())
    inputs = json.dumps({"rootfs": tree.name, "format": bed.FORMAT, "init": bed.INITRAMFS_INIT,
                         "stage2": bed.STAGE2, "modules": modules}, sort_keys=True)
    name = f"qemu-arm64-{hashlib.sha256(inputs.encode()).hexdigest()[:16]}"
    final = _cached(cache, name, lambda out: bed.build(tree, out, tree / "usr" / "bin" /
                                                       "busybox", modules))
    built = {tree.name, packages.parent.name, name} & BUILT
    return bed.Image(final / "vmlinuz", final / "initrd.gz", final / "root.ext4",
                     time.monotonic() - began if built else 0.0, bed.ARM64, packages)
