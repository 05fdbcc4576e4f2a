"""The control-path scenarios (issue 29): a K3s agent that has lost its server while the
data plane is fine, a node whose address changed under its agent, and an uplink outage
the control ladder must sit out.

Each edge runs the stand-in K3s agent (:mod:`edgeheal.lab.k3s_agent`: its load balancer,
its kubelet's heartbeats, ``k3s-agent.service`` on a private bus) and its edgeheal agent
the ``control`` check and ladder. Judged from outside: the Node and its Lease in the test
API (what ``kubectl get node`` shows), the stand-in systemd's restarts, the agent's
``/status`` and alerts. With the agent off (``--no-agent``) the first two scenarios must
stay broken to the end: nothing in K3s heals them by itself.
"""

from __future__ import annotations

from typing import Any

from edgeheal.lab.observe import alerts_of, settle, tunnel_ok
from edgeheal.lab.runner import Expectation, Lab
from edgeheal.lab.world import Edge

LADDER_GRACE = (20.0, 305.0)
"""Seconds from the agent's start before a fault (lab, field): past the control ladder's
``startup_grace`` (10 s tuned, 300 s shipped), so the fault meets it in its steady state."""


def node_ready(lab: Lab, edge: Edge) -> str:
    """The Node's Ready condition as ``kubectl`` shows it (True, False, Unknown)."""
    for cond in lab.world.kube.node(edge.name)["status"].get("conditions", []):
        if cond.get("type") == "Ready":
            return str(cond.get("status"))
    return ""


def internal_ip(lab: Lab, edge: Edge) -> str:
    for address in lab.world.kube.node(edge.name)["status"].get("addresses", []):
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return ""


def control_healthy(lab: Lab, edge: Edge) -> bool:
    """Ready, the Lease renewed through the agent, and the Node's address this node's."""
    return (node_ready(lab, edge) == "True" and lab.world.k3s[edge.name].posting
            and internal_ip(lab, edge) == edge.edge_ip)


def _detail(alert: dict[str, Any]) -> dict[str, Any]:
    detail = alert.get("detail")
    return detail if isinstance(detail, dict) else {}


def restarts(lab: Lab) -> int:
    return sum(k.restarts for k in lab.world.k3s.values())


async def _steady(lab: Lab, edge: Edge) -> list[Expectation]:
    if lab.world.with_agent:
        out = await settle(lab)
    else:  # no agent to ask: the device's own handshake says the tunnel is up
        up = await lab.until(lambda: lab.world.last_handshake(edge) > 0, 60,
                             "the tunnel's first handshake")
        await lab.hold(lab.scaled(20, 65))
        out = [Expectation("the tunnel up before the fault", up)]
    healthy = await lab.until(lambda: control_healthy(lab, edge), 60,
                              "the node Ready, its Lease renewed")
    started = lab.marks.get("agent_started", 0.0)
    await lab.hold(max(0.0, started + lab.scaled(*LADDER_GRACE) - lab.now()))
    return [*out, Expectation("the node Ready and its Lease renewed before the fault",
                              healthy, f"Ready {node_ready(lab, edge)}, InternalIP "
                              f"{internal_ip(lab, edge)}")]


def _reasons(lab: Lab, edge: Edge, after: float) -> set[str]:
    return {str(e.get("detail", {}).get("reason")) for e in lab.timeline
            if e["t"] >= after and e["edge"] == edge.name
            and e.get("detail", {}).get("check") == "control"}


async def _judge_cure(lab: Lab, edge: Edge, fault: float, verdict: str,
                      extra: list[Expectation], *, touched: bool = False,
                      ) -> list[Expectation]:
    """With the agent: the verdict, one restart, healthy again. Without: still broken."""
    if not lab.world.with_agent:
        await lab.hold(lab.scaled(90, 240))
        lab.mark("window_end")
        return [*extra,
                Expectation("without edgeheal the node stays broken to the end",
                            not control_healthy(lab, edge),
                            f"Ready {node_ready(lab, edge)}, InternalIP "
                            f"{internal_ip(lab, edge)} (the node's {edge.edge_ip}), "
                            f"{lab.scaled(90, 240):g}s after the fault"),
                Expectation("no k3s-agent restart", restarts(lab) == 0, f"{restarts(lab)}")]
    seen = await lab.until(lambda: lab.reason(edge, "control") == verdict,
                           lab.scaled(60, 300), f"the control check to say {verdict}")
    t_seen = lab.mark("detected") - fault
    healed = await lab.until(lambda: restarts(lab) >= 1 and control_healthy(lab, edge),
                             lab.scaled(120, 420), "the node Ready again after a restart")
    t_healed = lab.mark("recovered") - fault
    await lab.until(lambda: lab.state(edge, "control") == "ok", lab.scaled(30, 120),
                    "the control check ok")
    await lab.hold(lab.scaled(30, 60))  # and it stays so: no second restart
    restarted = alerts_of(lab, "control_ladder.restarted", edge.name)
    return [*extra,
            Expectation(f"the control check said {verdict}", seen,
                        f"{t_seen:.1f}s after the fault" if seen
                        else f"reasons seen: {sorted(_reasons(lab, edge, fault))}"),
            Expectation("Ready again, its Lease renewed, its address right",
                        healed and control_healthy(lab, edge),
                        f"{t_healed:.1f}s after the fault" if healed
                        else f"Ready {node_ready(lab, edge)}, InternalIP "
                        f"{internal_ip(lab, edge)}"),
            Expectation("exactly one k3s-agent restart", restarts(lab) == 1,
                        f"{restarts(lab)} restarts; alerts: {len(restarted)} "
                        "control_ladder.restarted"),
            data_plane(lab, edge, touched=touched)]


