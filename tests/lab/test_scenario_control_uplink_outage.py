"""End to end: the lab's control-uplink-outage scenario (docs/control.md): a 90 s uplink
outage on a node with the control ladder on turns it NotReady and the control check says
``server_unreachable``; after it the stand-in K3s agent finds its server by itself, and
the ladder restarts nothing."""

from tests.lab.support import scenario_test

test_an_uplink_outage_restarts_no_agent = scenario_test("control-uplink-outage")
