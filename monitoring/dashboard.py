"""Build the Grafana dashboard ``monitoring/dashboards/edgeheal.json`` from the panel table below.

Why generated: a Grafana dashboard is a long JSON document in which the part that matters,
each panel's PromQL, is buried among layout and styling. Here every panel is one row of a
table (title, kind, queries); the JSON is written from it, committed, and
tests/monitoring/test_rules.py checks that the committed file is what this script writes
and that every query parses with promtool and names only metrics of the golden /metrics
file. After a change::

    python monitoring/dashboard.py          # rewrites monitoring/dashboards/edgeheal.json

Two rows: the fleet (nodes by state, failed tunnels, direct-path outages, firing alerts)
and a node drill-down picked with the ``instance`` variable (tunnel, probes, remediation,
alerts pipeline, the agent itself).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("dashboards") / "edgeheal.json"
UID = "edgeheal-fleet"
N = 'instance=~"$instance"'
"""The node selector of the drill-down panels."""

Query = tuple[str, str]
"""(PromQL, legend)"""

FLEET: list[tuple[str, str, int, list[Query], str]] = [
    # title, kind, width, queries, unit
    ("Nodes by state", "stat", 8,
     [("state:edgeheal_nodes:count", "{{state}}")], "none"),
    ("Agents not scraped", "stat", 4,
     [('count(up{job="edgeheal"} == 0) or vector(0)', "down")], "none"),
    ("Direct path down (nodes)", "stat", 4,
     [("count(instance:edgeheal_direct_path_down:bool == 1) or vector(0)", "nodes")], "none"),
    ("Firing edgeheal alerts", "stat", 8,
     [('count by (alertname) (ALERTS{alertname=~"Edgeheal.*", alertstate="firing"})',
       "{{alertname}}")], "none"),
    ("Worst state per node (0 ok, 1 degraded, 2 unknown, 3 failed)", "state-timeline", 24,
     [("instance:edgeheal_node_state:worst", "{{instance}}")], "none"),
    ("Failed tunnels by reason", "timeseries", 12,
     [('count by (reason) (edgeheal_check_reason{check="wireguard"} == 1 and on (job, '
       'instance) edgeheal_check_state{check="wireguard", state="failed"} == 1)',
       "{{reason}}")], "none"),
    ("Flannel restarts in the last hour", "timeseries", 12,
     [("sum by (instance) (instance:edgeheal_flannel_restarts:increase1h) > 0",
       "{{instance}}")], "none"),
    ("Uplink data plan: the nodes nearest their plan (% used, forecast)", "bargauge", 24,
     [("topk(10, 100 * edgeheal_uplink_period_bytes / (edgeheal_uplink_plan_bytes > 0))",
       "{{instance}} used"),
      ("topk(10, 100 * edgeheal_uplink_period_forecast_bytes"
       " / (edgeheal_uplink_plan_bytes > 0))", "{{instance}} forecast")], "percent"),
]

NODE: list[tuple[str, str, int, list[Query], str]] = [
    # the tunnel
    ("Check states", "state-timeline", 12,
     [(f"edgeheal_check_reason{{{N}}} == 1", "{{check}}: {{reason}}")], "none"),
    ("Ready (/readyz)", "stat", 4, [(f"edgeheal_ready{{{N}}}", "ready")], "bool"),
    ("Remediation circuit open", "stat", 4,
     [(f"edgeheal_remediation_circuit_open{{{N}}}", "{{ladder}}")], "bool"),
    ("Remediation paused", "stat", 4,
     [(f"edgeheal_remediation_paused{{{N}}}", "{{ladder}}")], "bool"),
    ("Handshake age (watched peers)", "timeseries", 12,
     [(f'edgeheal_wireguard_handshake_age_seconds{{{N}, watched="true"}}',
       "{{interface}} {{peer}}")], "s"),
    ("Tunnel traffic (watched peers)", "timeseries", 12,
     [(f'rate(edgeheal_wireguard_receive_bytes_total{{{N}, watched="true"}}'
       "[$__rate_interval])", "rx {{peer}}"),
      (f'rate(edgeheal_wireguard_transmit_bytes_total{{{N}, watched="true"}}'
       "[$__rate_interval])", "tx {{peer}}")], "Bps"),
    ("Uplink traffic", "timeseries", 12,
     [(f"sum by (interface, direction) (rate(edgeheal_uplink_bytes_total{{{N}}}"
       "[$__rate_interval]))", "{{interface}} {{direction}}")], "Bps"),
    ("Uplink data this billing period", "timeseries", 12,
     [(f"edgeheal_uplink_period_bytes{{{N}}}", "used"),
      (f"edgeheal_uplink_period_forecast_bytes{{{N}}}", "forecast at the 24 h rate"),
      (f"edgeheal_uplink_plan_bytes{{{N}}} > 0", "plan")], "decbytes"),
    # the probes
    ("MQTT targets up", "state-timeline", 12,
     [(f"edgeheal_mqtt_up{{{N}}}", "{{target}} ({{path}})")], "bool"),
    ("MQTT connect time", "timeseries", 12,
     [(f"edgeheal_mqtt_connect_seconds{{{N}}}", "{{target}}")], "s"),
    ("Check duration, p90", "timeseries", 12,
     [("histogram_quantile(0.9, sum by (check, le) (rate(edgeheal_check_duration_seconds_bucket"
       f"{{{N}}}[$__rate_interval])))", "{{check}}")], "s"),
    ("Check runs by outcome", "timeseries", 12,
     [(f'sum by (check, result) (rate(edgeheal_check_runs_total{{{N}, result!="completed"}}'
       "[$__rate_interval]))", "{{check}} {{result}}")], "ops"),
    # remediation
    ("Remediation decisions (1h)", "timeseries", 12,
     [(f"sum by (action, result) (increase(edgeheal_remediations_total{{{N}}}[1h])) > 0",
       "{{action}} {{result}}")], "none"),
    ("Restart budget left, failures in a row", "timeseries", 12,
     [(f"edgeheal_remediation_budget_remaining{{{N}}}", "budget left {{ladder}}"),
      (f"edgeheal_remediation_failures_in_row{{{N}}}", "failures in a row {{ladder}}")],
     "none"),
    # the alerts pipeline
    ("Alert outbox", "timeseries", 12,
     [(f"edgeheal_alerts_outbox_depth{{{N}}}", "queued"),
      (f"edgeheal_alerts_memory_queue{{{N}}}", "held in memory")], "none"),
    ("Oldest undelivered alert", "timeseries", 12,
     [(f"edgeheal_alerts_outbox_oldest_age_seconds{{{N}}}", "age")], "s"),
    ("Alerts raised, published, dropped", "timeseries", 12,
     [(f"sum by (kind) (increase(edgeheal_alerts_raised_total{{{N}}}[$__rate_interval])) > 0",
       "raised {{kind}}"),
      (f"increase(edgeheal_alerts_published_total{{{N}}}[$__rate_interval])", "published"),
      (f"sum by (reason) (increase(edgeheal_alerts_dropped_total{{{N}}}[$__rate_interval]))"
       " > 0", "dropped {{reason}}")], "none"),
    ("Outbox fault", "state-timeline", 12,
     [(f"edgeheal_alerts_outbox_fault{{{N}}} == 1", "{{fault}}")], "none"),
    # offload and the agent
    ("Offload features on", "timeseries", 12,
     [(f"edgeheal_offload_feature_enabled{{{N}}}", "{{interface}} {{feature}}")], "none"),
    ("Agent memory and descriptors", "timeseries", 12,
     [(f"edgeheal_resident_memory_bytes{{{N}}}", "RSS"),
      (f"edgeheal_open_fds{{{N}}}", "open fds")], "none"),
]


def _panel(pid: int, row: tuple[str, str, int, list[Query], str],
           pos: tuple[int, int]) -> dict[str, Any]:
    title, kind, width, queries, unit = row
    return {
        "id": pid, "type": kind, "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": pos[0], "y": pos[1], "w": width, "h": 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(queries)],
    }


def _row(pid: int, title: str, y: int) -> dict[str, Any]:
    return {"id": pid, "type": "row", "title": title, "collapsed": False,
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for title, table in (("Fleet", FLEET), ("Node $instance", NODE)):
        panels.append(_row(pid, title, y))
        pid, y, x = pid + 1, y + 1, 0
        for row in table:
            width = row[2]
            if x + width > 24:
                x, y = 0, y + 8
            panels.append(_panel(pid, row, (x, y)))
            pid, x = pid + 1, x + width
        y += 8
    return {
        "uid": UID, "title": "edgeheal", "tags": ["edgeheal"], "editable": True,
        "schemaVersion": 39, "version": 1, "timezone": "utc", "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Prometheus"},
            {"name": "instance", "type": "query", "label": "node",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": 'label_values(up{job="edgeheal"}, instance)',
                       "refId": "instance"},
             "definition": 'label_values(up{job="edgeheal"}, instance)',
             "refresh": 2, "multi": False, "includeAll": False, "sort": 1},
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every query in a dashboard document."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((f"panel {panel['id']} ({panel['title']}) {target['refId']}",
                        target["expr"]))
    return out


if __name__ == "__main__":
    if sys.argv[1:] not in ([], ["--check"]):
        sys.exit("usage: dashboard.py [--check]")
    text = render()
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if OUT.read_text() == text else f"{OUT} is out of date")
    OUT.write_text(text)
