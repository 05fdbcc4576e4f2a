"""End to end: the lab's dead-neighbour scenario (see docs/lab.md)."""

from tests.lab.support import scenario_test

test_dead_neighbour_passes = scenario_test("dead-neighbour")
