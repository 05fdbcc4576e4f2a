"""End to end: the lab's port-drift-restart scenario (see docs/lab.md): the same port drift
with Flannel restarts only; the first restart heals it (the configured endpoint again)."""

from tests.lab.support import scenario_test

test_port_drift_restart_passes = scenario_test("port-drift-restart")
