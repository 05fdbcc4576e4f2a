"""End to end: the lab's no-coverage scenario (see docs/lab.md, docs/uplink-privileges.md)."""

from tests.lab.support import scenario_test

test_no_coverage_passes = scenario_test("no-coverage")
