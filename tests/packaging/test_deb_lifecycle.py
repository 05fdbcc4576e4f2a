"""The package's life cycle on a booted Debian 12 (systemd 252, polkit, no network): install,
upgrade over a previous build, remove, purge. The tests share one container and run in file
order, like an operator's session."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeheal.lab import nspawn
from edgeheal.lab.netns import Sandbox
from tests.packaging.conftest import PREVIOUS
from tests.systemd.conftest import STAND_IN_K3S

pytestmark = [pytest.mark.slow]

DEBS = "/mnt/debs"
UNIT = "edgeheal.service"
CONF = "/etc/edgeheal/edgeheal.toml"
STATE = "/var/lib/edgeheal"
APT = ["apt-get", "install", "--yes", "--quiet"]

LOCAL_EDIT = """\
# edgeheal package test: the operator's edit of the conffile
[agent]
state_dir = "/var/lib/edgeheal"
check_interval = "2s"

[http]
listen = ["127.0.0.1:9917"]

[offload]
interfaces = ["host0"]
interval = "5s"

[wireguard]
enabled = false

[[mqtt.targets]]
name = "cloud"
host = "127.0.0.1"
port = 9          # nothing listens: every alert stays in the outbox
path = "direct"

[alerts]
target = "cloud"

[remediation]
mode = "k3s-service"
"""


@pytest.fixture(scope="module")
def node(debian_rootfs: Path, debs: dict[str, Path],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[nspawn.Container]:
    """A booted Debian 12 with the packages mounted read-only and a stand-in K3s agent."""
    nspawn.sweep()
    sandbox = Sandbox()
    box = nspawn.Container(lower=debian_rootfs, workdir=tmp_path_factory.mktemp("nspawn-deb"),
                           binds=(nspawn.Bind(debs["release"].parent, DEBS),))
    try:
        box.netns = sandbox.netns("p")
        try:
            box.boot(timeout=120.0)
        except nspawn.CannotBoot as err:
            pytest.skip(f"systemd-nspawn cannot boot a container here: {err}")
        box.write("/etc/systemd/system/k3s-agent.service", STAND_IN_K3S)
        box.systemctl("daemon-reload")
        box.systemctl("enable", "--now", "k3s-agent.service")
        yield box
    finally:
        box.close()
        sandbox.close()


def running(box: nspawn.Container) -> dict[str, str] | None:
    now = box.show(UNIT, "ActiveState", "SubState", "MainPID", "NRestarts")
    return now if (now["ActiveState"], now["SubState"]) == ("active", "running") else None


def livez(box: nspawn.Container) -> int:
    script = ("import urllib.request\n"
              "print(urllib.request.urlopen('http://127.0.0.1:9917/livez', timeout=5).status)")
    proc = box.run(["python3", "-c", script], check=False)
    return int(proc.stdout.strip() or 0)


def exists(box: nspawn.Container, path: str) -> bool:
    return box.run(["test", "-e", path], check=False).returncode == 0


def outbox_ids(box: nspawn.Container) -> list[str]:
    query = "SELECT id FROM outbox ORDER BY seq"
    script = ("import sqlite3, sys\n"
              "db = sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', uri=True)\n"
              "print('\\n'.join(r[0] for r in db.execute(sys.argv[2])))")
    return box.run(["python3", "-c", script, f"{STATE}/alerts.sqlite3", query]).stdout.split()


def outbox_format(box: nspawn.Container) -> int:
    script = ("import sqlite3, sys\n"
              "db = sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', uri=True)\n"
              "print(db.execute('PRAGMA user_version').fetchone()[0])")
    return int(box.run(["python3", "-c", script, f"{STATE}/alerts.sqlite3"]).stdout)


def history(box: nspawn.Container) -> dict[str, object]:
    data = json.loads(box.run(["cat", f"{STATE}/remediation-history.json"]).stdout)
    assert isinstance(data, dict)
    return data


def test_the_package_installs_offline_and_starts(node: nspawn.Container) -> None:
    assert "default" not in node.run(["ip", "route"]).stdout  # no way to download anything
    out = node.run([*APT, f"{DEBS}/edgeheal_{PREVIOUS}_amd64.deb"], timeout=300).stdout
    assert "Setting up edgeheal" in out
    node.wait_for(lambda: running(node), timeout=90, what="edgeheal running")
    for unit in (UNIT, "edgeheal-offload.service"):
        assert node.systemctl("is-enabled", unit).stdout.strip() == "enabled"
    assert node.wait_for(lambda: livez(node) == 200, timeout=30, what="/livez")
    assert node.run(["edgeheal", "--version"]).stdout.strip() == "edgeheal 0.2.0"
    assert node.run(["stat", "-c", "%U:%G %a", CONF]).stdout.strip() == "root:edgeheal 640"
    assert node.run(["getent", "passwd", "edgeheal"]).stdout.split(":")[6].strip() == \
        "/usr/sbin/nologin"
    # byte-compiled where the agent cannot write (ProtectSystem=strict)
    assert exists(node, "/opt/edgeheal/lib/python3.11/site-packages/edgeheal/__pycache__")


def test_an_upgrade_restarts_once_and_keeps_the_edit_the_outbox_and_the_history(
        node: nspawn.Container) -> None:
    node.write(CONF, LOCAL_EDIT, mode=0o640)
    node.run(["chgrp", "edgeheal", CONF])
    node.systemctl("restart", UNIT)
    node.wait_for(lambda: running(node), timeout=90, what="edgeheal running")
    queued = node.run(["edgeheal", "alert", "test", "--count", "3", "--ids", "--wait", "1"],
                      check=False).stdout.split()
    assert len(queued) >= 3, queued
    node.run(["edgeheal", "remediation", "pause", "--for", "1h"])
    before_ids = outbox_ids(node)
    assert set(queued[-3:]) <= set(before_ids)
    before_history = history(node)
    assert before_history["paused_until_boottime"] is not None
    before = running(node)
    assert before is not None
    cursor = node.cursor()

    out = node.run([*APT, f"{DEBS}/edgeheal_0.2.0_amd64.deb"], timeout=300).stdout
    assert f"over ({PREVIOUS})" in out, out[-2000:]
    after = node.wait_for(lambda: running(node), timeout=90, what="edgeheal running again")
    assert after["MainPID"] != before["MainPID"]
    systemd = [e["MESSAGE"] for e in node.journal(f"--unit={UNIT}", after=cursor)
               if e.get("_PID") == "1"]
    assert sum(m.startswith("Started ") for m in systemd) == 1, systemd
    assert sum(m.startswith("Stopped ") for m in systemd) == 1, systemd
    assert node.run(["dpkg-query", "-W", "-f", "${Version}", "edgeheal"]).stdout == "0.2.0"
    # the local edit survived, without a prompt and without a .dpkg-dist beside it
    assert node.run(["cat", CONF]).stdout == LOCAL_EDIT
    assert not node.run(["sh", "-c", "ls /etc/edgeheal/*.dpkg-* 2>/dev/null"],
                        check=False).stdout
    # the alerts queued before the upgrade are still queued, in order; the pause held
    after_ids = outbox_ids(node)
    assert after_ids[:len(before_ids)] == before_ids
    assert history(node)["paused_until_boottime"] == before_history["paused_until_boottime"]
    # both state files say their format (tests/upgrade reads release 0.2.0's unversioned ones)
    assert outbox_format(node) == 1
    assert history(node)["format"] == 1
    assert livez(node) == 200


def test_remove_keeps_the_configuration_and_the_state(node: nspawn.Container) -> None:
    node.run(["apt-get", "remove", "--yes", "--quiet", "edgeheal"], timeout=120)
    status = node.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}", "edgeheal"]).stdout
    assert status.strip() == "rc"
    assert node.systemctl("is-active", UNIT, check=False).stdout.strip() != "active"
    for gone in ("/opt/edgeheal", "/usr/bin/edgeheal", "/lib/systemd/system/edgeheal.service"):
        assert not exists(node, gone), gone
    assert node.run(["cat", CONF]).stdout == LOCAL_EDIT
    assert exists(node, f"{STATE}/alerts.sqlite3")
    assert exists(node, f"{STATE}/remediation-history.json")


def test_purge_removes_them_and_the_user(node: nspawn.Container) -> None:
    node.run(["apt-get", "purge", "--yes", "--quiet", "edgeheal"], timeout=120)
    assert node.run(["dpkg-query", "-W", "edgeheal"], check=False).returncode != 0 or \
        node.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}", "edgeheal"],
                 check=False).stdout.strip() in ("", "un", "pn")
    for gone in ("/etc/edgeheal", STATE, "/opt/edgeheal",
                 "/etc/systemd/system/multi-user.target.wants/edgeheal.service",
                 "/etc/systemd/system/multi-user.target.wants/edgeheal-offload.service"):
        assert not exists(node, gone), gone
    assert node.run(["getent", "passwd", "edgeheal"], check=False).returncode == 2
    assert node.run(["getent", "group", "edgeheal"], check=False).returncode == 2
