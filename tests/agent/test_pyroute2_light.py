"""pyroute2 and aiohttp without their package __init__, and `edgeheal run` without the other
command groups: lighter (docs/footprint.md), and nothing else breaks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgeheal.cli import runs_agent

CODE = """
import sys
from edgeheal.boundaries.kernel import pyroute2_light as _pyroute2
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


RUN = """
import sys
import edgeheal.agent.supervisor

def run_forever(config):  # what the agent imports before its first round, then stop
    import edgeheal.agent.http_server
    heavy = {"aiohttp.client", "aiohttp.connector", "aiohttp.cookiejar"}
    print(sorted(m for m in sys.modules
                 if m in heavy or m.startswith("edgeheal.cli.")) or "light-ok")
    import aiohttp   # other code may still use the package's names
    print("full-ok" if aiohttp.ClientSession and "aiohttp.connector" in sys.modules
          else "full-missing")

edgeheal.agent.supervisor.run_forever = run_forever
from edgeheal.cli import main
sys.exit(main(["--config", sys.argv[1], "run"]))
"""


def test_run_loads_neither_the_http_client_nor_the_other_command_groups(
        tmp_path: Path) -> None:
    cfg = tmp_path / "edgeheal.toml"
    cfg.write_text(f'[agent]\nstate_dir = "{tmp_path}/state"\n[offload]\ninterfaces = ["lo"]\n')
    out = subprocess.run([sys.executable, "-c", RUN, str(cfg)], capture_output=True,
                         text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["light-ok", "full-ok"]


@pytest.mark.parametrize(("argv", "agent"), [
    (["run"], True), (["--config", "x.toml", "run"], True), (["--config=x.toml", "run"], True),
    (["run", "--help"], True), (["-h", "run"], False), (["--version"], False),
    (["status"], False), (["lab", "run"], False), (["--config", "run"], False), ([], False),
])
def test_only_the_agent_command_skips_the_command_groups(argv: list[str], agent: bool) -> None:
    assert runs_agent(argv) is agent


KUBE = """
import sys
from edgeheal.config import KubernetesSettings
from edgeheal.boundaries.kube import KubeClient

KubeClient(KubernetesSettings(kubeconfig=sys.argv[1]))._client()
loaded = "lightkube.config.client_adapter" in sys.modules
print("light-ok" if loaded and "lightkube.core.async_client" not in sys.modules else "heavy")
import lightkube   # other code may still use the package's names
print("full-ok" if lightkube.AsyncClient else "full-missing")
"""

KUBECONFIG = """\
apiVersion: v1
kind: Config
current-context: edge
clusters: [{name: edge, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: edge, user: {token: "t0ken-for-a-test"}}]
contexts: [{name: edge, context: {cluster: edge, user: edge}}]
"""


def test_the_kubernetes_client_loads_lightkube_without_its_own_clients(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    out = subprocess.run([sys.executable, "-c", KUBE, str(kubeconfig)], capture_output=True,
                         text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["light-ok", "full-ok"]
