"""pyroute2 without its package __init__: lighter, and nothing else breaks."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
from edgeheal import _pyroute2
_pyroute2.light()
from pyroute2.ethtool.ioctl import IoctlEthtool
from pyroute2.iproute.linux import AsyncIPRoute
from pyroute2.netlink.generic.wireguard import wgmsg
heavy = [m for m in ("pyroute2.ipdb", "pyroute2.ndb", "pyroute2.conntrack") if m in sys.modules]
print("light-ok" if not heavy else f"heavy: {heavy}")
from pyroute2 import IPRoute, netns   # other code may still use the package's names
print("full-ok" if "pyroute2.ipdb" in sys.modules and IPRoute and netns else "full-missing")
"""


def test_the_agent_imports_only_the_parts_it_uses_and_the_package_still_works() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["light-ok", "full-ok"]
