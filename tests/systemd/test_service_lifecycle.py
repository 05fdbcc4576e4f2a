"""edgeheal's units under a real systemd (Debian 12's 252) in a booted container.

The tests share one container and run in file order, like an operator's session: offline
install, READY, the boot order, restarts, the watchdog, the hardening, the k3s-service
remedy under polkit, uninstall. Each test leaves the service running for the next one.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from edgeheal.lab.nspawn import Container, inotify_headroom
from tests.systemd.conftest import AGENT_CONFIG, CHECKOUT, SRC, WHEELS

pytestmark = [pytest.mark.slow]

UNIT = "edgeheal.service"
OFFLOAD_UNIT = "edgeheal-offload.service"
CAP_NET_ADMIN = 1 << 12
PY = "/opt/edgeheal/bin/python"
STATE = ("ActiveState", "SubState", "MainPID", "NRestarts", "Result", "ExecMainStatus")


def state(box: Container, unit: str = UNIT) -> dict[str, str]:
    return box.show(unit, *STATE)


def running(box: Container, unit: str = UNIT) -> dict[str, str] | None:
    now = state(box, unit)
    return now if (now["ActiveState"], now["SubState"]) == ("active", "running") else None


def restarted(box: Container, before: dict[str, str]) -> dict[str, str] | None:
    """The unit's state once it runs again with another main process."""
    now = running(box)
    return now if now and now["MainPID"] != before["MainPID"] else None


def failed(box: Container) -> dict[str, str] | None:
    now = state(box)
    return now if now["ActiveState"] == "failed" else None


def http_get(box: Container, path: str) -> tuple[int, str]:
    """GET from the agent's HTTP server on the container's loopback."""
    script = ("import sys, urllib.request, urllib.error\n"
              "try:\n"
              f"    r = urllib.request.urlopen('http://127.0.0.1:9917{path}', timeout=5)\n"
              "    print(r.status); print(r.read().decode())\n"
              "except urllib.error.HTTPError as e:\n"
              "    print(e.code); print(e.read().decode())\n")
    out = box.run(["python3", "-c", script]).stdout
    code, _, body = out.partition("\n")
    return int(code), body


def log_since(box: Container, cursor: str, unit: str = UNIT) -> str:
    """The unit's journal (systemd's lines and the agent's) after ``cursor``, as text."""
    return "\n".join(e.get("MESSAGE", "") for e in box.journal(f"--unit={unit}", after=cursor))


def offload_of(box: Container, feature: str = "tx-checksum-ip-generic") -> str:
    out = box.run(["ethtool", "-k", "host0"]).stdout
    match = re.search(rf"^\s*{re.escape(feature)}: (\w+)", out, re.MULTILINE)
    assert match, out
    return match.group(1)


def test_the_offline_install_from_a_wheelhouse_starts_the_service(container: Container) -> None:
    # no route out of the container: pip can only use the wheelhouse
    assert "default" not in container.run(["ip", "route"]).stdout
    assert offload_of(container) == "on"
    began = time.monotonic()
    out = container.run([f"{SRC}/install.sh", "--wheelhouse", WHEELS], timeout=240).stdout
    print(f"install.sh --wheelhouse took {time.monotonic() - began:.1f} s")
    assert "offline" in out
    assert "kept the existing /etc/edgeheal/edgeheal.toml" in out
    now = container.wait_for(lambda: running(container), timeout=60, what="edgeheal running")
    assert now["NRestarts"] == "0"
    for unit in (UNIT, OFFLOAD_UNIT):
        assert container.systemctl("is-enabled", unit).stdout.strip() == "enabled"
    assert container.run(["/usr/local/bin/edgeheal", "--version"]).stdout.startswith(
        "edgeheal ")
    # the agent turned the veth's offload off
    container.wait_for(lambda: offload_of(container) == "off", timeout=20,
                       what="the agent to turn tx-checksum-ip-generic off")


