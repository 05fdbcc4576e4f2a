"""The lab's scenarios: each reproduces a field condition and states what must happen.

Every scenario returns its expectations, judged only on what the runner observed from the
outside (agent /status and /metrics, the test API's deletions and Events, the alert
subscriber, the collector's counters, the cloud kernel's ``InCsumErrors``).
"""

from __future__ import annotations

from edgeheal.lab.runner import Expectation, Lab, Scenario
from edgeheal.lab.world import Edge

TUNNEL_UP_BUDGET = 60.0
"""Seconds for a tunnel to come up once nothing blocks it (handshake retries every 5 s)."""


def _ok(lab: Lab, edge: Edge) -> bool:
    return lab.state(edge, "wireguard") == "ok"


def _alerts(lab: Lab, kind: str, node: str | None = None) -> list[dict[str, object]]:
    return [a for a in lab.world.alerts() if a.get("kind") == kind
            and (node is None or a.get("node") == node)]


async def boot_with_offload(lab: Lab) -> list[Expectation]:
    """The edge boots with offload on: no handshake reaches the cloud until the agent
    turns offload off; then the tunnel comes up with no Flannel restart."""
    edge = lab.world.edges[0]
    # K3s and Flannel are up, the agent is not yet: no handshake gets through
    corrupted_early = await lab.until(
        lambda: any(e["event"] == "corrupted" for e in lab.world.nic_events(edge)), 30,
        "the first corrupted handshake")
    await lab.hold(6)  # a few more failed attempts, for the record
    no_handshake = lab.world.last_handshake(edge) == 0
    if lab.world.with_agent:
        lab.world.start_agent(edge, remediation=lab.remediation)
        lab.note("lab", "agent started", edge.name)
    started = lab.mark("agent_started")
    up = await lab.until(lambda: _ok(lab, edge), TUNNEL_UP_BUDGET + 30, "the tunnel to come up")
    t_up = lab.mark("tunnel_up")
    csum_errors = lab.world.cloud_in_csum_errors()
    corrupted = sum(1 for e in lab.world.nic_events(edge) if e["event"] == "corrupted")
    before = lab.world.collector_stats(edge).get("delivered", 0) or 0
    await lab.hold(10)
    after = lab.world.collector_stats(edge).get("delivered", 0) or 0
    boot = lab.metric(edge, "edgeheal_offload_corrections_total", cause="boot")
    later = lab.metric(edge, "edgeheal_offload_corrections_total") - boot
    return [
        Expectation("before the agent ran, the faulty NIC corrupted every handshake, the cloud "
                    "kernel dropped them and the tunnel could not come up",
                    corrupted_early and no_handshake and corrupted > 0 and csum_errors > 0,
                    f"{corrupted} handshakes corrupted, cloud InCsumErrors {csum_errors}, "
                    f"handshake before the agent: {'none' if no_handshake else 'yes'}"),
        Expectation(f"tunnel up within {TUNNEL_UP_BUDGET:g}s of the agent's start",
                    up and t_up - started <= TUNNEL_UP_BUDGET,
                    f"up {t_up - started:.1f}s after the agent started" if up else "never"),
        Expectation("offload corrected once, at boot, and never again",
                    boot >= 1 and later == 0, f"boot corrections {boot:g}, others {later:g}"),
        Expectation("no Flannel restart", not lab.world.kube.deletions,
                    f"{len(lab.world.kube.deletions)} pod deletions"),
        Expectation("collector messages flowing through the tunnel", after > before,
                    f"delivered {before} -> {after} in 10 s"),
    ]


async def stuck_flannel(lab: Lab) -> list[Expectation]:
    """The tunnel device loses its peer (a Flannel bug); only a restart cures it."""
    edge = lab.world.edges[0]
    up = await lab.until(lambda: _ok(lab, edge), TUNNEL_UP_BUDGET, "the tunnel to come up")
    await lab.hold(12)  # past the agent's startup grace, on a settled tunnel
    fault = lab.mark("fault_injected")
    lab.world.remove_cloud_peer(edge)
    lab.note("lab", "fault: the tunnel device lost its cloud peer (stuck Flannel)", edge.name)
    detected = await lab.until(lambda: lab.state(edge, "wireguard") == "failed", 30,
                               "the agent to see the tunnel fail")
    t_detect = lab.mark("detected") - fault
    recovered = await lab.until(lambda: _ok(lab, edge) and bool(
        lab.world.kube.deletions), 120, "the tunnel to recover")
    t_recover = lab.mark("recovered") - fault
    await lab.until(lambda: bool(_alerts(lab, "remediation.recovered", edge.name)), 30,
                    "the recovery alert")
    deletions = lab.world.kube.deletions
    own = [d for d in deletions if (d.get("spec") or {}).get("nodeName") == edge.name]
    reasons = [e.get("reason") for e in lab.world.kube.events]
    kinds = {str(a.get("kind")) for a in lab.world.alerts()}
    return [
        Expectation("tunnel up before the fault", up),
        Expectation("fault detected within 15 s", detected and t_detect <= 15,
                    f"{t_detect:.1f}s" if detected else "never"),
        Expectation("exactly one deletion, of this node's Flannel pod",
                    len(deletions) == 1 and len(own) == 1,
                    f"{len(deletions)} deletions, {len(own)} of {edge.name}'s pod"),
        Expectation("tunnel recovered", recovered,
                    f"{t_recover:.1f}s after the fault" if recovered else "never"),
        Expectation("a FlannelRestarted Event on the Node", "FlannelRestarted" in reasons,
                    f"events: {reasons}"),
        Expectation("the alerts reached the subscriber",
                    {"remediation.restarted", "remediation.recovered"} <= kinds,
                    f"kinds: {sorted(kinds)}"),
    ]


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("boot-with-offload", "the edge boots with TX checksum offload on; the agent "
             "turns it off and the tunnel comes up", boot_with_offload,
             offload_on_at_boot=True, budget=180, start_agents=False),
    Scenario("stuck-flannel", "the tunnel device loses its peer; the agent restarts this "
             "node's Flannel pod once and the tunnel recovers", stuck_flannel, budget=240),
)}

DEFAULT = "boot-with-offload"
