"""End to end: the stuck-flannel scenario with field timings (K = 25 s, the shipped
defaults; ``edgeheal lab --field``, see docs/lab.md)."""

from tests.lab.support import scenario_test

test_stuck_flannel_passes_with_field_timings = scenario_test("stuck-flannel", "--field")