def test_the_unit_becomes_active_only_after_ready(container: Container) -> None:
    props = container.show(UNIT, "ExecMainStartTimestampMonotonic",
                           "ActiveEnterTimestampMonotonic", "MainPID", "StatusText",
                           "Type", "NotifyAccess")
    assert (props["Type"], props["NotifyAccess"]) == ("notify", "main")
    entries = container.journal(f"_PID={props['MainPID']}")
    ready = [e for e in entries if "first round complete" in e["MESSAGE"]]
    assert ready, "the agent never logged its first complete round (when it sends READY=1)"
    # systemd got the agent's notification (READY=1 comes with the first STATUS=) ...
    assert props["StatusText"], "systemd has no STATUS= from the agent"
    # ... and called the unit active only after the agent's first round of checks; without
    # READY it never does (next test)
    latency = (int(props["ActiveEnterTimestampMonotonic"])
               - int(props["ExecMainStartTimestampMonotonic"])) / 1e6
    print(f"edgeheal.service: process start -> active (READY) {latency:.2f} s; "
          f"status {props['StatusText']!r}")
    # a unit that is active when its process starts (Type=simple/exec) shows ~0 here; the
    # agent needs its imports and a first round of checks (about 1 s) before READY
    assert latency >= 0.1


def test_a_start_whose_ready_never_arrives_fails(container: Container) -> None:
    dropin = "/run/systemd/system/edgeheal.service.d/noready.conf"
    # the same agent, but without $NOTIFY_SOCKET its READY=1 never reaches systemd
    container.write(dropin, "[Service]\nUnsetEnvironment=NOTIFY_SOCKET\n"
                            "TimeoutStartSec=10s\nRestart=no\n")
    try:
        container.systemctl("daemon-reload")
        cursor = container.cursor()
        began = time.monotonic()
        proc = container.systemctl("restart", UNIT, check=False)
        took = time.monotonic() - began
        assert proc.returncode != 0
        now = state(container)
        assert now["ActiveState"] == "failed"
        assert now["Result"] == "timeout"
        assert took >= 9.0, f"failed after {took:.1f} s, before TimeoutStartSec"
        log = log_since(container, cursor)
        assert "first round complete" in log  # the agent ran fine; only READY was missing
        assert "start operation timed out" in log.lower(), log[-2000:]
    finally:
        container.run(["rm", "-rf", dropin.rsplit("/", 1)[0]])
        container.systemctl("daemon-reload")
        container.systemctl("reset-failed", UNIT, check=False)
        container.systemctl("start", UNIT)
    assert running(container)


def test_kill_9_of_the_agent_is_restarted_by_systemd(container: Container) -> None:
    before = container.wait_for(lambda: running(container), timeout=30, what="running")
    cursor = container.cursor()
    container.systemctl("kill", "--kill-who=main", "--signal=SIGKILL", UNIT)
    after = container.wait_for(
        lambda: restarted(container, before),
        timeout=60, what="systemd to restart the killed agent")
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1
    assert "code=killed, status=9/KILL" in log_since(container, cursor)


def test_a_bad_config_stops_the_unit_for_good_and_says_why(container: Container) -> None:
    container.write("/etc/edgeheal/edgeheal.toml",
                    AGENT_CONFIG.replace('check_interval = "2s"', 'check_interval = "soon"'),
                    mode=0o640)
    try:
        cursor = container.cursor()
        proc = container.systemctl("restart", UNIT, check=False)
        assert proc.returncode != 0
        now = container.wait_for(lambda: failed(container), timeout=30, what="the unit to fail")
        assert now["ExecMainStatus"] == "2"
        assert now["Result"] == "exit-code"
        stopped = container.show(UNIT, "NRestarts", "ExecMainStartTimestampMonotonic")
        # RestartSec is 5 s: watch well past it — no restart may come
        deadline = time.monotonic() + 9.0
        while time.monotonic() < deadline:
            assert state(container)["ActiveState"] == "failed"
            assert container.show(UNIT, "NRestarts", "ExecMainStartTimestampMonotonic") \
                == stopped
            time.sleep(0.5)
        log = log_since(container, cursor)
        assert "configuration error" in log, log[-2000:]
        assert "agent.check_interval" in log, log[-2000:]
    finally:
        container.write("/etc/edgeheal/edgeheal.toml", AGENT_CONFIG, mode=0o640)
        container.systemctl("reset-failed", UNIT, check=False)
        container.systemctl("start", UNIT)
    assert running(container)


def test_a_stopped_agent_is_killed_by_the_watchdog_and_restarted(container: Container) -> None:
    before = container.wait_for(lambda: running(container), timeout=30, what="running")
    watchdog = container.show(UNIT, "WatchdogUSec")["WatchdogUSec"]
    assert watchdog == "30s", watchdog
    cursor = container.cursor()
    stopped = time.monotonic()
    container.systemctl("kill", "--kill-who=main", "--signal=SIGSTOP", UNIT)
    after = container.wait_for(
        lambda: restarted(container, before),
        timeout=90, what="the watchdog to kill and systemd to restart the agent", interval=1)
    took = time.monotonic() - stopped
    print(f"SIGSTOP -> restarted after {took:.1f} s (WatchdogSec={watchdog})")
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1
    log = log_since(container, cursor)
    assert "Watchdog timeout" in log, log[-2000:]
    # pinged every 15 s, so the 30 s watchdog fires 15-30 s after the stop; +5 s RestartSec
    assert took >= 15.0


