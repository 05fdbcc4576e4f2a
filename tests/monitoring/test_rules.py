"""The shipped alert rules, recording rules and dashboard, held to promtool and to the agent.

What is checked, and why each matters to an operator:

- ``promtool check rules`` on every rule file, and ``promtool test rules`` on
  ``alerts_test.yaml``: every alert fires in at least one case and stays silent in at least
  one (a unit test whose only cases expect silence would pass for a misspelt alert);
- the unit tests have teeth: a rule file with one threshold changed fails them;
- each alert has ``for:``, a severity, a summary, a description and a ``runbook_url`` whose
  anchor is a section of docs/runbook.md;
- the shipped Alertmanager route (monitoring/alertmanager/fleet-hold.yaml) passes
  ``amtool check-config``, sends the hub-fault alert, and only it, to the fleet-hold
  webhook with ``send_resolved`` (the resolve is the release), and names a shipped alert;
- the three alerts issue 21 names (rekey failing, circuit open, outbox backlog) are one line;
- the committed dashboard is what ``monitoring/dashboard.py`` writes, and every one of its
  queries parses (wrapped as recording rules for ``promtool check rules``);
- every ``edgeheal_*`` metric a rule or a panel reads, with the labels it matches on, is in
  the golden ``/metrics`` file (tests/agent/golden/metrics.txt), so a rename in the agent
  breaks this test instead of silently emptying a panel or muting an alert.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "monitoring"
RULE_FILES = sorted(MONITORING.glob("*.yaml"))
ALERTS = MONITORING / "alerts.yaml"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yaml")
RUNBOOK = ROOT / "docs" / "runbook.md"
GOLDEN = ROOT / "tests" / "agent" / "golden" / "metrics.txt"
PROMTOOL = shutil.which("promtool") or "promtool"
AMTOOL = shutil.which("amtool") or "amtool"
ROUTE = MONITORING / "alertmanager" / "fleet-hold.yaml"
ONE_LINERS = ("EdgehealRekeyFailing", "EdgehealRemediationCircuitOpen",
              "EdgehealAlertBacklogOld")
TARGET_LABELS = {"job", "instance"}
"""Labels Prometheus adds to every scraped series."""
GRAFANA_VARIABLES = {"$instance": "edge-1", "$__rate_interval": "1m", "$__range": "1h"}


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, check=False,
                          cwd=cwd, timeout=60)


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def all_rules() -> list[dict[str, Any]]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"]
            for r in g["rules"]]


def dashboard_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("edgeheal_dashboard",
                                                  MONITORING / "dashboard.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_rule_file_passes_promtool_check_rules() -> None:
    assert RULE_FILES, "no rule file under monitoring/"
    proc = promtool("check", "rules", *map(str, RULE_FILES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(RULE_FILES)


def test_the_unit_tests_pass() -> None:
    proc = promtool("test", "rules", str(UNIT_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_the_unit_tests_fail_when_a_rule_changes(tmp_path: Path) -> None:
    """A circuit that must be open twice over never fires: the unit tests must say so."""
    (tmp_path / "monitoring").mkdir()
    (tmp_path / "tests" / "monitoring").mkdir(parents=True)
    for rule_file in RULE_FILES:
        text = rule_file.read_text()
        if rule_file == ALERTS:
            old = "expr: edgeheal_remediation_circuit_open == 1"
            assert old in text
            text = text.replace(old, "expr: edgeheal_remediation_circuit_open == 2")
        (tmp_path / "monitoring" / rule_file.name).write_text(text)
    shutil.copy(UNIT_TESTS, tmp_path / "tests" / "monitoring" / UNIT_TESTS.name)
    proc = promtool("test", "rules", f"tests/monitoring/{UNIT_TESTS.name}", cwd=tmp_path)
    assert proc.returncode != 0
    assert "EdgehealRemediationCircuitOpen" in proc.stdout + proc.stderr


def test_every_alert_fires_in_one_unit_test_and_stays_silent_in_another() -> None:
    names = {r["alert"] for r in alert_rules()}
    firing: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            assert check["alertname"] in names, f"unit test of an unknown alert: {check}"
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    assert names - firing == set(), "alerts never seen firing"
    assert names - silent == set(), "alerts never seen silent"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", title)))
    return out


def test_every_alert_has_for_severity_summary_description_and_a_runbook_section() -> None:
    anchors = _anchors(RUNBOOK.read_text())
    for rule in alert_rules():
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: no for:"
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        notes = rule["annotations"]
        assert notes["summary"], name
        assert notes["description"], name
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == "docs/runbook.md", name
        assert anchor == name.lower(), name
        assert anchor in anchors, f"{name}: no section {anchor!r} in docs/runbook.md"


def test_the_three_alerts_of_the_issue_are_one_line_each() -> None:
    exprs = {r["alert"]: r["expr"] for r in alert_rules()}
    for name in ONE_LINERS:
        assert "\n" not in exprs[name].strip(), exprs[name]
        assert len(exprs[name]) < 80, exprs[name]


def test_the_committed_dashboard_is_what_the_script_writes() -> None:
    module = dashboard_module()
    assert module.OUT.read_text() == module.render(), \
        "run: python monitoring/dashboard.py (and commit monitoring/dashboards/edgeheal.json)"


def _substituted(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def test_every_dashboard_query_passes_promtool(tmp_path: Path) -> None:
    module = dashboard_module()
    queries = module.expressions(module.build())
    assert len(queries) >= 20
    rules = [{"record": f"dashboard:query_{i}", "expr": _substituted(expr)}
             for i, (_, expr) in enumerate(queries)]
    wrapped = tmp_path / "dashboard-queries.yaml"
    wrapped.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = promtool("check", "rules", str(wrapped))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(rules)} rules found" in proc.stdout


_SELECTOR = re.compile(r"(?<![\w:])(edgeheal_[a-z0-9_]+)(?![\w:])(\{[^}]*\})?")
_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")


def _golden() -> dict[str, set[str]]:
    """sample name -> label names, from the golden /metrics file."""
    out: dict[str, set[str]] = {}
    for line in GOLDEN.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, labels = line.partition("{")
        out.setdefault(name, set()).update(x for x in labels.rstrip("}").split(",") if x)
    return out


def test_every_metric_the_rules_and_the_dashboard_read_is_in_the_golden_file() -> None:
    golden = _golden()
    module = dashboard_module()
    exprs = [("rule " + str(r.get("alert") or r.get("record")), str(r["expr"]))
             for r in all_rules()]
    exprs += module.expressions(module.build())
    seen = set()
    for where, expr in exprs:
        for match in _SELECTOR.finditer(expr):
            name, matchers = match.group(1), match.group(2) or ""
            assert name in golden, f"{where}: {name} is not exported by the agent"
            labels = set(_MATCHER.findall(matchers)) - TARGET_LABELS
            assert labels <= golden[name], \
                f"{where}: {name} has no label {sorted(labels - golden[name])}"
            seen.add(name)
    assert len(seen) >= 20


@pytest.mark.parametrize("name", ONE_LINERS)
def test_a_one_line_alert_reads_a_metric_of_the_golden_file(name: str) -> None:
    expr = next(r["expr"] for r in alert_rules() if r["alert"] == name)
    metric = _SELECTOR.search(expr)
    assert metric is not None
    assert metric.group(1) in _golden()


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, check=False,
                          cwd=ROOT, timeout=60)


def test_the_shipped_route_sends_the_hub_fault_and_only_it_to_the_fleet_hold() -> None:
    proc = _amtool("check-config", str(ROUTE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
    names = {r["alert"] for r in alert_rules()}
    for alert, receiver in (("EdgehealHubFaultFleetwide", "edgeheal-fleet-hold"),
                            ("EdgehealDirectPathDownFleetwide", "default"),
                            ("EdgehealTunnelFailed", "default")):
        assert alert in names
        proc = _amtool("config", "routes", "test", f"--config.file={ROUTE}",
                       f"alertname={alert}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.split() == [receiver], (alert, proc.stdout)
    doc = yaml.safe_load(ROUTE.read_text())
    hook = next(r for r in doc["receivers"]
                if r["name"] == "edgeheal-fleet-hold")["webhook_configs"][0]
    assert hook["send_resolved"] is True
    assert hook["url"].endswith("/alertmanager")
