"""End to end: the lab's stale-nat-restart scenario (see docs/lab.md): the same stale
mapping is not healed by Flannel restarts alone (the device comes back on port 51820)."""

from tests.lab.support import scenario_test

test_stale_nat_restart_passes = scenario_test("stale-nat-restart")