def test_the_hardening_applies_and_the_agent_still_works(container: Container) -> None:
    now = container.wait_for(lambda: running(container), timeout=30, what="running")
    pid = now["MainPID"]
    status = dict(line.split(":", 1) for line in container.run(
        ["cat", f"/proc/{pid}/status"]).stdout.splitlines() if ":" in line)
    uid = container.run(["id", "-u", "edgeheal"]).stdout.strip()
    assert status["Uid"].split()[:2] == [uid, uid]
    for cap in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert int(status[cap], 16) == CAP_NET_ADMIN, (cap, status[cap])
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"
    mounts = container.run(["cat", f"/proc/{pid}/mountinfo"]).stdout.splitlines()
    opts = {line.split()[4]: line.split()[5] for line in mounts}
    assert opts["/"].startswith("ro"), opts["/"]
    assert opts["/var/lib/edgeheal"].startswith("rw"), opts
    # it reads netlink (the offload check), serves probes, writes its state directory
    code, body = http_get(container, "/status")
    assert code == 200, body
    checks = json.loads(body)["checks"]
    assert checks["offload"]["state"] == "ok", checks["offload"]
    assert http_get(container, "/readyz")[0] == 200
    assert http_get(container, "/probe/offload")[0] == 200
    # its own RSS and descriptor limit reach /metrics under ProcSubset=pid (issue 17)
    code, text = http_get(container, "/metrics")
    assert code == 200
    assert re.search(r"^edgeheal_resident_memory_bytes [1-9]", text, re.MULTILINE), text
    assert "edgeheal_max_fds 4096.0" in text
    print("memory limits:", re.findall(r"^edgeheal_memory_limit_bytes.*$", text, re.MULTILINE))
    listing = container.run(["ls", "-ln", "/var/lib/edgeheal"]).stdout
    assert re.search(rf"^s\S+ +\d+ +{uid} .*control\.sock$", listing, re.MULTILINE), listing
    mode = container.run(["stat", "-c", "%a %u", "/var/lib/edgeheal"]).stdout.split()
    assert mode == ["700", uid]
    # systemd's view of the loaded unit, the offline analysis (scripts/test) and the docs agree
    online = exposure(container, UNIT)
    offline = exposure(container, "--offline=true", f"/etc/systemd/system/{UNIT}")
    recorded = {doc: re.findall(r"exposure\s+\*\*([0-9.]+)\*\*", (CHECKOUT / doc).read_text())
                for doc in ("docs/operations.md", "README.md")}
    print(f"systemd-analyze security: online {online}, offline {offline}, docs {recorded}")
    assert online == offline
    for doc, values in recorded.items():
        assert values, f"{doc} does not record the exposure as **N.N**"
        assert {float(v) for v in values} == {online}, f"{doc} records {values}, not {online}"


def exposure(box: Container, *args: str) -> float:
    out = box.run(["systemd-analyze", "security", "--no-pager", *args], check=False)
    found = re.search(r"Overall exposure level for edgeheal\.service: ([0-9.]+)", out.stdout)
    assert found, (out.stdout + out.stderr)[-1500:]
    return float(found.group(1))


def test_the_boot_runs_the_offload_oneshot_before_k3s(container: Container) -> None:
    container.reboot()
    # a new veth: its offload started on, and was off before the stand-in K3s started
    entries = container.journal()
    finished = [e for e in entries if e.get("UNIT") == OFFLOAD_UNIT
                and e.get("JOB_TYPE") == "start" and e.get("JOB_RESULT") == "done"]
    k3s_start = [e for e in entries if e.get("UNIT") == "k3s-agent.service"
                 and e["MESSAGE"].startswith("Starting")]
    seen = [e for e in entries if "stand-in k3s-agent sees" in e["MESSAGE"]]
    switched = [e for e in entries if e.get("_SYSTEMD_UNIT") == OFFLOAD_UNIT and re.search(
        r"host0\s+tx-checksum-ip-generic\s+on\s+off", e["MESSAGE"])]
    assert finished, "edgeheal-offload.service did not run at boot"
    assert switched, "the oneshot did not find host0's offload on and turn it off"
    assert k3s_start, "the stand-in k3s-agent.service did not start at boot"
    assert seen, "the stand-in k3s-agent.service did not log the NIC's offload"
    assert int(finished[0]["__MONOTONIC_TIMESTAMP"]) < int(k3s_start[0]["__MONOTONIC_TIMESTAMP"])
    assert seen[0]["MESSAGE"].endswith("tx-checksum-ip-generic: off"), seen[0]["MESSAGE"]
    container.wait_for(lambda: running(container), timeout=60, what="edgeheal after boot")


