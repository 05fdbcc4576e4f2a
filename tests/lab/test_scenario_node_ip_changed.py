"""End to end: the lab's node-ip-changed scenario (docs/control.md): the node's address
changes under the running stand-in K3s agent; the Node keeps the old InternalIP until one
k3s-agent restart re-registers it. Without the agent it keeps the old one to the end."""

from tests.lab.support import scenario_test

test_node_ip_changed_is_cured_by_one_agent_restart = scenario_test("node-ip-changed")
test_node_ip_changed_stays_wrong_without_edgeheal = scenario_test("node-ip-changed",
                                                                  "--no-agent")
