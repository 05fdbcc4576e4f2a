"""The path verdict: which network path is at fault, from the MQTT targets' states.

Why: the field incident's signature was "the host reaches the cloud, the containers do
not". With one MQTT target per path (``path = "tunnel"`` through Flannel's WireGuard,
``path = "direct"`` over the host's own route), comparing them says where the fault is,
and whether restarting Flannel can help — the remediation policy reads this verdict.

A path *works* when at least one of its targets is serving (ok/degraded), *fails* when
every one of its targets that has a result is ``failed``, and is ``unknown`` otherwise
(no targets, no results yet, or only ``unknown`` results). States are the effective,
debounced ones from the snapshot. Pure: no I/O, no clock.

============  ============  ====================  ==========================================
tunnel        direct        fault                 restart_flannel_helps
============  ============  ====================  ==========================================
works         works         ``none``              False
fails         works         ``tunnel``            True: the tunnel alone is broken
fails         fails         ``uplink_or_cloud``   False: the uplink or the broker is down
works         fails         ``direct_path``       False: the host's own route is broken
fails         unknown       ``tunnel_or_uplink``  None: cannot tell without a direct target
other         other         ``unknown``           None
============  ============  ====================  ==========================================
"""

from __future__ import annotations

from typing import Any

from edgeheal.config import Config
from edgeheal.model import Snapshot, State

_VERDICTS: dict[tuple[str, str], tuple[str, bool | None, str]] = {
    ("works", "works"): ("none", False, "both paths reach their brokers"),
    ("fails", "works"): ("tunnel", True, "the tunnel path fails while the direct path "
                         "works: the tunnel is at fault"),
    ("fails", "fails"): ("uplink_or_cloud", False, "both paths fail: the uplink or the "
                         "cloud is at fault; restarting Flannel would not help"),
    ("works", "fails"): ("direct_path", False, "the direct path fails while the tunnel "
                         "works: the host's own route is at fault"),
    ("fails", "unknown"): ("tunnel_or_uplink", None, "the tunnel path fails and there is "
                           "no direct-path result to tell tunnel from uplink"),
}


def _path_state(snapshot: Snapshot, names: list[str]) -> str:
    states = [snapshot.checks[n].state for n in names
              if n in snapshot.checks and snapshot.checks[n].completed]
    if any(s.serving for s in states):
        return "works"
    if states and all(s is State.FAILED for s in states):
        return "fails"
    return "unknown"


def path_verdict(snapshot: Snapshot, config: Config) -> dict[str, Any]:
    """The verdict as a JSON-ready dict (``/status`` extras ``path``)."""
    names: dict[str, list[str]] = {"tunnel": [], "direct": []}
    for target in config.mqtt.targets:
        if target.enabled:
            names[target.path].append(target.name)
    tunnel = _path_state(snapshot, names["tunnel"])
    direct = _path_state(snapshot, names["direct"])
    fault, helps, message = _VERDICTS.get(
        (tunnel, direct), ("unknown", None, "not enough path results for a verdict"))
    return {"tunnel": tunnel, "direct": direct, "fault": fault,
            "restart_flannel_helps": helps, "message": message,
            "targets": {path: list(n) for path, n in names.items()}}
