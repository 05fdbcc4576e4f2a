"""The closed table of alert kinds: every alert edgeheal can raise, with its severity.

One table, so a subscriber's documentation (``docs/alerts.md``) and the code cannot drift
(a test keeps them in step). A check module brings its own kinds in its registration
(:mod:`edgeheal.checks`); the subsystems above the checks add theirs here. A kind is
``<check or subsystem>.<event>``. Raising a kind that is not in the table is a programming
error (``KeyError``), never a silent new kind.

``severity`` is the default; :func:`severity` applies the one rule that depends on the
check: a problem on a check that is not ``required`` is at most ``warning``.
"""

from __future__ import annotations

from edgeheal import checks
from edgeheal.model import Kind, Severity

SUBSYSTEM_KINDS: dict[str, Kind] = {
    "check.failed": Kind(
        "critical", "Any other check left `ok` (its `detail.state`/`detail.reason` say "
        "how); warning when the check is not required.", problem=True),
    "check.recovered": Kind("info", "That check is `ok` again (clears the problem)."),
    "remediation.restarted": Kind(
        "warning", "edgeheal restarted this node's Flannel (`detail.mode`: pod or "
        "k3s-service; `detail.target`: the pod or unit)."),
    "remediation.recovered": Kind("info", "The tunnel recovered after a restart."),
    "remediation.failed": Kind(
        "critical", "A restart could not be carried out, or did not cure the tunnel within "
        "`verify_timeout`; `detail` says which (a permission problem needs a human)."),
    "remediation.skipped": Kind(
        "warning", "The tunnel failed but edgeheal did not restart it; `detail.reason` "
        "names the safeguard (e.g. `direct_path_down`: an uplink or cloud outage)."),
    "fleet.hold_refused": Kind(
        "warning", "A message on `<topic_prefix>/fleet/hold` was refused and not obeyed "
        "(`detail.why`: not JSON, an unknown key, no `until`, a hold longer than "
        "`[fleet] max_hold`, ...); said once per message."),
    "remediation.circuit_open": Kind(
        "critical", "`give_up_after` restarts did not cure the tunnel: no more restarts "
        "until it is healthy again or `edgeheal remediation reset`. A human is needed."),
    "uplink_ladder.restarted": Kind(
        "warning", "The uplink ladder carried out a rung on a stuck uplink (`detail.mode`: "
        "modem-reconnect, link-bounce, usb-reauthorize or reboot; `detail.target`)."),
    "uplink_ladder.recovered": Kind(
        "info", "The uplink carries traffic again after a rung (or its circuit closed)."),
    "uplink_ladder.failed": Kind(
        "critical", "A rung could not be carried out, or the uplink did not recover within "
        "`verify_timeout`; the next attempt tries the next rung."),
    "uplink_ladder.skipped": Kind(
        "warning", "The uplink failed but no rung was tried; `detail.reason` says why "
        "(`no_coverage`, `link_down`, `no_address`, `no_route`, `uplink_unknown`, "
        "`direct_path_ok`, `stuck_window`, a safeguard, `reboot_once_a_day`, "
        "`alert_not_durable`, or a dry run)."),
    "uplink_ladder.circuit_open": Kind(
        "critical", "Every usable rung (or `give_up_after` of them) failed to cure the stuck "
        "uplink: no more rungs until it is ok again or `edgeheal remediation reset --ladder "
        "uplink`. A human is needed."),
    "uplink_ladder.rebooting": Kind(
        "critical", "The uplink ladder reboots the node now (its last rung); raised and "
        "committed to the outbox before logind is asked."),
    "control_ladder.restarted": Kind(
        "warning", "The control ladder restarted the K3s agent's unit (`detail.reason`: "
        "`control_heartbeat_stale`, `control_balancer_stuck`, `control_node_ip_changed` or "
        "`control_not_ready`; `detail.target`: the unit; for `balancer_stuck`, "
        "`detail.balancer_state`: whether its state file was removed first). The workloads "
        "keep running."),
    "control_ladder.recovered": Kind(
        "info", "The control check is ok again after an agent restart (or its circuit "
        "closed)."),
    "control_ladder.failed": Kind(
        "critical", "An agent restart could not be carried out (`detail.result` "
        "`config_problem`: the polkit rule, no K3s unit), or the control check was not ok "
        "again within `verify_timeout`."),
    "control_ladder.skipped": Kind(
        "warning", "The control check failed but the agent was not restarted; "
        "`detail.reason` says why (`server_unreachable`, `fleet_hold`, `path_down`, "
        "`other_ladder`, `verdict_window`, a safeguard, or a dry run)."),
    "control_ladder.circuit_open": Kind(
        "critical", "`give_up_after` agent restarts in a row did not cure the control path: "
        "no more until it is ok again or `edgeheal remediation reset --ladder control`. A "
        "human is needed."),
    "agent.started": Kind(
        "info", "The agent started; `detail.previous_run` is `clean`, `unclean` (killed, "
        "crashed or power loss) or `none` (first start)."),
    "agent.state_reset": Kind(
        "warning", "A state file (or record) the agent could not use — damaged, too large, "
        "nested too deep or of the wrong shape — was moved aside and the agent started "
        "afresh without it: `detail.file`, `detail.reason`, `detail.moved_to`."),
    "agent.state_newer": Kind(
        "warning", "A state file is of a newer format than this build reads (written by a "
        "later release: a downgrade). It is left untouched and that state is kept in memory "
        "for this run (the outbox holds alerts in memory; a history starts empty, so its "
        "budget and circuit are not enforced from the file): `detail.file`, "
        "`detail.format`, `detail.known_format`. Upgrade again, or move the file aside."),
    "alerts.duplicate_client_id": Kind(
        "critical", "The alert broker keeps ending this agent's session because another "
        "client connects with the same client id (MQTT's session takeover, "
        "3 times in 10 minutes): usually two agents with the same "
        "`node_name` on one broker, knocking each other off; alerts are delayed and the "
        "broker check flaps. Raised once per run: `detail.client_id`, `detail.takeovers`, "
        "`detail.evidence` (`session_taken_over`: MQTT 5's reason 0x8E; "
        "`closed_by_broker`: a clean close with no reason, as MQTT 3.1.1 and older "
        "Mosquitto releases do it)."),
    "agent.test": Kind("info", "A test alert asked for with `edgeheal alert test`."),
    "alerts.dropped": Kind(
        "warning", "Undelivered alerts were lost, oldest first: `detail.dropped` of them; "
        "`detail.bound` says why (`outbox_max_count`, `outbox_max_age`, `memory_queue`: "
        "the outbox could not be written and memory was full, `outbox_corrupt`: the file "
        "was moved aside, with `detail.unknown` if its alerts could not be counted)."),
}
"""The kinds of the subsystems above the checks (remediation, the agent, the alert
pipeline) and the generic ``check.*`` pair for a check module without its own kinds."""

KINDS: dict[str, Kind] = {**checks.kinds(), **SUBSYSTEM_KINDS}
"""Every kind edgeheal raises: each check module's own (its :class:`Registration`), then
the subsystems'. ``docs/alerts.md`` and ``schemas/alert.schema.json`` are kept in step by a
test."""


def markdown_table() -> str:
    """The closed table as ``docs/alerts.md`` shows it (``edgeheal alert kinds``)."""
    rows = ["| kind | severity | opens a problem | meaning |", "|---|---|---|---|"]
    rows += [f"| `{name}` | {kind.severity} | {'yes' if kind.problem else ''} | {kind.doc} |"
             for name, kind in KINDS.items()]
    return "\n".join(rows) + "\n"


def schema_enum() -> list[str]:
    """The ``kind`` enum of ``schemas/alert.schema.json`` (``edgeheal alert kinds --enum``)."""
    return sorted(KINDS)


def severity(kind: str, *, required: bool = True) -> Severity:
    """The severity of ``kind``; a problem on a non-required check is at most a warning."""
    sev = KINDS[kind].severity
    if not required and sev == "critical" and KINDS[kind].problem:
        return "warning"
    return sev
