"""The uplink ladder's polkit rules, evaluated together with the k3s-restart rule in
polkit's own order (file name, then addRule order; the first result that is not
NOT_HANDLED wins), by Node.js in the stand-in of polkit's rule runner that
test_polkit_rule.py describes: user edgeheal gets exactly ModemManager's Device.Control
(and logind's reboot only where 49-edgeheal-reboot.rules is installed), nothing more."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from edgeheal.boundaries.modemmanager.client import DEVICE_CONTROL_ACTION
from tests.remediation_dbus.test_polkit_rule import RUNNER

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"
UPLINK = SYSTEMD / "49-edgeheal-uplink.rules"
REBOOT = SYSTEMD / "49-edgeheal-reboot.rules"
K3S = SYSTEMD / "50-edgeheal-k3s-restart.rules"
MANAGE = "org.freedesktop.systemd1.manage-units"

# many files: the runner reads each in turn into the same polkit (polkitd's order)
MULTI = RUNNER.replace(
    "const {rulePath, cases} = JSON.parse(fs.readFileSync(0, \"utf8\"));",
    "const {rulePaths, cases} = JSON.parse(fs.readFileSync(0, \"utf8\"));").replace(
    "vm.runInNewContext(fs.readFileSync(rulePath, \"utf8\"), {polkit}, {filename: rulePath});",
    "for (const p of rulePaths) vm.runInNewContext(fs.readFileSync(p, \"utf8\"), {polkit}, "
    "{filename: p});")

MM_OTHER = ("org.freedesktop.ModemManager1.Control", "org.freedesktop.ModemManager1.Firmware",
            "org.freedesktop.ModemManager1.Messaging", "org.freedesktop.ModemManager1.Voice",
            "org.freedesktop.ModemManager1.USSD", "org.freedesktop.ModemManager1.Location",
            "org.freedesktop.ModemManager1.Contacts", "org.freedesktop.ModemManager1.Time")
LOGIND_OTHER = ("org.freedesktop.login1.reboot-multiple-sessions",
                "org.freedesktop.login1.reboot-ignore-inhibit", "org.freedesktop.login1.power-off",
                "org.freedesktop.login1.set-reboot-parameter",
                "org.freedesktop.login1.set-reboot-to-firmware-setup",
                "org.freedesktop.login1.halt", "org.freedesktop.login1.suspend")


def evaluate(files: list[Path], cases: list[tuple[str, dict[str, str], str]]) -> list[str]:
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("needs Node.js to evaluate the polkit rules")
    assert "of rulePaths" in MULTI, "the runner of test_polkit_rule.py changed: adapt MULTI"
    paths = [str(p) for p in sorted(files, key=lambda p: p.name)]  # polkitd sorts by name
    payload = json.dumps({"rulePaths": paths, "cases": [[a, d, u, []] for a, d, u in cases]})
    proc = subprocess.run([node, "-e", MULTI], input=payload, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    result: list[str] = json.loads(proc.stdout)
    return result


def table(files: list[Path], rows: list[tuple[str, dict[str, str], str, str]]) -> None:
    got = evaluate(files, [(a, d, u) for a, d, u, _ in rows])
    wrong = [f"{a} {d} user={u}: want {w}, got {h}"
             for (a, d, u, w), h in zip(rows, got, strict=True) if w != h]
    assert not wrong, "\n".join(wrong)


def test_the_default_install_grants_device_control_and_no_reboot() -> None:
    table([UPLINK, K3S], [
        (DEVICE_CONTROL_ACTION, {}, "edgeheal", "yes"),
        (MANAGE, {"unit": "k3s-agent.service", "verb": "restart"}, "edgeheal", "yes"),
        ("org.freedesktop.login1.reboot", {}, "edgeheal", "no"),
        *[(action, {}, "edgeheal", "no") for action in MM_OTHER + LOGIND_OTHER],
        (DEVICE_CONTROL_ACTION, {}, "nobody", "not_handled"),
        (DEVICE_CONTROL_ACTION, {}, "root", "not_handled"),
    ])


def test_with_allow_reboot_exactly_loginds_reboot_action_is_added() -> None:
    table([REBOOT, UPLINK, K3S], [
        ("org.freedesktop.login1.reboot", {}, "edgeheal", "yes"),
        (DEVICE_CONTROL_ACTION, {}, "edgeheal", "yes"),
        *[(action, {}, "edgeheal", "no") for action in MM_OTHER + LOGIND_OTHER],
        (MANAGE, {"unit": "sshd.service", "verb": "restart"}, "edgeheal", "no"),
        ("org.freedesktop.login1.reboot", {}, "edgeheal2", "not_handled"),
        ("org.freedesktop.login1.reboot", {}, "root", "not_handled"),
    ])


def test_each_rule_alone_leaves_everything_else_to_the_others() -> None:
    table([UPLINK], [(a, {}, "edgeheal", "not_handled")
                     for a in ("org.freedesktop.login1.reboot", MANAGE, *MM_OTHER)])
    table([REBOOT], [(a, {}, "edgeheal", "not_handled")
                     for a in (DEVICE_CONTROL_ACTION, MANAGE, *LOGIND_OTHER)])


@pytest.mark.parametrize("rule", [UPLINK, REBOOT], ids=lambda p: p.name)
def test_the_rules_sort_before_the_k3s_rule_and_are_plain_es5(rule: Path) -> None:
    assert sorted([rule.name, K3S.name])[0] == rule.name, "the k3s rule's NO would win"
    code = re.sub(r"//[^\n]*", "", rule.read_text(encoding="utf-8"))
    assert not re.search(r"\b(let|const|class)\b|=>|`", code)


def test_the_action_is_the_one_modemmanager_declares() -> None:
    policy = Path("/usr/share/polkit-1/actions/org.freedesktop.ModemManager1.policy")
    assert policy.exists(), "ModemManager is not installed: install.sh --dev installs it"
    assert f'<action id="{DEVICE_CONTROL_ACTION}">' in policy.read_text(encoding="utf-8")


MM_UNIT = "ModemManager.service"


def test_the_uplink_rule_grants_exactly_the_restart_of_modemmanager() -> None:
    """``modemmanager-restart``: verb restart of ModemManager.service, nothing wider: not
    stop or start of it, not a restart of another unit, not for another user."""
    table([UPLINK, K3S], [
        (MANAGE, {"unit": MM_UNIT, "verb": "restart"}, "edgeheal", "yes"),
        (MANAGE, {"unit": MM_UNIT, "verb": "stop"}, "edgeheal", "no"),
        (MANAGE, {"unit": MM_UNIT, "verb": "start"}, "edgeheal", "no"),
        (MANAGE, {"unit": MM_UNIT, "verb": "reload"}, "edgeheal", "no"),
        (MANAGE, {"unit": "NetworkManager.service", "verb": "restart"}, "edgeheal", "no"),
        (MANAGE, {"unit": "ModemManager.service.d", "verb": "restart"}, "edgeheal", "no"),
        (MANAGE, {"unit": "sshd.service", "verb": "restart"}, "edgeheal", "no"),
        (MANAGE, {"unit": "k3s-agent.service", "verb": "restart"}, "edgeheal", "yes"),
        (MANAGE, {"unit": MM_UNIT, "verb": "restart"}, "nobody", "not_handled"),
        (MANAGE, {"unit": MM_UNIT, "verb": "restart"}, "root", "not_handled"),
    ])
    table([UPLINK], [(MANAGE, {"unit": MM_UNIT, "verb": "restart"}, "edgeheal", "yes"),
                     (MANAGE, {"unit": MM_UNIT, "verb": "stop"}, "edgeheal", "not_handled")])


NM_CONTROL = "org.freedesktop.NetworkManager.network-control"
NM_OTHER = ("org.freedesktop.NetworkManager.settings.modify.system",
            "org.freedesktop.NetworkManager.enable-disable-network",
            "org.freedesktop.NetworkManager.enable-disable-wwan",
            "org.freedesktop.NetworkManager.reload", "org.freedesktop.NetworkManager.sleep-wake")


def test_the_uplink_rule_grants_networkmanagers_network_control_and_nothing_more() -> None:
    table([UPLINK, K3S], [
        (NM_CONTROL, {}, "edgeheal", "yes"),
        *[(action, {}, "edgeheal", "no") for action in NM_OTHER],
        (NM_CONTROL, {}, "nobody", "not_handled"),
    ])
    table([UPLINK], [(action, {}, "edgeheal", "not_handled") for action in NM_OTHER])


def test_the_action_is_the_one_networkmanager_checks() -> None:
    from edgeheal.remedies.modem_reconnect import NM_CONTROL_ACTION

    assert NM_CONTROL_ACTION == NM_CONTROL


def test_the_pkla_keeps_in_step_with_the_rule_and_never_grants_manage_units() -> None:
    """polkit 0.105's format cannot see a unit: the package's .pkla grants ModemManager's
    and NetworkManager's actions (neither has details), and says why the restart is not
    in it."""
    pkla = SYSTEMD.parent / "packaging/debian/polkit/49-edgeheal-uplink.pkla"
    text = pkla.read_text(encoding="utf-8")
    actions = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("Action=")]
    assert actions == [DEVICE_CONTROL_ACTION, NM_CONTROL]
    rule = UPLINK.read_text(encoding="utf-8")
    assert all(f'"{action}"' in rule for action in actions)
    assert "manage-units" in text  # the comment saying why not
    assert MANAGE in UPLINK.read_text(encoding="utf-8")


def test_the_restart_action_and_unit_are_the_rungs_own() -> None:
    from edgeheal.config import UplinkLadderSettings
    from edgeheal.remedies.modemmanager_restart import POLKIT_RULE

    assert UplinkLadderSettings().modemmanager_unit == MM_UNIT
    assert POLKIT_RULE.endswith("/" + UPLINK.name)
    assert f'"{MM_UNIT}"' in UPLINK.read_text(encoding="utf-8")
