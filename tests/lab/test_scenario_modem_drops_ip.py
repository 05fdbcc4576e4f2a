"""End to end: the lab's modem-drops-ip scenario (see docs/lab.md)."""

from tests.lab.support import scenario_test

test_modem_drops_ip_passes = scenario_test("modem-drops-ip")