def data_plane(lab: Lab, edge: Edge, *, touched: bool) -> Expectation:
    """No Flannel restart where the fault never touched the tunnel; where it did (an
    address change: the tunnel roams), the tunnel ok at the end, its restarts counted."""
    deletions = len(lab.world.kube.deletions)
    if not touched:
        return Expectation("no Flannel restart: the data plane was never at fault",
                           deletions == 0, f"{deletions} pod deletions")
    lab.note("lab", f"{deletions} Flannel restart(s) by the Flannel ladder after the "
             "address change", edge.name)
    return Expectation("the tunnel ok at the end (the address change hit it too)",
                       tunnel_ok(lab, edge), f"{deletions} Flannel restart(s)")


async def agent_stuck(lab: Lab) -> list[Expectation]:
    """The K3s agent's load balancer drops its server and forwards nothing more
    (k3s-io/k3s#11349): the Lease stops, the node turns NotReady; the tunnel is fine."""
    edge = lab.world.edges[0]
    out = await _steady(lab, edge)
    k3s = lab.world.k3s[edge.name]
    fault = lab.mark("agent_stuck")
    k3s.stick()
    lab.note("lab", "fault: the K3s agent's load balancer is stuck (accepts, never "
             "forwards); the kubelet's renewals stop", edge.name)
    result = await _judge_cure(lab, edge, fault, "balancer_stuck", out)
    if lab.world.with_agent:
        said = [str(_detail(a).get("balancer_state", ""))
                for a in alerts_of(lab, "control_ladder.restarted", edge.name)]
        result.append(Expectation(
            "the balancer's state file removed before the restart, written again by it",
            bool(said) and said[0].startswith("removed") and k3s.state.exists(),
            f"{said}; state file {'there' if k3s.state.exists() else 'missing'}"))
    return result


async def node_ip_changed(lab: Lab) -> list[Expectation]:
    """The node's address changes under the running agent (LAN to 4G): its connections
    come back from the new address, the Lease is renewed, but the Node's InternalIP and
    Flannel's public-ip stay the old address until k3s-agent restarts (k3s-io/k3s#2827)."""
    edge = lab.world.edges[0]
    out = await _steady(lab, edge)
    old = edge.edge_ip
    fault = lab.mark("ip_changed")
    lab.world.drop_address(edge)
    lab.world.give_address(edge, host=3)
    lab.note("lab", f"fault: the uplink's address changed {old} -> {edge.edge_ip}",
             edge.name)
    renewed = await lab.until(lambda: lab.world.k3s[edge.name].posting
                              and internal_ip(lab, edge) == old, lab.scaled(30, 150),
                              "the agent's renewals from the new address")
    return await _judge_cure(lab, edge, fault, "node_ip_changed", [*out, Expectation(
        "the agent reconnected from the new address, the Node kept the old one", renewed,
        f"InternalIP {internal_ip(lab, edge)}, the node's {edge.edge_ip}")], touched=True)


async def control_uplink_outage(lab: Lab) -> list[Expectation]:
    """The uplink drops everything for ``outage`` s: the node turns NotReady, the control
    check says ``server_unreachable``; after it the agent finds its server by itself and
    the ladder must not restart it."""
    edge = lab.world.edges[0]
    out = await _steady(lab, edge)
    start = lab.mark("outage_start")
    lab.world.uplink_down(edge, True)
    lab.note("lab", f"fault: uplink outage for {lab.outage:g} s", edge.name)
    await lab.hold(lab.outage)
    during = node_ready(lab, edge)
    lab.world.uplink_down(edge, False)
    lab.mark("outage_end")
    lab.note("lab", "uplink restored", edge.name, marker="fault_end")
    healed = await lab.until(lambda: control_healthy(lab, edge), lab.scaled(60, 180),
                             "the node Ready again")
    await lab.until(lambda: lab.state(edge, "control") == "ok", lab.scaled(30, 120),
                    "the control check ok")
    await lab.hold(lab.scaled(40, 120))  # past act_after: a wrong restart would show here
    reasons = _reasons(lab, edge, start)
    skips = alerts_of(lab, "control_ladder.skipped", edge.name)
    return [*out,
            Expectation("the node went NotReady during the outage", during != "True",
                        f"Ready {during} at the outage's end"),
            Expectation("the control check blamed the path (server_unreachable)",
                        "server_unreachable" in reasons, f"reasons: {sorted(reasons)}"),
            Expectation("Ready again by itself after the outage", healed),
            Expectation("zero k3s-agent restarts", restarts(lab) == 0,
                        f"{restarts(lab)} restarts; skips said: "
                        f"{sorted({str(_detail(a).get('reason')) for a in skips})}"),
            Expectation("no Flannel restart", not lab.world.kube.deletions,
                        f"{len(lab.world.kube.deletions)} pod deletions")]