K3S_RESTART = """\
import asyncio
from edgeheal.config import ServiceSettings
from edgeheal.remedies.k3s_service import K3sServiceRemedy
out = asyncio.run(K3sServiceRemedy(ServiceSettings(unit="auto", timeout=30.0)).restart())
print("k3s-service remedy:", out)
"""
SANDBOXED = "edgeheal-remedy-probe.service"
"""edgeheal.service's own [Service] sandbox (user, capability, seccomp, namespaces...),
running the remedy once instead of the agent."""


def sandboxed_unit(box: Container, script: str) -> str:
    unit = box.run(["cat", f"/etc/systemd/system/{UNIT}"]).stdout
    drop = ("NotifyAccess=", "WatchdogSec=", "Restart=", "RestartSec=",
            "RestartPreventExitStatus=", "WantedBy=", "Environment=")
    lines = [line for line in unit.splitlines() if not line.startswith(drop)]
    lines = [("Type=oneshot" if line.startswith("Type=") else
              f"ExecStart={PY} {script}" if line.startswith("ExecStart=") else line)
             for line in lines]
    return "\n".join(lines) + "\n"


def as_agent_user(box: Container, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run as the system user ``edgeheal`` (what polkit sees as the subject)."""
    return box.run(["setpriv", "--reuid=edgeheal", "--regid=edgeheal", "--init-groups",
                    "--", *argv], check=False, timeout=60)


def test_k3s_service_mode_restarts_k3s_through_polkit_and_nothing_else(
        container: Container) -> None:
    rule = "/etc/polkit-1/rules.d/50-edgeheal-k3s-restart.rules"
    assert container.run(["test", "-f", rule], check=False).returncode == 0
    # the container's system bus is up and systemd is on it (busctl talks D-Bus, not
    # systemd's private socket)
    bus = container.run(["busctl", "--timeout=10", "status", "org.freedesktop.systemd1"],
                        check=False, timeout=30)
    if bus.returncode != 0:
        dbus_log = container.run(["journalctl", "-b", "-u", "dbus.service", "--no-pager"],
                                 check=False).stdout[-1500:]
        pytest.fail(f"systemd is not on the container's system bus: {bus.stderr}\n"
                    f"{inotify_headroom()}\n{dbus_log}")
    before = container.show("k3s-agent.service", "MainPID", "ActiveState")
    assert before["ActiveState"] == "active"
    # the remedy, run under exactly the agent's sandbox, restarts K3s through polkit
    script = "/usr/local/share/edgeheal-test/k3s_restart.py"
    container.write(script, K3S_RESTART)
    container.write(f"/run/systemd/system/{SANDBOXED}", sandboxed_unit(container, script))
    container.systemctl("daemon-reload")
    cursor = container.cursor()
    proc = container.systemctl("start", SANDBOXED, check=False)
    log = log_since(container, cursor, SANDBOXED)
    assert proc.returncode == 0, log[-2000:]
    assert "k3s-service remedy:" in log, log[-2000:]
    after = container.show("k3s-agent.service", "MainPID", "ActiveState")
    assert after["ActiveState"] == "active"
    assert after["MainPID"] != before["MainPID"], "k3s-agent.service was not restarted"
    # any other unit, or any other verb on K3s, is refused to the agent's user
    for verb, unit in (("RestartUnit", "dbus.service"), ("StopUnit", "k3s-agent.service"),
                       ("RestartUnit", UNIT)):
        pid = container.show(unit, "MainPID")["MainPID"]
        proc = as_agent_user(container, "busctl", "--timeout=10", "call",
                             "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                             "org.freedesktop.systemd1.Manager", verb, "ss", unit, "replace")
        assert proc.returncode != 0, f"{verb} {unit} was allowed"
        assert "Access denied" in proc.stderr or "authorization" in proc.stderr.lower(), \
            proc.stderr
        assert container.show(unit, "MainPID")["MainPID"] == pid


MM_ACTIONS = Path("/usr/share/polkit-1/actions/org.freedesktop.ModemManager1.policy")


def pkcheck(box: Container, action: str) -> int:
    """polkitd's answer for a process of user edgeheal: 0 yes, 1 no, 2 would ask."""
    return as_agent_user(box, "sh", "-c", f'exec pkcheck --action-id {action} --process $$'
                         ).returncode


def test_the_uplink_rules_grant_exactly_device_control_and_reboot_only_when_asked(
        container: Container) -> None:
    # ModemManager is not in the container: register its actions as its package does
    assert MM_ACTIONS.exists(), "ModemManager is not installed here (install.sh --dev)"
    container.write(str(MM_ACTIONS), MM_ACTIONS.read_text(encoding="utf-8"))
    uplink = "/etc/polkit-1/rules.d/49-edgeheal-uplink.rules"
    reboot = "/etc/polkit-1/rules.d/49-edgeheal-reboot.rules"
    assert container.run(["test", "-f", uplink], check=False).returncode == 0
    assert container.run(["test", "-e", reboot], check=False).returncode != 0
    control = "org.freedesktop.ModemManager1.Device.Control"
    container.wait_for(lambda: pkcheck(container, control) == 0, timeout=30,
                       what="polkitd to allow Device.Control to user edgeheal")
    denied = ("org.freedesktop.login1.reboot", "org.freedesktop.login1.power-off",
              "org.freedesktop.login1.reboot-multiple-sessions",
              "org.freedesktop.login1.reboot-ignore-inhibit",
              "org.freedesktop.ModemManager1.Control", "org.freedesktop.ModemManager1.Firmware")
    assert {a: pkcheck(container, a) for a in denied} == dict.fromkeys(denied, 1)
    # what install.sh --allow-reboot adds: exactly logind's reboot action
    container.run(["install", "-m", "0644", f"{SRC}/systemd/49-edgeheal-reboot.rules", reboot])
    try:
        container.wait_for(lambda: pkcheck(container, "org.freedesktop.login1.reboot") == 0,
                           timeout=30, what="polkitd to allow logind's reboot to edgeheal")
        assert {a: pkcheck(container, a) for a in denied[1:]} == dict.fromkeys(denied[1:], 1)
    finally:
        container.run(["rm", "-f", reboot])
    container.wait_for(lambda: pkcheck(container, "org.freedesktop.login1.reboot") == 1,
                       timeout=30, what="polkitd to drop the reboot rule")


def test_uninstall_removes_what_it_installed_and_keeps_the_config(
        container: Container) -> None:
    config = container.run(["cat", "/etc/edgeheal/edgeheal.toml"]).stdout
    uid = int(container.run(["id", "-u", "edgeheal"]).stdout)
    out = container.run([f"{SRC}/install.sh", "--uninstall"], timeout=60).stdout
    assert "kept /etc/edgeheal" in out
    assert container.show(UNIT, "LoadState")["LoadState"] == "not-found"
    assert container.show(OFFLOAD_UNIT, "LoadState")["LoadState"] == "not-found"
    for path in ("/opt/edgeheal", "/usr/local/bin/edgeheal", f"/etc/systemd/system/{UNIT}",
                 f"/etc/systemd/system/{OFFLOAD_UNIT}", "/usr/share/doc/edgeheal",
                 "/etc/polkit-1/rules.d/50-edgeheal-k3s-restart.rules",
                 "/etc/polkit-1/rules.d/49-edgeheal-uplink.rules",
                 "/etc/systemd/system/multi-user.target.wants/edgeheal.service"):
        assert container.run(["test", "-e", path], check=False).returncode != 0, path
    owners = container.run(["python3", "-c", "import os, pathlib; print(sorted({p.stat().st_uid "
                            "for p in pathlib.Path('/proc').iterdir() if p.name.isdigit()}))"])
    assert uid not in json.loads(owners.stdout), "a process of user edgeheal is left"
    assert container.run(["cat", "/etc/edgeheal/edgeheal.toml"]).stdout == config
    # --purge takes the configuration, the state and the user too
    container.run([f"{SRC}/install.sh", "--uninstall", "--purge"], timeout=60)
    for path in ("/etc/edgeheal", "/var/lib/edgeheal"):
        assert container.run(["test", "-e", path], check=False).returncode != 0, path
    assert container.run(["id", "edgeheal"], check=False).returncode != 0
