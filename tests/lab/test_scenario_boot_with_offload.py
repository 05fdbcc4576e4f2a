"""End to end: the lab's boot-with-offload scenario (see docs/lab.md)."""

from tests.lab.support import scenario_test

test_boot_with_offload_passes = scenario_test("boot-with-offload")
