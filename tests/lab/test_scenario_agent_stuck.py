"""End to end: the lab's agent-stuck scenario (docs/control.md): the stand-in K3s agent's
load balancer sticks while the tunnel is fine; one k3s-agent restart and the node is Ready
again. Without the agent the same world stays NotReady to the end (the scenario's
expectations say so): the restart, not time, is what cures it."""

from tests.lab.support import scenario_test

test_agent_stuck_is_cured_by_one_agent_restart = scenario_test("agent-stuck")
test_agent_stuck_stays_broken_without_edgeheal = scenario_test("agent-stuck", "--no-agent")
