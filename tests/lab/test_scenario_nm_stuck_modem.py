"""End to end: the lab's nm-stuck-modem scenario (docs/remediation-uplink.md)."""

from tests.lab.support import scenario_test

test_nm_stuck_modem_passes = scenario_test("nm-stuck-modem")
