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
    await lab.hold(20)  # past the agent's startup grace and uplink settle time
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


def _failed_ever(lab: Lab, edge: Edge, check: str, after: float = 0.0) -> bool:
    return lab.first(edge, "agent", lambda e: (e.get("detail") or {}).get("check") == check
                     and (e.get("detail") or {}).get("state") == "failed", after) is not None


def _count(lab: Lab, edge: Edge, check: str, reason: str, after: float = 0.0) -> int:
    return sum(1 for e in lab.timeline if e["t"] >= after and e["source"] == "agent"
               and e["edge"] == edge.name and (e.get("detail") or {}).get("check") == check
               and (e.get("detail") or {}).get("reason") == reason)


def _watched_age(lab: Lab, edge: Edge) -> float | None:
    samples = lab.views[edge.name].samples
    for peer in (samples[-1]["peers"] if samples else []):
        if peer.get("watched") and peer.get("handshake_age_seconds") is not None:
            return float(peer["handshake_age_seconds"])
    return None


async def _settle(lab: Lab) -> list[Expectation]:
    ups = [await lab.until(lambda e=e: _ok(lab, e), TUNNEL_UP_BUDGET,  # type: ignore[misc]
                           f"{e.name}'s tunnel to come up") for e in lab.world.edges]
    await lab.hold(20)  # past the agents' startup grace and uplink settle time
    return [Expectation("every tunnel up before the fault", all(ups))]


async def modem_reconnect(lab: Lab) -> list[Expectation]:
    """The modem re-enumerates: the uplink vanishes and comes back with offload on."""
    edge = lab.world.edges[0]
    out = await _settle(lab)
    lost_before = lab.world.collector_stats(edge).get("lost", 0) or 0
    fault = lab.mark("uplink_recreated")
    lab.world.recreate_uplink(edge)
    lab.note("lab", "fault: the uplink was re-created with TX checksum offload on", edge.name)
    fixed = await lab.until(lambda: lab.metric(
        edge, "edgeheal_offload_corrections_total", cause="link_event") >= 1, 10,
        "the drift correction")
    t_fix = lab.mark("drift_corrected") - fault
    # a rekey after the reconnect proves handshakes get through (one every ~125 s)
    rekeyed = await lab.until(lambda: (a := _watched_age(lab, edge)) is not None
                              and a < lab.now() - fault - 2, 160, "a rekey after the reconnect")
    await lab.hold(12)  # let late acknowledgements arrive
    lost = (lab.world.collector_stats(edge).get("lost", 0) or 0) - lost_before
    return [*out,
            Expectation("offload drift corrected within 2 s of the link event",
                        fixed and t_fix <= 2.0 + 1.0,  # + one observation period
                        f"seen corrected {t_fix:.1f}s after the re-creation"),
            Expectation("the tunnel never failed", not _failed_ever(lab, edge, "wireguard",
                                                                    fault)),
            Expectation("a rekey succeeded after the reconnect", rekeyed),
            Expectation("zero collector messages lost", lost == 0, f"{lost} lost"),
            Expectation("no Flannel restart", not lab.world.kube.deletions)]


async def uplink_outage(lab: Lab) -> list[Expectation]:
    """All uplink traffic is dropped for 90 s (a carrier outage)."""
    edge = lab.world.edges[0]
    out = await _settle(lab)
    seen = len(lab.world.alerts())
    lab.mark("outage_start")
    lab.world.uplink_down(edge, True)
    lab.note("lab", f"fault: uplink outage for {lab.outage:g} s", edge.name)
    await lab.hold(lab.outage)
    lab.world.uplink_down(edge, False)
    end = lab.mark("outage_end")
    lab.note("lab", "uplink restored", edge.name)
    ready = await lab.until(lambda: lab.views[edge.name].states.get("_ready") == "ready", 90,
                            "readiness after the outage")
    # the alert connection reconnects with capped backoff (10 s in the lab), then drains
    await lab.until(lambda: any(a.get("kind") in ("mqtt.recovered", "wireguard.recovered")
                                for a in lab.world.alerts()[seen:]), 60, "recovery alerts")
    during = [a for a in lab.world.alerts()[seen:] if a.get("kind") in (
        "mqtt.unreachable", "wireguard.stalled", "wireguard.dead")]
    return [*out,
            Expectation("alerts raised during the outage were delivered after it",
                        bool(during), f"{len(during)} problem alerts received after the "
                        f"uplink returned at {end:.0f}s"),
            Expectation("zero Flannel restarts", not lab.world.kube.deletions,
                        f"{len(lab.world.kube.deletions)} deletions"),
            Expectation("ready again after the outage", ready)]


