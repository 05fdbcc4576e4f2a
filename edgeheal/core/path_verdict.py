"""The path verdict: which network path is at fault, from the MQTT targets' states.

Why: the field incident's signature was "the host reaches the cloud, the containers do
not". With one MQTT target per path (``path = "tunnel"`` through Flannel's WireGuard,
``path = "direct"`` over the host's own route), comparing them says where the fault is,
and whether restarting Flannel can help — the remediation policy reads this verdict.

A path *works* when at least one of its targets is serving (ok/degraded), *fails* when
every one of its targets that has a result is ``failed``, and is ``unknown`` otherwise
(no targets, no results yet, or only ``unknown`` results). States are the effective,
debounced ones from the snapshot. Pure: no I/O, no clock.

The projection of a snapshot onto the two paths (:func:`by_path`: which targets belong to
which path, and their completed statuses) is made here and nowhere else; the remediation
policy reads the same projection (:func:`edgeheal.core.flannel_ladder.view_of`). The policy then
asks for stricter evidence than this verdict before it restarts anything (*every* direct-path
target ``ok``, not just one serving), because a wrong restart costs more than a wrong line
in ``/status``.

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from edgeheal.model import CheckStatus, Snapshot, State

if TYPE_CHECKING:
    from edgeheal.config import Config

Path = Literal["tunnel", "direct"]
PATHS: tuple[Path, ...] = ("tunnel", "direct")

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


def targets(config: Config, path: Path) -> tuple[str, ...]:
    """The enabled MQTT targets (check names) of one path, in configuration order."""
    return tuple(t.name for t in config.mqtt.targets if t.enabled and t.path == path)


@dataclass(frozen=True, slots=True)
class ByPath:
    """The MQTT targets of each path and the completed statuses among them."""

    names: Mapping[Path, tuple[str, ...]]
    """Every enabled target of each path, whether it has a result yet or not."""
    statuses: Mapping[Path, Mapping[str, CheckStatus]]
    """Each path's targets that completed at least one run."""

    def states(self, path: Path) -> dict[str, State]:
        return {name: s.state for name, s in self.statuses[path].items()}

    def state(self, path: Path) -> str:
        """``works``, ``fails`` or ``unknown`` (see the module docstring)."""
        states = list(self.states(path).values())
        if any(s.serving for s in states):
            return "works"
        if states and all(s is State.FAILED for s in states):
            return "fails"
        return "unknown"


def by_path(snapshot: Snapshot | Mapping[str, CheckStatus], config: Config) -> ByPath:
    """Project a snapshot (or the statuses it is about to be built from) onto the paths."""
    checks = snapshot.checks if isinstance(snapshot, Snapshot) else snapshot
    names = {path: targets(config, path) for path in PATHS}
    statuses = {path: {n: checks[n] for n in names[path] if n in checks and checks[n].completed}
                for path in PATHS}
    return ByPath(names=names, statuses=statuses)


def path_verdict(snapshot: Snapshot | Mapping[str, CheckStatus],
                 config: Config) -> dict[str, Any]:
    """The verdict as a JSON-ready dict (``/status`` extras ``path``)."""
    paths = by_path(snapshot, config)
    tunnel, direct = paths.state("tunnel"), paths.state("direct")
    fault, helps, message = _VERDICTS.get(
        (tunnel, direct), ("unknown", None, "not enough path results for a verdict"))
    return {"tunnel": tunnel, "direct": direct, "fault": fault,
            "restart_flannel_helps": helps, "message": message,
            "targets": {path: list(n) for path, n in paths.names.items()}}
