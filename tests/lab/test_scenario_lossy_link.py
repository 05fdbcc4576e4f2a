"""End to end: the lab's lossy-link scenario (see docs/lab.md)."""

from tests.lab.support import scenario_test

test_lossy_link_passes = scenario_test("lossy-link")
