"""Fixtures for the offload tests: a namespace per test with a veth pair whose TX checksum
offload is on (veth lets tx-checksum-ip-generic be toggled; ipv4/ipv6 are fixed off)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from edgeheal.lab import netns
from tests.offload.helpers import CSUM, ethtool_k


@dataclass
class Lab:
    sandbox: netns.Sandbox
    ns: str

    def veth(self, a: str, b: str, *, expect_on: bool = True) -> None:
        """A veth pair inside the namespace, both ends up, offload as the kernel makes it
        (on; ``expect_on=False`` when an enforcer may already have corrected it)."""
        netns.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], ns=self.ns)
        for name in (a, b):
            netns.run(["ip", "link", "set", name, "up"], ns=self.ns)
        if expect_on:
            assert ethtool_k(self.ns, a)["tx-checksum-ip-generic"].on, "veth starts with it on"

    def delete(self, name: str) -> None:
        netns.run(["ip", "link", "del", name], ns=self.ns)

    def checksums(self, ifname: str) -> dict[str, tuple[bool, bool]]:
        feats = ethtool_k(self.ns, ifname)
        return {n: (feats[n].on, feats[n].fixed) for n in CSUM}


@pytest.fixture
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    for program in ("ip", "ethtool"):
        if shutil.which(program) is None:
            pytest.skip(f"needs the {program} program")
    sandbox = netns.Sandbox()
    try:
        yield Lab(sandbox, sandbox.netns("o"))
    finally:
        sandbox.close()
