"""Shared helpers for the offload tests: the independent `ethtool -k` reader, the CLI
runner, and a :class:`FeatureSource` backed by recorded `ethtool -k` outputs."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from edgeheal.boundaries.kernel.ethtool import Feature, NoSuchInterface, NotPermitted

FIXTURES = Path(__file__).parent / "fixtures"
CSUM = ("tx-checksum-ipv4", "tx-checksum-ip-generic", "tx-checksum-ipv6")
ETHTOOL_ALIASES = frozenset({
    "rx-checksumming", "tx-checksumming", "scatter-gather", "tcp-segmentation-offload",
    "udp-fragmentation-offload", "generic-segmentation-offload", "generic-receive-offload",
    "large-receive-offload", "rx-vlan-offload", "tx-vlan-offload", "ntuple-filters",
    "receive-hashing"})
"""Names `ethtool -k` prints that are the program's legacy groups, not kernel features."""

_LINE = re.compile(r"^\s*([A-Za-z0-9_-]+): (on|off)(?: \[([a-z ]+)\])?\s*$")


def parse_ethtool_k(text: str) -> dict[str, Feature]:
    """`ethtool -k` output (comment lines starting with '#' allowed) -> features."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or line.startswith("Features for"):
            continue
        m = _LINE.match(line)
        assert m, f"unparsable ethtool -k line: {line!r}"
        out[m.group(1)] = Feature(m.group(1), m.group(2) == "on", m.group(3) == "fixed")
    return out


def fixture(name: str) -> dict[str, Feature]:
    return parse_ethtool_k((FIXTURES / f"{name}.txt").read_text(encoding="utf-8"))


def ethtool_k(ns: str, ifname: str) -> dict[str, Feature]:
    """The independent witness: the `ethtool` program, not the code under test."""
    proc = subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-k", ifname],
                          capture_output=True, text=True, check=True, timeout=10)
    return parse_ethtool_k(proc.stdout)


def set_feature(ns: str, ifname: str, feature: str, state: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-K", ifname, feature, state],
                   capture_output=True, text=True, check=True, timeout=10)


def edgeheal(ns: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m edgeheal ARGS` inside namespace ``ns``."""
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "edgeheal", *args],
                          capture_output=True, text=True, check=False, timeout=timeout)


def write_config(path: Path, interfaces: Iterable[str], extra: str = "",
                 features: Iterable[str] | None = None) -> Path:
    lines = ["[offload]", "interfaces = [" + ", ".join(f'"{i}"' for i in interfaces) + "]"]
    if features is not None:
        lines.append("features = [" + ", ".join(f'"{f}"' for f in features) + "]")
    path.write_text("\n".join(lines) + "\n" + extra, encoding="utf-8")
    return path


class FixtureSource:
    """A :class:`~edgeheal.boundaries.kernel.ethtool.FeatureSource` over recorded feature sets.

    ``disable`` turns changeable features off, except those in ``sticky`` (a driver that
    accepts the request but keeps the feature on); ``deny`` raises EPERM like a process
    without CAP_NET_ADMIN.
    """

    def __init__(self, interfaces: Mapping[str, Mapping[str, Feature]], *,
                 sticky: Iterable[str] = (), deny: bool = False) -> None:
        self.state = {n: dict(f) for n, f in interfaces.items()}
        self.sticky, self.deny = set(sticky), deny
        self.disabled: list[tuple[str, tuple[str, ...]]] = []

    def interfaces(self) -> list[str]:
        return list(self.state)

    def features(self, ifname: str) -> Mapping[str, Feature]:
        if ifname not in self.state:
            raise NoSuchInterface(f"{ifname}: no such interface", interface=ifname)
        return dict(self.state[ifname])

    def disable(self, ifname: str, names: Iterable[str]) -> None:
        if self.deny:
            raise NotPermitted(f"{ifname}: needs CAP_NET_ADMIN", interface=ifname)
        wanted = tuple(names)
        self.disabled.append((ifname, wanted))
        for name in wanted:
            f = self.state[ifname][name]
            if not f.fixed and name not in self.sticky:
                self.state[ifname][name] = Feature(name, False, False)

    def turn_on(self, ifname: str, name: str) -> None:
        self.state[ifname][name] = Feature(name, True, False)
