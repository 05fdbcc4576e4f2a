"""A real Linux kernel for the tests: Debian 12's kernel booted under QEMU (software
emulation, TCG), with the checkout and this interpreter's site-packages shared read-only.

Why: the machines that run the suite have no WireGuard module and only veth NICs. Field
nodes run K3s's ``wireguard-native`` backend (kernel WireGuard) over real NIC drivers that
re-enumerate. This bed boots the kernel the nodes run and lets a test drive it.

- :func:`image` builds the guest once and caches it by input hash next to the systemd
  tests' container (``$EDGEHEAL_TEST_CACHE``, default ``/var/cache/edgeheal-test``): a
  debootstrap minbase tree with the kernel and tools (:data:`PACKAGES`), turned into an ext4
  disk image and a tiny busybox initramfs that loads the block/ext4 modules and switches to
  the disk. Built under a lock, renamed into place when complete.
- :class:`VM` boots it with ``-snapshot`` (the cached disk is never written), ``-nic none``
  plus only the NICs a test asks for, all on taps inside a network namespace the caller
  made (or hubs that go nowhere), a virtio-serial command channel to a small guest agent
  (``tests/qemu/guest.py``: run a command, get exit code and output) and QMP for hotplug.
  :meth:`VM.close` kills QEMU and removes its files, also after a failure.

KVM is not used: on the test machines ``/dev/kvm`` is a paravirtual hypervisor that cannot
run a stock kernel; TCG boots in ~15 s.

The same bed boots Debian 12's arm64 kernel (:data:`ARM64`: ``qemu-system-aarch64 -M virt``,
TCG); its image and site-packages come from ``tests/qemu/arm64.py``.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import gzip
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeheal.base import compat
from edgeheal.lab import nspawn

CHECKOUT = Path(__file__).resolve().parents[2]
PACKAGES = ("linux-image-amd64", "python3", "wireguard-tools", "iproute2", "ethtool", "udev",
            "nftables", "kmod", "iputils-ping", "mosquitto")
FORMAT = 1
"""Bump when the image's layout or the init scripts below change."""
BOOT_MODULES = ("virtio", "virtio_ring", "virtio_pci_legacy_dev", "virtio_pci_modern_dev",
                "virtio_pci", "virtio_blk", "crc16", "mbcache", "jbd2", "crc32c_generic",
                "ext4")
"""What the initramfs loads (in order) to mount the root disk; the rest is modprobed."""
SRC, SITE = "/mnt/src", "/mnt/site"
CHANNEL = "edgeheal.cmd"

INITRAMFS_INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules); do insmod /lib/$m.ko || echo "initramfs: insmod $m failed"; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
mount -t ext4 /dev/vda /newroot || { echo "initramfs: cannot mount /dev/vda"; poweroff -f; }
cp /stage2 /newroot/sbin/edgeheal-stage2
chmod 755 /newroot/sbin/edgeheal-stage2
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/edgeheal-stage2
"""

STAGE2 = f"""#!/bin/sh
# edgeheal test bed, PID 1 in the guest: mount, start udev, run the command agent.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mkdir -p /dev/pts /dev/shm {SRC} {SITE}
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /dev/shm
hostname edgeheal-guest
modprobe -a 9p 9pnet_virtio virtio_console
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 src {SRC}
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 site {SITE}
ip link set lo up
/lib/systemd/systemd-udevd --daemon
udevadm trigger --action=add
udevadm settle --timeout=30
export PYTHONPATH={SRC}:{SITE} PYTHONDONTWRITEBYTECODE=1
exec python3 {SRC}/tests/qemu/guest.py
"""


class BedError(Exception):
    """Building, booting or talking to the guest failed; the message says which step."""


# --- the image -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Arch:
    """What differs between the guests: the emulator, its board, the kernel's console."""

    name: str
    """Debian's name: amd64, arm64."""
    machine: str
    """``uname -m`` in the guest."""
    qemu: str
    board: tuple[str, ...]
    console: str
    usb: bool
    """A USB controller (``-usb``): the amd64 bed's usb-net hangs on it."""


