"""The container harness itself: the mirror comes from apt's sources, a closed container
leaves nothing behind, and one whose test process was SIGKILLed is swept by the next run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeheal.lab import nspawn
from edgeheal.lab.netns import Sandbox

ONE_LINE = "deb http://mirror.test/debian bookworm main contrib\n"
DEB822 = """\
Types: deb
URIs: http://mirror.test/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://security.test/debian-security
Suites: bookworm-security
Components: main
"""


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("sources.list", ONE_LINE, "http://mirror.test/debian"),
    ("sources.list", "deb [arch=amd64 signed-by=/k.gpg] http://m.test/d bookworm main\n",
     "http://m.test/d"),
    ("sources.list.d/debian.sources", DEB822, "http://mirror.test/debian"),
    ("sources.list.d/other.sources",
     DEB822.replace("Types: deb\nURIs: http://mirror", "Types: deb\nEnabled: no\nURIs: "
                    "http://mirror"), None),
    ("sources.list", "deb http://mirror.test/debian bookworm contrib\n", None),
    ("sources.list", "# deb http://mirror.test/debian bookworm main\n", None),
    ("sources.list", "deb http://ubuntu.test/ubuntu jammy main\n", None),
])
def test_the_mirror_is_read_from_apt_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             name: str, text: str,
                                             expected: str | None) -> None:
    monkeypatch.delenv(nspawn.MIRROR_ENV, raising=False)
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / name).write_text(text)
    if expected is None:
        with pytest.raises(nspawn.NspawnError, match=r"no Debian mirror for 'bookworm'"):
            nspawn.apt_mirror("bookworm", tmp_path)
    else:
        assert nspawn.apt_mirror("bookworm", tmp_path) == expected


def test_the_environment_overrides_the_mirror(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nspawn.MIRROR_ENV, "http://override.test/debian")
    assert nspawn.apt_mirror("bookworm", tmp_path) == "http://override.test/debian"


def test_the_cache_key_changes_with_every_input() -> None:
    base = nspawn.cache_key("bookworm", ("systemd", "dbus"))
    assert nspawn.cache_key("bookworm", ("dbus", "systemd")) == base  # order is no input
    assert nspawn.cache_key("bookworm", ("systemd",)) != base
    assert nspawn.cache_key("trixie", ("systemd", "dbus")) != base


def leftovers(workdir: Path, machine: str) -> list[str]:
    found = [f"mount {p}" for p in nspawn.mounts_under(workdir)]
    for path in (workdir, nspawn.NSPAWN_RUN / "propagate" / machine):
        if path.exists():
            found.append(f"directory {path}")
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"--machine={machine}".encode() in (
                    proc / "cmdline").read_bytes():
                found.append(f"process {proc.name}")
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_a_closed_container_leaves_nothing_behind(debian_rootfs: Path, sandbox: Sandbox,
                                                  tmp_path: Path) -> None:
    ns = sandbox.netns("l")
    box = nspawn.Container(lower=debian_rootfs, workdir=tmp_path / "c", netns=ns)
    try:
        box.boot(timeout=120)
        assert "host0" in box.run(["ip", "-o", "link"]).stdout
        assert nspawn.mounts_under(box.root)
    finally:
        box.close()
    assert leftovers(box.workdir, box.name) == []
    assert (debian_rootfs / "etc" / "os-release").exists()  # the cache was never touched


CHILD = """\
import sys
from pathlib import Path
from edgeheal.lab import nspawn
box = nspawn.Container(lower=Path(sys.argv[1]), workdir=Path(sys.argv[2]), netns=sys.argv[3])
box.boot(timeout=120)
print(box.name, flush=True)
sys.stdin.read()  # until killed
"""


@pytest.mark.slow
def test_a_container_of_a_killed_run_is_swept(debian_rootfs: Path, sandbox: Sandbox,
                                              tmp_path: Path) -> None:
    ns = sandbox.netns("k")
    workdir = tmp_path / "c"
    with subprocess.Popen([sys.executable, "-c", CHILD, str(debian_rootfs), str(workdir), ns],
                          stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
                          cwd=Path(__file__).resolve().parents[2]) as child:
        try:
            assert child.stdout is not None
            machine = child.stdout.readline().strip()  # the child gives up after 120 s
            assert machine.startswith("eh"), "the child did not boot a container"
        finally:
            child.kill()  # the run dies without cleaning up
            child.wait(10)
    assert leftovers(workdir, machine) != []
    deadline = time.monotonic() + 30
    removed: list[str] = []
    while machine not in removed and time.monotonic() < deadline:
        removed += nspawn.sweep()
    assert machine in removed
    assert leftovers(workdir, machine) == []
