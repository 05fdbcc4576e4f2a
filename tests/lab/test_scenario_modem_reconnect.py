"""End to end: the lab's modem-reconnect scenario (see docs/lab.md)."""

from tests.lab.support import scenario_test

test_modem_reconnect_passes = scenario_test("modem-reconnect")
