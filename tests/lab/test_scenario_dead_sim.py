"""End to end: the lab's dead-sim scenario (docs/remediation-uplink.md): one radio off/on,
then the opt-in sim-switch rung makes the working SIM primary and the uplink heals."""

from tests.lab.support import scenario_test

test_dead_sim_passes = scenario_test("dead-sim")
