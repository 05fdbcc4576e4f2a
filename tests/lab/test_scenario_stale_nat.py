"""End to end: the lab's stale-nat scenario (see docs/lab.md): a carrier NAT's stale
mapping, healed by the rebind rung with no Flannel restart."""

from tests.lab.support import scenario_test

test_stale_nat_passes = scenario_test("stale-nat")
