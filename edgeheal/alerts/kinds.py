"""The closed table of alert kinds: every alert edgeheal can raise, with its severity.

One dict, so a subscriber's documentation (``docs/alerts.md``) and the code cannot drift
(a test keeps them in step), and so later subsystems add their rows here — the
remediation kinds (``remediation.*``) go in :data:`KINDS` like any other. A kind is
``<check or subsystem>.<event>``. Raising a kind that is not in the table is a programming
error (``KeyError``), never a silent new kind.

``severity`` is the default; :func:`severity` applies the one rule that depends on the
check: a problem on a check that is not ``required`` is at most ``warning``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")


@dataclass(frozen=True, slots=True)
class Kind:
    severity: Severity
    doc: str
    problem: bool = False
    """Opens (or escalates) a problem that reminders repeat and a recovery clears."""


KINDS: dict[str, Kind] = {
    "wireguard.rekey_failing": Kind(
        "warning", "Handshakes are not being answered; the session still works for now.",
        problem=True),
    "wireguard.stalled": Kind(
        "critical", "Data is sent through the tunnel but nothing comes back.", problem=True),
    "wireguard.dead": Kind(
        "critical", "No handshake for longer than REJECT_AFTER_TIME: the tunnel carries "
        "nothing.", problem=True),
    "wireguard.failed": Kind(
        "critical", "The tunnel failed for a reason of Flannel's own state: `no_peers` (the "
        "device lost its peers), `never_connected` or `interface_missing`; `detail.reason` "
        "says which.", problem=True),
    "wireguard.recovered": Kind("info", "The tunnel works again (clears the problem)."),
    "mqtt.unreachable": Kind(
        "critical", "An MQTT target cannot be reached or refuses us (critical for required "
        "targets, warning otherwise). `detail.reason` says how, `detail.path` which path.",
        problem=True),
    "mqtt.recovered": Kind("info", "The MQTT target answers again (clears the problem)."),
    "offload.drift_corrected": Kind(
        "warning", "TX checksum offload was found on again and was turned off."),
    "offload.cannot_disable": Kind(
        "critical", "TX checksum offload is on and cannot be turned off.", problem=True),
    "offload.recovered": Kind("info", "Offload is off again (clears the problem)."),
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
    "remediation.circuit_open": Kind(
        "critical", "`give_up_after` restarts did not cure the tunnel: no more restarts "
        "until it is healthy again or `edgeheal remediation reset`. A human is needed."),
    "agent.started": Kind(
        "info", "The agent started; `detail.previous_run` is `clean`, `unclean` (killed, "
        "crashed or power loss) or `none` (first start)."),
    "agent.test": Kind("info", "A test alert asked for with `edgeheal alert test`."),
    "alerts.dropped": Kind(
        "warning", "The outbox hit a bound (`outbox_max_count`/`outbox_max_age`); "
        "`detail.dropped` alerts were lost, oldest first."),
}
"""Every kind edgeheal raises. Add rows here (e.g. ``remediation.*``); keep docs in step."""


def severity(kind: str, *, required: bool = True) -> Severity:
    """The severity of ``kind``; a problem on a non-required check is at most a warning."""
    sev = KINDS[kind].severity
    if not required and sev == "critical" and KINDS[kind].problem:
        return "warning"
    return sev
