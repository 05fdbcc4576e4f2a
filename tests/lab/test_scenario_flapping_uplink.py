"""End to end: the lab's flapping-uplink scenario (see docs/lab.md)."""

from tests.lab.support import scenario_test

test_flapping_uplink_passes = scenario_test("flapping-uplink")
