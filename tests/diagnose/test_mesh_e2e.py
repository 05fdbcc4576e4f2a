"""End to end on a two-node wireguard-go mesh: a preshared-key mismatch is named as keys.

With a preshared key on one end only, the other end still accepts the initiation (the key
is mixed in only from the response on) and answers, but the initiator cannot open the
response: responses arrive, the handshake never completes. diagnose must say "keys", and
must never print the preshared key.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeheal.lab.netns import run
from edgeheal.lab.wireguard import WgMesh

pytestmark = [pytest.mark.slow, pytest.mark.netns]


@pytest.fixture
def mesh() -> Iterator[WgMesh]:
    with WgMesh(nodes=2, keepalive=1) as m:
        yield m


def test_responses_without_a_completed_handshake_point_at_the_keys(
        mesh: WgMesh, tmp_path: Path) -> None:
    a, b = mesh.nodes
    psk = run(["wg", "genpsk"]).stdout.strip()
    mesh.remove_peer(a, b)  # drop a's session; re-add the peer with the key in one step
    run(["wg", "set", a.ifname, "peer", b.public_key, "preshared-key", "/dev/stdin",
         "endpoint", mesh.endpoint(a, b), "allowed-ips", f"{b.overlay}/32",
         "persistent-keepalive", "1"], ns=a.ns, input=psk + "\n")
    config = tmp_path / "diagnose.toml"
    config.write_text(f'[wireguard]\ninterfaces = ["{a.ifname}"]\n')
    proc = subprocess.run(
        ["ip", "netns", "exec", a.ns, sys.executable, "-m", "edgeheal", "diagnose",
         "--config", str(config), "--interface", a.uplinks[1], "--seconds", "8", "--json"],
        capture_output=True, text=True, timeout=60, check=False)
    assert psk not in proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1, json.dumps(doc, indent=1)
    assert doc["verdict"]["code"] == "handshake_rejected", doc
    assert "keys" in doc["verdict"]["summary"]
    (peer,) = doc["peers"]
    assert peer["public_key"] == b.public_key
    assert peer["received"].get("response", 0) > 0
    assert peer["handshake_completed_during_capture"] is False
