"""``edgeheal doctor`` end to end, run as a program inside a lab edge: a real wireguard-go
tunnel to a cloud namespace running Mosquitto (and, for one test, the test Kubernetes API),
the edge's uplink a veth. One lab for the module; each test changes one thing and puts it
back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from edgeheal.base import compat
from edgeheal.lab import nsutil
from edgeheal.lab.kubeapi import FakeKube
from edgeheal.lab.mosquitto import Mosquitto
from edgeheal.lab.netns import run
from edgeheal.lab.wireguard import WgMesh, WgNode
from tests.agent.support import validate

pytestmark = [pytest.mark.netns, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
FLANNEL_NS = "kube-flannel"
USER = "system:serviceaccount:kube-flannel:edgeheal-edge"


@dataclass
class Lab:
    mesh: WgMesh
    edge: WgNode
    cloud: WgNode
    broker: Mosquitto
    workdir: Path

    @property
    def uplink(self) -> str:
        return self.edge.uplinks[self.cloud.index]

    @property
    def cloud_ip(self) -> str:
        return self.cloud.underlay[self.edge.index]

    def config(self, extra: str = "", *, mode: str = "none") -> Path:
        state = self.workdir / "state"
        state.mkdir(exist_ok=True)
        path = self.workdir / "edgeheal.toml"
        path.write_text(f"""
