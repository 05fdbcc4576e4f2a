"""Write the state files release 0.2.0 leaves in ``state_dir``, as checked-in fixtures.

Why: an upgrade must read what the previous release wrote, and the only honest sample of
that is a file written by that release's own code. This script was run once on the tree
of release 0.2.0 (before state files carried a format version) and its output committed
under ``fixtures/release-0.2.0``; ``test_release_files.py`` reads those files with the
current code. Do not regenerate them with a newer tree: they would stop being 0.2.0's.

    python -m tests.upgrade.make_fixtures tests/upgrade/fixtures/release-0.2.0

What is in them (the tests assert each):

- ``alerts.sqlite3``: three queued alerts (ids in :data:`QUEUED`, raised 2026-12-04) and the
  open-problems record of one open ``wireguard`` problem (:data:`PROBLEM`);
- ``remediation-history.json``: two Flannel attempts, ``failures_in_row`` 2, the circuit
  open, an indefinite pause, written in the boot :data:`BOOT_ID`;
- ``uplink-history.json``: one uplink rung, ``failures_in_row`` 1, ``direct_was_down``.
"""

from __future__ import annotations

import math
import sys
from datetime import datetime
from pathlib import Path

from edgeheal.agent.alerts import lifecycle
from edgeheal.agent.alerts.outbox import Outbox
from edgeheal.agent.alerts.payload import build
from edgeheal.agent.remediation.history import Timeline, save
from edgeheal.base.compat import UTC
from edgeheal.core.safeguards import History, Record

BOOT_ID = "0a2e0000-0000-4000-8000-000000000020"
OFFSET = 1000.0
"""The fixture's boottime is its monotonic time plus this."""
WALL = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
QUEUED = ("01KBQ0FIXTURE0000000000001", "01KBQ0FIXTURE0000000000002",
          "01KBQ0FIXTURE0000000000003")
PROBLEM = lifecycle.Problem("01KBQ0FIXTURE0000000000001", "wireguard.dead",
                            "wireguard.recovered", "failed", "dead",
                            "2026-12-04T11:59:00Z", 0.0)


class _Ids:
    def __init__(self) -> None:
        self.left = list(QUEUED)

    def __call__(self, wall: datetime) -> str:
        return self.left.pop(0)


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    box = Outbox(out / "alerts.sqlite3", max_count=10000, max_age=365 * 86400.0,
                 wall=WALL.timestamp)
    ids = _Ids()
    for kind, message in (("wireguard.dead", "wireguard: failed (dead): peer x"),
                          ("agent.test", "a test alert queued before the upgrade"),
                          ("remediation.restarted", "restarted Flannel (pod)")):
        alert = build(kind, node="edge-upgrade", message=message, wall=WALL, ids=ids)  # type: ignore[arg-type]
        box.add(alert.id, kind, WALL.timestamp(), alert.encode())
    box.set_meta("problems", lifecycle.record(lifecycle.Problems({"wireguard": PROBLEM})))
    box.close()
    timeline = Timeline(BOOT_ID, OFFSET)
    flannel = History(records=(
        Record(mono=10.0, wall="2026-12-04T11:50:00Z", mode="pod", reason="tunnel_dead",
               result="not_recovered", duration=12.5, target="kube-flannel/kube-flannel-ds-a"),
        Record(mono=400.0, wall="2026-12-04T11:56:30Z", mode="pod", reason="tunnel_dead",
               result="in_progress", duration=0.0, target="kube-flannel/kube-flannel-ds-b")),
        failures_in_row=2, circuit_open=True, paused_until=math.inf)
    save(out / "remediation-history.json", flannel, timeline)
    uplink = History(records=(
        Record(mono=200.0, wall="2026-12-04T11:53:20Z", mode="modem-reset",
               reason="uplink_stuck", result="not_recovered", duration=30.0,
               target="wwan0", action="modem-reset"),),
        failures_in_row=1, direct_was_down=True)
    save(out / "uplink-history.json", uplink, timeline)


if __name__ == "__main__":
    write(Path(sys.argv[1]))