AMD64 = Arch("amd64", "x86_64", "qemu-system-x86_64", ("-M", "pc", "-cpu", "max"), "ttyS0",
             usb=True)
ARM64 = Arch("arm64", "aarch64", "qemu-system-aarch64",
             # pauth-impdef: the CPU's pointer authentication with QEMU's own cheap hash
             # instead of the architected QARMA (QEMU's docs, "Arm CPU Features"): the boot
             # took 28 s without it, 9-13 s with it (docs/testbed.md)
             ("-M", "virt", "-cpu", "max,pauth-impdef=on"), "ttyAMA0", usb=False)


@dataclass(frozen=True, slots=True)
class Image:
    kernel: Path
    initrd: Path
    disk: Path
    build_seconds: float = 0.0
    """0 when it came from the cache."""
    arch: Arch = AMD64
    site: Path | None = None
    """The site-packages the guest imports the agent's dependencies from (None: this
    interpreter's, see :func:`site_packages`)."""


def image_key(rootfs: Path) -> str:
    inputs = json.dumps({"rootfs": rootfs.name, "format": FORMAT, "init": INITRAMFS_INIT,
                         "stage2": STAGE2, "modules": BOOT_MODULES}, sort_keys=True)
    return f"qemu-{hashlib.sha256(inputs.encode()).hexdigest()[:16]}"


