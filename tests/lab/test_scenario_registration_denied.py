"""End to end: the lab's registration-denied scenario (docs/remediation-uplink.md)."""

from tests.lab.support import scenario_test

test_registration_denied_passes = scenario_test("registration-denied")
