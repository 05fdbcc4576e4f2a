"""End to end: the lab's uplink-outage scenario (see docs/lab.md)."""

from tests.lab.support import scenario_test

test_uplink_outage_passes = scenario_test("uplink-outage")