def image(cache: Path) -> Image:
    """The cached guest image; built (once, ~2.5 min cold of which ~2 min debootstrap) if
    missing."""
    began = time.monotonic()
    for program in ("qemu-system-x86_64", "mke2fs", "cpio", "debootstrap"):
        if shutil.which(program) is None:
            raise BedError(f"{program} is not installed (install.sh --dev installs "
                           "qemu-system-x86, qemu-utils, busybox-static, cpio, debootstrap)")
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        raise BedError("busybox is not installed (apt-get install busybox-static)")
    rootfs = nspawn.debian_rootfs(cache, packages=PACKAGES)
    final = cache / image_key(rootfs)
    with (cache / f"{final.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "done").exists():
            partial = cache / f"{final.name}.partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            try:
                build(rootfs, partial, busybox)
                (partial / "done").write_text("")
                shutil.rmtree(final, ignore_errors=True)
                partial.rename(final)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
            built = time.monotonic() - began
        else:
            built = 0.0
    return Image(final / "vmlinuz", final / "initrd.gz", final / "root.ext4", built)


def build(rootfs: Path, out: Path, busybox: Path,
           boot_modules: Sequence[str] = BOOT_MODULES) -> None:
    """The kernel, the initramfs (``busybox``, ``boot_modules`` in load order, the scripts)
    and the ext4 root disk, from ``rootfs``, into ``out``."""
    (kernel,) = sorted((rootfs / "boot").glob("vmlinuz-*"))
    version = kernel.name.removeprefix("vmlinuz-")
    shutil.copy2(kernel, out / "vmlinuz")
    # the initramfs: busybox, the modules to mount the disk, the two scripts
    with tempfile.TemporaryDirectory(prefix="edgeheal-initrd-") as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        (root / "lib").mkdir()
        shutil.copy2(busybox, root / "bin" / "busybox")
        (root / "bin" / "sh").symlink_to("busybox")
        mods = rootfs / "lib" / "modules" / version
        index = {Path(line.split(":")[0]).name.removesuffix(".ko"): line.split(":")[0]
                 for line in (mods / "modules.dep").read_text().splitlines()}
        for name in boot_modules:
            if name not in index:
                raise BedError(f"kernel {version} has no module {name}")
            shutil.copy2(mods / index[name], root / "lib" / f"{name}.ko")
        (root / "modules").write_text("\n".join(boot_modules) + "\n")
        (root / "init").write_text(INITRAMFS_INIT)
        (root / "init").chmod(0o755)
        (root / "stage2").write_text(STAGE2)
        files = subprocess.run(["find", ".", "-mindepth", "1"], cwd=root, check=True,
                               capture_output=True, text=True).stdout
        cpio = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc"], cwd=root, check=True,
                              input=files.encode(), capture_output=True).stdout
        (out / "initrd.gz").write_bytes(gzip.compress(cpio, compresslevel=6))
    # the root disk: the tree as ext4; the VM writes only to a -snapshot overlay
    size_mb = int(_du_mb(rootfs) * 1.4) + 256
    proc = subprocess.run(["mke2fs", "-q", "-t", "ext4", "-L", "edgeheal-guest", "-d",
                           str(rootfs), str(out / "root.ext4"), f"{size_mb}M"],
                          capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode != 0:
        raise BedError(f"mke2fs failed: {proc.stderr.strip()}")


def _du_mb(path: Path) -> int:
    out = subprocess.run(["du", "-sm", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


# --- the VM ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Result:
    rc: int
    out: str
    err: str

    def check(self, what: str = "") -> Result:
        if self.rc != 0:
            raise BedError(f"guest command {what} -> exit {self.rc}: {self.err[-2000:]}"
                           f"{self.out[-1000:]}")
        return self


def site_packages() -> Path:
    """This interpreter's site-packages: the guest's Python (Debian 12's 3.11) imports the
    agent's dependencies from it, read-only. Same minor version required."""
    return Path(sysconfig.get_paths()["purelib"])


@dataclass
class VM:
    """One booted guest. ``netns``: the caller's network namespace QEMU runs in (its taps
    live and die there). ``devices``: extra QEMU arguments (NICs)."""

    img: Image
    netns: str | None = None
    devices: Sequence[str] = ()
    memory_mb: int = 512
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="edgeheal-vm-")))
    process: subprocess.Popen[bytes] | None = None
    boot_seconds: float = 0.0
    _chan: socket.socket | None = None
    _buf: bytes = b""
    _qmp: socket.socket | None = None
    _qbuf: bytes = b""
    _seq: int = 0

    @property
    def console(self) -> Path:
        return self.workdir / "console.log"

    def boot(self, timeout: float = 240.0) -> float:
        arch, site = self.img.arch, self.img.site
        if site is None and sys.version_info[:2] != (3, 11):
            raise BedError(f"the guest runs Debian 12's Python 3.11; this is "
                           f"{sys.version_info[0]}.{sys.version_info[1]}: its site-packages "
                           "cannot be shared")
        chan, qmp = self.workdir / "chan.sock", self.workdir / "qmp.sock"
        argv = [arch.qemu, *arch.board, "-accel", "tcg,thread=multi,tb-size=256",
                "-smp", "1", "-m", str(self.memory_mb), "-snapshot",
                "-no-reboot", "-display", "none", "-vga", "none", "-nic", "none",
                "-kernel", str(self.img.kernel), "-initrd", str(self.img.initrd),
                "-append", f"console={arch.console} panic=-1 quiet loglevel=4 net.ifnames=1",
                "-drive", f"file={self.img.disk},format=raw,if=virtio,readonly=off",
                "-serial", f"file:{self.console}",
                "-virtfs", f"local,path={CHECKOUT},mount_tag=src,security_model=none,readonly=on",
                "-virtfs", (f"local,path={site or site_packages()},mount_tag=site,"
                            "security_model=none,readonly=on"),
                "-device", "virtio-serial-pci,id=vser",
                "-chardev", f"socket,id=ch,path={chan},server=on,wait=off",
                "-device", f"virtserialport,chardev=ch,name={CHANNEL}",
                "-qmp", f"unix:{qmp},server=on,wait=off",
                *(["-usb"] if arch.usb else []), *self.devices]
        if self.netns:
            argv = ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]
        began = time.monotonic()
        with (self.workdir / "qemu.log").open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self._chan = self._connect(chan, began + 30)
        self._qmp = self._connect(qmp, began + 30)
        self._qmp_read()  # greeting
        self.qmp("qmp_capabilities")
        deadline = began + timeout
        while True:
            line = self._readline(deadline)
            if line.get("ready"):
                break
        self.boot_seconds = time.monotonic() - began
        return self.boot_seconds

    def _connect(self, path: Path, deadline: float) -> socket.socket:
        while True:
            self._alive()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(path))
            except OSError:
                sock.close()
                if time.monotonic() > deadline:
                    raise BedError(f"QEMU did not open {path.name}: {self._tail()}") from None
                time.sleep(0.1)
            else:
                return sock

    def _alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise BedError(f"QEMU exited ({self.process.returncode}): {self._tail()}")

    def _tail(self) -> str:
        parts = []
        for f in (self.workdir / "qemu.log", self.console):
            with contextlib.suppress(OSError):
                parts.append(f"{f.name}: {f.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def _readline(self, deadline: float) -> dict[str, Any]:
        assert self._chan is not None
        while b"\n" not in self._buf:
            self._alive()
            left = deadline - time.monotonic()
            if left <= 0:
                raise BedError(f"no answer from the guest agent in time: {self._tail()}")
            self._chan.settimeout(min(left, 1.0))
            try:
                chunk = self._chan.recv(65536)
            except compat.TimeoutErrors:
                continue
            if not chunk:
                raise BedError(f"the guest channel closed: {self._tail()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return dict(json.loads(line))
        except ValueError:
            return {}  # noise before the agent started

    def run(self, argv: Sequence[str] | str, *, timeout: float = 60.0,
            stdin: str = "") -> Result:
        """Run ``argv`` (a list, or a string for ``sh -c``) in the guest."""
        assert self._chan is not None, "not booted"
        self._seq += 1
        req = {"id": self._seq, "argv": list(argv) if not isinstance(argv, str) else
               ["sh", "-c", argv], "timeout": timeout, "stdin": stdin}
        self._chan.sendall(json.dumps(req).encode() + b"\n")
        deadline = time.monotonic() + timeout + 15
        while True:
            ans = self._readline(deadline)
            if ans.get("id") == self._seq:
                return Result(int(ans["rc"]), base64.b64decode(ans["out"]).decode(errors="replace"),
                              base64.b64decode(ans["err"]).decode(errors="replace"))

    def sh(self, script: str, *, timeout: float = 60.0) -> str:
        return self.run(script, timeout=timeout).check(script[:80]).out

    def python(self, code: str, *, timeout: float = 60.0) -> Result:
        return self.run(["python3", "-c", code], timeout=timeout)

    # --- QMP -------------------------------------------------------------------------------

    def _qmp_read(self, deadline: float | None = None) -> dict[str, Any]:
        assert self._qmp is not None
        deadline = deadline or time.monotonic() + 30
        while b"\n" not in self._qbuf:
            self._alive()
            self._qmp.settimeout(max(0.1, min(deadline - time.monotonic(), 1.0)))
            try:
                chunk = self._qmp.recv(65536)
            except compat.TimeoutErrors:
                if time.monotonic() > deadline:
                    raise BedError("QMP did not answer") from None
                continue
            if not chunk:
                raise BedError(f"QMP closed: {self._tail()}")
            self._qbuf += chunk
        line, self._qbuf = self._qbuf.split(b"\n", 1)
        return dict(json.loads(line))

    def qmp(self, command: str, **arguments: Any) -> Any:
        assert self._qmp is not None
        msg: dict[str, Any] = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        self._qmp.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            ans = self._qmp_read()
            if "return" in ans:
                return ans["return"]
            if "error" in ans:
                raise BedError(f"QMP {command} {arguments}: {ans['error']}")
            # an asynchronous event: ignored here

    def events(self, within: float = 0.0) -> Iterator[dict[str, Any]]:
        """QMP events already received (and those arriving ``within`` seconds)."""
        deadline = time.monotonic() + within
        while True:
            try:
                ans = self._qmp_read(deadline)
            except BedError:
                return
            if "event" in ans:
                yield ans

    def close(self) -> None:
        for sock in (self._chan, self._qmp):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        self._chan = self._qmp = None
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)