async def lossy_link(lab: Lab) -> list[Expectation]:
    """10 % random loss on the tunnel's UDP for a long while: warn at most, never act."""
    edge = lab.world.edges[0]
    out = await _settle(lab)
    start = lab.mark("loss_start")
    lab.world.loss(edge, 10)
    lab.note("lab", f"fault: 10 % loss on the tunnel for {lab.loss_seconds:g} s", edge.name)
    await lab.hold(lab.loss_seconds)
    lab.world.loss(edge, None)
    lab.mark("loss_end")
    warnings = _count(lab, edge, "wireguard", "rekey_failing", start)
    # a count to show, not a verdict: at 10 % loss a rare warning is honest
    lab.note("lab", f"{warnings} rekey_failing episode(s) in {lab.loss_seconds:g} s of loss",
             edge.name)
    return [*out,
            Expectation("never failed", not _failed_ever(lab, edge, "wireguard", start)),
            Expectation("zero remediation", not lab.world.kube.deletions)]


async def dead_neighbour(lab: Lab) -> list[Expectation]:
    """Another edge in the mesh is powered off: nothing to heal on this one."""
    edge, other = lab.world.edges[0], lab.world.edges[1]
    out = await _settle(lab)
    fault = lab.mark("neighbour_off")
    lab.world.power_off(other)
    other.agent = None
    lab.note("lab", f"fault: {other.name} powered off", other.name)

    def neighbour_shown() -> bool:
        samples = lab.views[edge.name].samples
        return bool(samples) and any(
            not p.get("watched") and p.get("reason") in ("stalled", "dead", "never_connected")
            for p in samples[-1]["peers"])

    shown = await lab.until(neighbour_shown, 60, "the dead neighbour in detail")
    await lab.hold(10)
    return [*out,
            Expectation("this edge's watched peers stay healthy",
                        not _failed_ever(lab, edge, "wireguard", fault)
                        and lab.state(edge, "wireguard") == "ok"),
            Expectation("the dead neighbour is shown in detail", shown),
            Expectation("no restart anywhere", not lab.world.kube.deletions)]


async def flapping_uplink(lab: Lab) -> list[Expectation]:
    """The uplink drops for 20 s every 60 s: alerts deduplicated, no restart storm."""
    edge = lab.world.edges[0]
    out = await _settle(lab)
    seen = len(lab.world.alerts())
    lab.mark("flapping_start")
    for cycle in range(lab.flaps):
        lab.world.uplink_down(edge, True)
        lab.note("lab", f"flap {cycle + 1}/{lab.flaps}: uplink down for 20 s", edge.name)
        await lab.hold(20)
        lab.world.uplink_down(edge, False)
        lab.note("lab", "uplink back", edge.name)
        await lab.hold(40)
    lab.mark("flapping_end")
    await lab.until(lambda: lab.views[edge.name].states.get("_ready") == "ready", 60,
                    "readiness at the end")
    alerts = lab.world.alerts()[seen:]
    problems = [a for a in alerts if a.get("severity") in ("warning", "critical")
                and not a.get("reminder")]
    per_flap = len(problems) / max(1, lab.flaps)
    ids = [a.get("id") for a in alerts]
    return [*out,
            Expectation("alerts deduplicated: a few per outage, not one per probe",
                        per_flap <= 6, f"{len(problems)} problem alerts over {lab.flaps} flaps"),
            Expectation("every alert id unique", len(ids) == len(set(ids))),
            Expectation("restarts within the budget or none",
                        len(lab.world.kube.deletions) <= 3,
                        f"{len(lab.world.kube.deletions)} deletions")]


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("boot-with-offload", "the edge boots with TX checksum offload on; the agent "
             "turns it off and the tunnel comes up", boot_with_offload,
             offload_on_at_boot=True, budget=180, start_agents=False),
    Scenario("stuck-flannel", "the tunnel device loses its peer; the agent restarts this "
             "node's Flannel pod once and the tunnel recovers", stuck_flannel, budget=240),
    Scenario("modem-reconnect", "the uplink is re-created with offload on; drift corrected "
             "at once, nothing lost", modem_reconnect, budget=300),
    Scenario("uplink-outage", "all uplink traffic dropped for 90 s; alerts arrive after it, "
             "no restart", uplink_outage, budget=330),
    Scenario("lossy-link", "10 % loss on a working tunnel for 5 minutes; warnings at most, "
             "no remediation", lossy_link, budget=480),
    Scenario("dead-neighbour", "another edge in the mesh is powered off; nothing to heal "
             "here", dead_neighbour, edges=2, budget=240),
    Scenario("flapping-uplink", "the uplink drops 20 s every 60 s for 10 minutes; "
             "deduplicated alerts, no restart storm", flapping_uplink, budget=900),
)}

DEFAULT = "boot-with-offload"