[agent]
node_name = "edge"
state_dir = "{state}"
[offload]
interfaces = ["{self.uplink}"]
[wireguard]
interfaces = ["{self.edge.ifname}"]
[[mqtt.targets]]
name = "broker-tunnel"
host = "{self.cloud.overlay}"
port = {self.broker.port}
path = "tunnel"
[[mqtt.targets]]
name = "broker-direct"
host = "{self.cloud_ip}"
port = {self.broker.port}
path = "direct"
[remediation]
mode = "{mode}"
{extra}""", encoding="utf-8")
        return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    workdir = tmp_path_factory.mktemp("doctor")
    mesh = WgMesh(2, keepalive=5, log_dir=workdir)
    try:
        edge, cloud = mesh.nodes
        broker = Mosquitto(mesh.sandbox, workdir, ns=cloud.ns, host="0.0.0.0")
        broker.start()
        mesh.set_tx_offload(edge, on=False)
        mesh.wait_handshake(edge, cloud)
        yield Lab(mesh, edge, cloud, broker, workdir)
    finally:
        mesh.close()


async def doctor(lab: Lab, config: Path, *args: str, clock: str = "synced",
                 ) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "EDGEHEAL_TEST_CLOCK": clock,
           # no systemd here: the service checks must say so, whatever the host has
           "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={lab.workdir / 'no-bus'}"}
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", lab.edge.ns, sys.executable, "-m", "tests.doctor.rundoctor",
        "doctor", "--json", "--config", str(config), *args, cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    except compat.TimeoutErrors:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode in (0, 1), err.decode()
    doc = json.loads(out)
    validate(doc, "doctor.schema.json")
    assert doc["exit_code"] == proc.returncode
    return proc.returncode, doc


def rows(doc: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["check"] == check]


async def test_a_healthy_lab_edge_is_all_green(lab: Lab) -> None:
    code, doc = await doctor(lab, lab.config())
    bad = [f for f in doc["findings"] if f["result"] not in ("ok", "skip")]
    assert (code, bad) == (0, [])
    ok = {f["check"] for f in doc["findings"] if f["result"] == "ok"}
    assert {"config", "config.files", "wireguard.available", "wireguard.interfaces",
            "wireguard.keepalive", "wireguard.route", "mtu", "offload", "time",
            "state.dir", "state.outbox", "mqtt.tunnel", "mqtt.direct"} <= ok
    (mtu,) = rows(doc, "mtu")
    assert mtu["detail"] == {"interface": lab.edge.ifname, "mtu": 1420, "uplink": lab.uplink,
                             "uplink_mtu": 1500, "overhead": 60}
    assert rows(doc, "service")[0]["result"] == "skip"
    assert list((lab.workdir / "state").iterdir()) == []  # read-only: nothing left behind


async def test_an_mtu_too_large_for_the_uplink_is_the_first_thing_it_says(lab: Lab) -> None:
    run(["ip", "link", "set", lab.uplink, "mtu", "1400"], ns=lab.edge.ns)
    # like an LTE network: nothing above its MTU gets through, fragments included
    lab.mesh.sandbox.nft(lab.cloud.ns, "table inet doctor_mtu {\n chain in { type filter "
                         "hook input priority -10; policy accept;\n"
                         "  ip frag-off & 0x3fff != 0 counter drop\n }\n}\n")
    try:
        code, doc = await doctor(lab, lab.config(), "--probe-mtu")
    finally:
        run(["ip", "link", "set", lab.uplink, "mtu", "1500"], ns=lab.edge.ns)
        run(["nft", "delete", "table", "inet", "doctor_mtu"], ns=lab.cloud.ns, check=False)
    assert code == 1
    first, second = doc["findings"][:2]
    assert (first["check"], first["result"]) == ("mtu", "fail")
    assert "1420 + 60 = 1480 > " in first["found"]
    assert "at most 1340" in first["fix"]
    assert (second["check"], second["result"]) == ("mtu.probe", "fail")
    assert 1340 - 8 <= second["detail"]["largest"] <= 1340, second
    assert second["detail"]["sizes"] <= 12
    assert "set the tunnel MTU to" in second["fix"]


async def test_a_peer_without_persistent_keepalive_warns(lab: Lab) -> None:
    def keepalive(value: str) -> None:
        run(["wg", "set", lab.edge.ifname, "peer", lab.cloud.public_key,
             "persistent-keepalive", value], ns=lab.edge.ns)

    keepalive("off")
    try:
        code, doc = await doctor(lab, lab.config())
    finally:
        keepalive("5")
    (found,) = rows(doc, "wireguard.keepalive")
    assert found["result"] == "warn"
    assert lab.cloud.public_key[:8] in found["found"]
    assert "PersistentKeepaliveInterval" in found["fix"]
    assert code == 0  # a warning, not a failure


async def test_a_clock_marked_unsynchronized_warns(lab: Lab) -> None:
    code, doc = await doctor(lab, lab.config(), clock="unsynced")
    (found,) = rows(doc, "time")
    assert found["result"] == "warn"
    assert "unsynchronized" in found["found"]
    assert "NTP" in found["fix"]
    assert code == 0


async def test_a_kubeconfig_without_delete_rights_fails_naming_it(lab: Lab) -> None:
    api = FakeKube()
    api._server_cert = api.ca.issue_cert("127.0.0.1", lab.cloud_ip)
    api.add_node("edge")
    creds = api.add_user(USER)
    api.allow_agent(USER, FLANNEL_NS)
    api.deny(USER, "delete", "pods", FLANNEL_NS)
    with nsutil.inside(lab.cloud.ns):
        url = await api.start(host="0.0.0.0")
    try:
        path = api.write_kubeconfig(lab.workdir / "kubeconfig", creds)
        doc = yaml.safe_load(path.read_text())
        doc["clusters"][0]["cluster"]["server"] = f"https://{lab.cloud_ip}:{url.rsplit(':', 1)[1]}"
        path.write_text(yaml.safe_dump(doc))
        code, result = await doctor(
            lab, lab.config(f'[kubernetes]\nkubeconfig = "{path}"\n', mode="pod"))
    finally:
        await api.close()
        with contextlib.suppress(FileNotFoundError):
            (lab.workdir / "kubeconfig").unlink()
    assert code == 1
    assert rows(result, "kubernetes.api")[0]["result"] == "ok"
    (rbac,) = rows(result, "kubernetes.rbac")
    assert rbac["result"] == "fail"
    assert "missing delete pods in namespace kube-flannel" in rbac["found"]
    assert creds.token not in json.dumps(result)
