"""End to end: the lab's uplink-failover scenario (see docs/lab.md)."""

from tests.lab.support import scenario_test

test_uplink_failover_passes = scenario_test("uplink-failover")
