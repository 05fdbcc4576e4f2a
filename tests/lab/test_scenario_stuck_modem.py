"""End to end: the lab's stuck-modem scenario (see docs/lab.md, docs/uplink-privileges.md)."""

from tests.lab.support import scenario_test

test_stuck_modem_passes = scenario_test("stuck-modem")
