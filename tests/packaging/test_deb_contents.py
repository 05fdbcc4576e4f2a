"""What the packages hold, for both architectures (arm64's cannot run here: this is its proof),
and what lintian says of them."""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.packaging.conftest import CHECKOUT

pytestmark = [pytest.mark.slow]

ELF_MACHINE = {"amd64": "Advanced Micro Devices X86-64", "arm64": "AArch64"}
DEPENDENCIES = ("aiohttp", "prometheus_client", "pyroute2", "paho_mqtt", "lightkube",
                "dbus_fast")
SITE = "opt/edgeheal/lib/python3.11/site-packages"


def field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "--field", str(deb), name], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture(scope="module", params=["release", "other"])
def unpacked(request: pytest.FixtureRequest, debs: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    deb = debs[request.param]
    root = tmp_path_factory.mktemp(f"unpacked-{request.param}")
    subprocess.run(["dpkg-deb", "--extract", str(deb), str(root)], check=True)
    subprocess.run(["dpkg-deb", "--control", str(deb), str(root / "DEBIAN")], check=True)
    return deb, root


def test_the_package_is_the_release_for_its_architecture(unpacked: tuple[Path, Path]) -> None:
    deb, _ = unpacked
    arch = field(deb, "Architecture")
    assert deb.name == f"edgeheal_0.2.0_{arch}.deb"
    assert field(deb, "Version") == "0.2.0"
    depends = field(deb, "Depends")
    assert "python3 (>= 3.11~), python3 (<< 3.12), python3.11" in depends
    assert "systemd" in depends
    assert "libc6 (>= 2." in depends
    assert "pip" not in depends


def test_every_shared_object_is_for_the_packages_machine(unpacked: tuple[Path, Path]) -> None:
    deb, root = unpacked
    arch = field(deb, "Architecture")
    objects = [p for p in (root / SITE).rglob("*.so*") if p.is_file()]
    assert len(objects) > 10, "no compiled modules: the wheels were not bundled"
    for obj in objects:
        header = subprocess.run(["readelf", "-h", str(obj)], capture_output=True, text=True,
                                check=True).stdout
        machine = re.search(r"Machine:\s+(.*)", header)
        assert machine, obj
        assert machine.group(1).strip() == ELF_MACHINE[arch], obj
        sections = subprocess.run(["readelf", "-S", str(obj)], capture_output=True,
                                  text=True, check=True).stdout
        assert ".symtab" not in sections, f"{obj} is not stripped"


def test_the_venv_holds_the_dependencies_and_this_checkouts_code(
        unpacked: tuple[Path, Path]) -> None:
    _, root = unpacked
    site = root / SITE
    for dist in DEPENDENCIES:
        assert list(site.glob(f"{dist}-*.dist-info")), f"{dist} is not bundled"
    assert not list(site.glob("pip")), "no pip on the node"
    assert not list(site.glob("setuptools"))
    assert not list(root.rglob("__pycache__"))
    assert not list(root.rglob("*.pyc"))
    for source in (CHECKOUT / "edgeheal").rglob("*.py"):
        packaged = site / source.relative_to(CHECKOUT)
        assert packaged.exists(), packaged
        assert hashlib.sha256(packaged.read_bytes()).digest() == \
            hashlib.sha256(source.read_bytes()).digest(), packaged
    assert (root / "opt/edgeheal/bin/python3").readlink() == Path("/usr/bin/python3.11")
    assert (root / "usr/bin/edgeheal").readlink() == Path("/opt/edgeheal/bin/edgeheal")
    assert (root / "opt/edgeheal/bin/edgeheal").read_text().startswith(
        "#!/opt/edgeheal/bin/python3\n")


def test_the_units_are_the_checkouts_with_the_packages_path(unpacked: tuple[Path, Path]) -> None:
    _, root = unpacked
    for unit in ("edgeheal.service", "edgeheal-offload.service"):
        packaged = (root / "lib/systemd/system" / unit).read_text()
        checkout = (CHECKOUT / "systemd" / unit).read_text()
        assert "/usr/local/bin" in checkout
        assert packaged == checkout.replace("/usr/local/bin", "/usr/bin")
        assert "ExecStart=/usr/bin/edgeheal " in packaged


def test_configuration_polkit_and_examples_are_where_each_is_read(
        unpacked: tuple[Path, Path]) -> None:
    _, root = unpacked
    assert (root / "DEBIAN/conffiles").read_text().split() == ["/etc/edgeheal/edgeheal.toml"]
    assert (root / "etc/edgeheal/edgeheal.toml").read_bytes() == \
        (CHECKOUT / "edgeheal.example.toml").read_bytes()
    rules = sorted(p.name for p in (root / "usr/share/polkit-1/rules.d").iterdir())
    assert rules == ["49-edgeheal-uplink.rules", "50-edgeheal-k3s-restart.rules"]
    pkla = sorted(p.name for p in
                  (root / "var/lib/polkit-1/localauthority/10-vendor.d").iterdir())
    assert pkla == ["49-edgeheal-uplink.pkla"]
    examples = {p.name for p in (root / "usr/share/doc/edgeheal/examples").iterdir()}
    assert {"49-edgeheal-reboot.rules", "49-edgeheal-reboot.pkla",
            "50-edgeheal-k3s-restart.pkla"} <= examples
    # the reboot grant is opt-in: an example only
    grants = [p for p in root.rglob("*reboot*") if "site-packages" not in p.parts]
    assert [p.parent.name for p in grants] == ["examples", "examples"]
    assert (root / "usr/lib/sysusers.d/edgeheal.conf").exists()
    assert "deb-systemd-helper" in (root / "DEBIAN/postinst").read_text()


def test_a_pkla_grants_what_its_rule_grants(unpacked: tuple[Path, Path]) -> None:
    """polkit 0.105's format (pklocalauthority(8)): one section per grant, Identity and
    Action, a Result for each kind of session. The action is the one the .rules file names."""
    _, root = unpacked
    pairs = [(root / "var/lib/polkit-1/localauthority/10-vendor.d/49-edgeheal-uplink.pkla",
              CHECKOUT / "systemd/49-edgeheal-uplink.rules"),
             (root / "usr/share/doc/edgeheal/examples/49-edgeheal-reboot.pkla",
              CHECKOUT / "systemd/49-edgeheal-reboot.rules"),
             (root / "usr/share/doc/edgeheal/examples/50-edgeheal-k3s-restart.pkla",
              CHECKOUT / "systemd/50-edgeheal-k3s-restart.rules")]
    for pkla, rule in pairs:
        lines = [ln for ln in pkla.read_text().splitlines() if ln and not ln.startswith("#")]
        assert re.fullmatch(r"\[[^]]+\]", lines[0]), pkla
        starts = [i for i, ln in enumerate(lines) if ln.startswith("[")]
        for start, end in zip(starts, [*starts[1:], len(lines)], strict=True):
            keys = dict(ln.split("=", 1) for ln in lines[start + 1:end])
            assert keys == {"Identity": "unix-user:edgeheal", "Action": keys["Action"],
                            "ResultAny": "yes", "ResultInactive": "yes",
                            "ResultActive": "yes"}
            assert f'"{keys["Action"]}"' in rule.read_text(), (pkla, rule)


def test_lintian_finds_nothing(debs: dict[str, Path]) -> None:
    """--pedantic --display-info: every tag it would show is fixed or overridden, with the
    reason next to the override (debian/edgeheal.lintian-overrides)."""
    proc = subprocess.run(["lintian", "--pedantic", "--display-info", "--fail-on", "none",
                           str(debs["release"]), str(debs["other"])],
                          capture_output=True, text=True, timeout=900, check=False)
    tags = [ln for ln in proc.stdout.splitlines() if re.match(r"^[EWIPX]: ", ln)]
    assert not tags, proc.stdout[-3000:]
    assert proc.returncode == 0, proc.stderr[-1000:]
