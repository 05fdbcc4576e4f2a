"""The shipped polkit rule allows user edgeheal exactly `restart` of the K3s unit.

polkitd is not installed on the test machines (and needs a system bus and systemd), so the
rule file is evaluated by Node.js inside a stand-in of polkit's own rule runner: the same
``polkit.Result`` table, ``addRule`` order, "first non-null result wins", and an ``action``
whose ``lookup(key)`` returns the details systemd passes for
``org.freedesktop.systemd1.manage-units`` (``unit``, ``verb``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from edgeheal.remedies.k3s_service import AUTO_UNITS, POLKIT_RULE

RULE = Path(__file__).resolve().parents[2] / "systemd" / "50-edgeheal-k3s-restart.rules"
MANAGE = "org.freedesktop.systemd1.manage-units"

# What polkit's init.js defines (polkit.Result, addRule, _runRules), reduced to the parts a
# rule can see; the rule file runs in a fresh context holding only `polkit`.
RUNNER = r"""
const fs = require("fs"), vm = require("vm");
const {rulePath, cases} = JSON.parse(fs.readFileSync(0, "utf8"));
const polkit = {
  Result: {NO: "no", YES: "yes", AUTH_SELF: "auth_self", AUTH_SELF_KEEP: "auth_self_keep",
           AUTH_ADMIN: "auth_admin", AUTH_ADMIN_KEEP: "auth_admin_keep", NOT_HANDLED: null},
  _ruleFuncs: [],
  addRule(f) { this._ruleFuncs.push(f); },
  addAdminRule(f) {},
  log(msg) {},
  spawn(argv) { throw new Error("rules must not spawn programs"); },
};
vm.runInNewContext(fs.readFileSync(rulePath, "utf8"), {polkit}, {filename: rulePath});
const out = cases.map(([id, details, user, groups]) => {
  const action = {id, lookup: (key) => details[key]};
  const subject = {user, groups, pid: 4242, local: false, active: false,
                   isInGroup: (g) => groups.indexOf(g) !== -1, isInNetGroup: () => false};
  for (const f of polkit._ruleFuncs) {
    const r = f(action, subject);
    if (r) return r;
  }
  return "not_handled";
});
process.stdout.write(JSON.stringify(out));
"""

CASES = [
    # (action id, details, user, expected)
    (MANAGE, {"unit": "k3s-agent.service", "verb": "restart"}, "edgeheal", "yes"),
    (MANAGE, {"unit": "k3s.service", "verb": "restart"}, "edgeheal", "yes"),
    (MANAGE, {"unit": "k3s-agent.service", "verb": "start"}, "edgeheal", "no"),
    (MANAGE, {"unit": "k3s-agent.service", "verb": "stop"}, "edgeheal", "no"),
    (MANAGE, {"unit": "k3s-agent.service", "verb": "reload"}, "edgeheal", "no"),
    (MANAGE, {"unit": "k3s-agent.service", "verb": "try-restart"}, "edgeheal", "no"),
    (MANAGE, {"unit": "k3s-agent.service", "verb": "reload-or-restart"}, "edgeheal", "no"),
    (MANAGE, {"unit": "sshd.service", "verb": "restart"}, "edgeheal", "no"),
    (MANAGE, {"unit": "k3s-agent.service.d", "verb": "restart"}, "edgeheal", "no"),
    (MANAGE, {"unit": "containerd.service", "verb": "restart"}, "edgeheal", "no"),
    (MANAGE, {"verb": "restart"}, "edgeheal", "no"),
    (MANAGE, {}, "edgeheal", "no"),
    ("org.freedesktop.systemd1.manage-unit-files", {}, "edgeheal", "no"),
    ("org.freedesktop.systemd1.reload-daemon", {}, "edgeheal", "no"),
    ("org.freedesktop.login1.reboot", {}, "edgeheal", "no"),
    # other users are not this rule's business: polkit's defaults apply to them
    (MANAGE, {"unit": "k3s-agent.service", "verb": "restart"}, "nobody", "not_handled"),
    (MANAGE, {"unit": "k3s-agent.service", "verb": "restart"}, "edgeheal2", "not_handled"),
    (MANAGE, {"unit": "k3s-agent.service", "verb": "restart"}, "root", "not_handled"),
]


def evaluate(cases: list[tuple[str, dict[str, str], str, str]]) -> list[str]:
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("needs Node.js to evaluate the polkit rule")
    payload = json.dumps({"rulePath": str(RULE), "cases": [[a, d, u, []] for a, d, u, _ in cases]})
    proc = subprocess.run([node, "-e", RUNNER], input=payload, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    result: list[str] = json.loads(proc.stdout)
    return result


def test_the_rule_allows_exactly_restart_of_the_k3s_units_for_user_edgeheal() -> None:
    got = evaluate(CASES)
    table = [(a, d, u, want, have) for (a, d, u, want), have in zip(CASES, got, strict=True)]
    wrong = [row for row in table if row[3] != row[4]]
    assert not wrong, "\n".join(f"{a} {d} user={u}: want {w}, got {h}" for a, d, u, w, h in wrong)


def test_the_rule_is_plain_es5_for_polkits_javascript_engines() -> None:
    code = re.sub(r"//[^\n]*", "", RULE.read_text(encoding="utf-8"))
    assert not re.search(r"\b(let|const|class)\b|=>|`", code), \
        "duktape (polkit >= 121 on Debian) and old mozjs need ES5: use var and function"


def test_the_rule_names_the_same_units_as_the_remedys_auto_resolution() -> None:
    assert POLKIT_RULE.endswith("/" + RULE.name)
    code = RULE.read_text(encoding="utf-8")
    units = re.search(r"var UNITS = \[([^\]]*)\]", code)
    assert units is not None
    assert sorted(re.findall(r'"([^"]+)"', units.group(1))) == sorted(AUTO_UNITS)
