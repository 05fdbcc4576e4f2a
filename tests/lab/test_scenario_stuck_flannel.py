"""End to end: the lab's stuck-flannel scenario (see docs/lab.md)."""

from tests.lab.support import scenario_test

test_stuck_flannel_passes = scenario_test("stuck-flannel")
