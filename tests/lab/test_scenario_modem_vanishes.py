"""End to end: the lab's modem-vanishes scenario (see docs/lab.md, docs/remediation-uplink.md)."""

from tests.lab.support import scenario_test

test_modem_vanishes_passes = scenario_test("modem-vanishes")
