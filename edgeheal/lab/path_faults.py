"""The lab's scenarios of the tunnel's path beyond the tunnel: a path-MTU black hole, an
uplink failover, a carrier NAT's stale mapping (issue 30). Registered in
:data:`edgeheal.lab.scenarios.SCENARIOS`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from edgeheal.lab.observe import failed_ever, settle, tunnel_ok
from edgeheal.lab.runner import Expectation, Lab
from edgeheal.lab.world import Edge

PMTU_LIMIT = 1360
"""Outer IP bytes the shrunken carrier link still carries: tunnel packets of up to 1300
inner bytes (1360 - 20 IP - 8 UDP - 32 WireGuard) pass, the device's 1420 do not."""
PMTU_PAYLOAD = 4000
"""Bytes of each collector reading in ``pmtu-blackhole``: every publish fills segments."""
PMTU_AGENT = '[pmtu]\ninterface = "{wg}"\nclamp = true\n'
"""The scenario's ``[pmtu]``: the shipped defaults, the clamp opted in."""
PMTU_TUNED = 'interval = "20s"\n'
"""At the lab's K = 5 s the cloud's keepalives reach the edge every 5 s, so the WireGuard
check never sees 12 s of unanswered data (the suspicion needs it); the lab's tuning probes
every 20 s instead. ``--field`` (K = 25 s, the hourly default) relies on the suspicion."""


def _mss_table(edge: Edge) -> bool:
    from edgeheal.lab.netns import run

    return run(["nft", "list", "table", "inet", "edgeheal_mss"], ns=edge.ns,
               check=False).returncode == 0


async def pmtu_blackhole(lab: Lab) -> list[Expectation]:
    """The carrier's link shrinks below the tunnel's packets and drops ICMP "fragmentation
    needed" for 90 s (150 s with ``--field``): handshakes, keepalives and the small MQTT
    probes pass, the collector's 4 kB publishes hang. The ``pmtu`` check finds it, the
    opt-in clamp lowers the MSS of new connections, and the collector's next connection
    passes; no Flannel restart."""
    edge = lab.world.edges[0]
    out = await settle(lab)
    if lab.world.with_agent:
        await lab.until(lambda: lab.state(edge, "pmtu") == "ok", 30, "the first pmtu run")

    def delivered() -> int:
        return int(lab.world.collector_stats(edge).get("delivered", 0) or 0)

    flowing_before = delivered()
    fault = lab.mark("mtu_dropped")
    lab.world.path_mtu(edge, PMTU_LIMIT)
    lab.note("lab", f"fault: the carrier's link carries at most {PMTU_LIMIT} bytes and drops "
             "ICMP 'fragmentation needed' (tunnel MTU 1420)", edge.name)
    await lab.hold(4)
    hung_from = delivered()
    await lab.hold(8)
    hung = delivered() == hung_from
    within = 60.0
    duration = lab.scaled(90, 150)  # fixed, so that bench/onoff.py compares like for like
    detected = await lab.until(lambda: lab.state(edge, "pmtu") in ("failed", "degraded"),
                               within + 30, "the pmtu verdict")
    t_detect = lab.mark("pmtu_verdict") - fault
    verdict = lab.reason(edge, "pmtu")
    doc = lab.world.status(edge) or {}
    detail = ((doc.get("checks") or {}).get("pmtu") or {}).get("detail") or {}
    clamped = _mss_table(edge)
    at_verdict = delivered()
    passing = await lab.until(lambda: delivered() >= at_verdict + 5,
                              max(1.0, fault + duration - lab.now()),
                              "large publishes passing under the clamp")
    t_passing = lab.now() - fault
    await lab.hold(max(0.0, fault + duration - lab.now()))
    restarts_during = len(lab.world.kube.deletions)
    lab.world.path_mtu(edge, None)
    lifted = lab.mark("mtu_restored")
    lab.note("lab", "the carrier's link carries full-size packets again", edge.name,
             marker="fault_end")
    recovered = await lab.until(lambda: lab.state(edge, "pmtu") == "ok"
                                and not _mss_table(edge), 90, "pmtu ok, the clamp removed")
    t_recovered = lab.now() - lifted
    return [*out,
            Expectation("collector publishes flowed before the fault", flowing_before > 0,
                        f"{flowing_before} delivered"),
            Expectation("the fault hangs the collector's large publishes", hung,
                        f"delivered {hung_from} -> {delivered() if not hung else hung_from} "
                        "between 4 s and 12 s after the fault"),
            Expectation(f"pmtu verdict within {within:g} s",
                        detected and t_detect <= within and verdict in (
                            "pmtu_blackhole", "clamped"),
                        f"{verdict} {t_detect:.1f}s after the fault, largest passed "
                        f"{detail.get('largest_passed')}, lost {detail.get('smallest_lost')}"
                        if detected else "never"),
            Expectation("the opt-in clamp installed (table inet edgeheal_mss)", clamped),
            Expectation("large publishes pass again under the clamp", passing,
                        f"{t_passing:.1f}s after the fault" if passing else "never"),
            Expectation("no Flannel restart", restarts_during == 0,
                        f"{restarts_during} pod deletions"),
            Expectation("pmtu ok and the clamp removed after the link healed", recovered,
                        f"{t_recovered:.1f}s after" if recovered else "never")]


FAILOVER_AGENT = ('[uplink]\ninterfaces = ["{uplink}", "{uplink2}"]\nmodem_manager = false\n'
                  'costs = [{interface = "{uplink2}", cost = 200}]\n')
"""The failover scenario's uplink section: the second uplink is the costly LTE."""


def _not_ready_seconds(lab: Lab, edge: Edge, start: float, end: float) -> float:
    """Seconds of ``[start, end]`` the runner saw ``/readyz`` not ready (from its notes)."""
    ready, since, total = True, start, 0.0
    for note in lab.timeline:
        if note.get("edge") != edge.name or "ready" not in (note.get("detail") or {}):
            continue
        t = float(note["t"])
        if t <= start:
            ready = bool(note["detail"]["ready"])
            continue
        if t > end:
            break
        if not ready:
            total += t - since
        ready, since = bool(note["detail"]["ready"]), t
    if not ready:
        total += end - since
    return round(total, 1)


@dataclass
class _Switch:
    """One leg of the failover scenario, as measured."""

    cause: str
    to: str
    moved: bool
    passes: bool
    event: bool
    ready: bool
    seen: float | None
    """Seconds from the fault to the switch the agent recorded."""
    source: float | None
    """Seconds from the fault to the tunnel's first packet from the new address."""
    down: float
    """Seconds ``/readyz`` was not ready from the fault to the end of the leg."""


async def uplink_failover(lab: Lab) -> list[Expectation]:
    """The first uplink loses its carrier and the second (costly) one takes the default
    route, then the first returns and takes it back. Measured per switch: when the agent
    saw it (``detail.active.since_seconds`` in ``/status``), when the tunnel first sent
    from the new uplink's address (the carrier's NAT sees a new source), ``/readyz``'s
    not-ready seconds, and that the collector's publishes pass over the new uplink."""
    edge = lab.world.edges[0]
    out = await settle(lab)
    seen = len(lab.world.alerts())
    first, second = edge.uplink, edge.uplink2
    wall0 = time.time() - lab.now()
    addresses = {first: edge.edge_ip, second: f"10.62.{edge.index}.2"}

    def active() -> tuple[str | None, float | None]:
        doc = lab.world.status(edge) or {}
        detail = ((doc.get("checks") or {}).get("uplink") or {}).get("detail") or {}
        block = detail.get("active") or {}
        return block.get("interface"), block.get("since_seconds")

    def delivered() -> int:
        return int(lab.world.collector_stats(edge).get("delivered", 0) or 0)

    def sent_from(address: str, after: float) -> float | None:
        """Lab seconds of the first tunnel packet from ``address`` after ``after``."""
        for ev in lab.world.nic_events(edge):
            t = float(ev.get("t", 0)) - wall0
            if ev.get("event") == "nat_mapping" and str(ev.get("edge", "")).startswith(
                    f"{address}:") and t >= after:
                return t
        return None

    legs: list[_Switch] = []
    for leg, (on, cause, to) in enumerate(((False, "carrier_lost", second),
                                           (True, "preferred", first))):
        mark, sent = len(lab.world.alerts()), delivered()
        began = lab.mark(f"switch_{leg}")
        lab.world.uplink_carrier(edge, on)
        lab.note("lab", f"fault: {first} {'carrier back' if on else 'loses its carrier'}",
                 edge.name, marker="fault_start" if leg == 0 else "fault_end")
        found: dict[str, float] = {}

        def switched(name: str = to, into: dict[str, float] = found) -> bool:
            now = lab.now()
            interface, since = active()
            if interface == name and since is not None:
                into["at"] = now - float(since)
            return "at" in into

        def published(n: int = sent) -> bool:
            return delivered() > n + 2

        def alerted(c: str = cause, m: int = mark) -> bool:
            return any(a.get("kind") == "uplink.failover"
                       and (a.get("detail") or {}).get("cause") == c
                       for a in lab.world.alerts()[m:])

        moved = await lab.until(switched, lab.scaled(15, 30), f"/status naming {to}")
        passes = await lab.until(published, lab.scaled(60, 120),
                                 f"the collector's publishes over {to}")
        event = await lab.until(alerted, lab.scaled(30, 90),
                                f"the uplink.failover alert ({cause})")
        ready = await lab.until(
            lambda: lab.views[edge.name].states.get("_ready") == "ready",
            lab.scaled(60, 150), "readiness after the switch")
        await lab.hold(lab.scaled(10, 30))
        source = sent_from(addresses[to], began)
        legs.append(_Switch(cause, to, moved, passes, event, ready,
                            found["at"] - began if "at" in found else None,
                            None if source is None else source - began,
                            _not_ready_seconds(lab, edge, began, lab.now())))
    agent_log = edge.workdir / "agent.log"  # none without the agent (the baseline)
    relearned = (agent_log.read_text(errors="replace") if agent_log.exists() else ""
                 ).count("re-learning the source addresses")
    bound = 2 * lab.k + 5  # the next keepalive after the agent's re-set, with slack
    for g in legs:
        seen_s = "never" if g.seen is None else f"{g.seen:.1f} s after the fault"
        src_s = "never" if g.source is None else f"{g.source:.1f} s after the fault"
        out.extend([
            Expectation(f"the agent saw the {g.cause} switch to {g.to}", bool(
                g.moved) and g.seen is not None and g.seen < lab.scaled(10, 20),
                seen_s),
            Expectation(f"the tunnel sends from {g.to}'s address", g.source is not None
                        and g.source < bound, src_s),
            Expectation(f"the uplink.failover alert ({g.cause}) was delivered",
                        bool(g.event)),
            Expectation(f"the collector's publishes pass over {g.to}", bool(g.passes)),
            Expectation(f"/readyz is ready after the {g.cause} switch", bool(g.ready),
                        f"not ready for {g.down:g} s")])
    out.extend([
        Expectation("zero Flannel restarts", not lab.world.kube.deletions,
                    f"{len(lab.world.kube.deletions)} deletions"),
        Expectation("the tunnel check re-learned its source address at each switch",
                    relearned >= 2, f"{relearned} times"),
        Expectation("no uplink.down and no wireguard alert: a failover is not an outage",
                    not [a for a in lab.world.alerts()[seen:]
                         if str(a.get("kind")).startswith(("uplink.down", "wireguard."))])])
    return out


REBIND_ON = "\n[remediation.rebind]\nenabled = true\n"
"""The agent's opt-in rung before the restart (docs/remediation.md, "The first rung")."""


def _actions(lab: Lab, edge: Edge) -> list[dict[str, object]]:
    doc = lab.world.status(edge) or {}
    return [a for a in doc.get("actions") or [] if isinstance(a, dict)]


async def _renumber(lab: Lab, edge: Edge) -> tuple[float, str, str, list[str]]:
    """The stale-nat fault: the carrier moves the edge's public address while the tunnel's
    flow keeps its mapping to the old one."""
    old = edge.public_ip
    before = lab.world.nat_mappings(edge)
    fault = lab.mark("nat_renumbered")
    new = lab.world.renumber_public(edge, host=11)
    lab.note("lab", f"fault: the carrier moved {edge.name}'s public address {old} -> {new}; "
             f"the tunnel's flow keeps its mapping {', '.join(before) or '?'} (stale)",
             edge.name)
    return fault, old, new, before


async def stale_nat(lab: Lab) -> list[Expectation]:
    """The carrier moves the edge's public address; the tunnel's long-lived flow of port
    51820 keeps its mapping to the old one (a carrier NAT's stale mapping), so the cloud's
    answers go nowhere. The agent's ``rebind`` rung moves the device to a fresh port, the
    NAT maps the new flow to the new address, the cloud learns it by roaming: healed with
    no Flannel restart."""
    edge = lab.world.edges[0]
    out = await settle(lab)
    fault, old, new, _ = await _renumber(lab, edge)
    within = lab.scaled(30, 90)  # rx_stall_after (2.5 K) or the probe's timeout, + slack
    seen: dict[str, str] = {}

    def failing() -> bool:
        for check in ("wireguard", "broker-tunnel"):
            if lab.state(edge, check) == "failed":
                seen[check] = str(lab.reason(edge, check))
        return bool(seen)

    detected = await lab.until(failing, within, "the agent to see the tunnel fail")
    t_detect = lab.now() - fault
    # healed: the device on a new port and the cloud roamed to its new mapping (the first
    # packet from the new port can come a second after the rebind, and ``wireguard`` may
    # still say ok from before the fault when the tunnel-path probe saw it first)
    healed = await lab.until(lambda: tunnel_ok(lab, edge) and lab.world.listen_port(edge) not in (
        0, 51820) and lab.world.cloud_endpoint(edge).startswith(f"{new}:"),
        lab.scaled(90, 240), "the tunnel to heal on a new port")
    t_healed = lab.mark("recovered") - fault
    port = lab.world.listen_port(edge)
    endpoint = lab.world.cloud_endpoint(edge)
    before = lab.world.collector_stats(edge).get("delivered", 0) or 0
    await lab.hold(6)
    after = lab.world.collector_stats(edge).get("delivered", 0) or 0
    actions = _actions(lab, edge)
    rebinds = [a for a in actions if a.get("mode") == "rebind"]
    return [*out,
            Expectation(f"the stale mapping breaks the tunnel and the agent sees it within "
                        f"{within:g} s", detected and t_detect <= within and seen.get(
                            "wireguard", "stalled") in ("stalled", "dead"),
                        ", ".join(f"{k} {v}" for k, v in seen.items())
                        + f" {t_detect:.1f}s after the fault" if detected else "never"),
            Expectation("healed by rebind: the device on a fresh port, the tunnel ok",
                        healed and any(a.get("result") == "recovered" for a in rebinds),
                        f"{t_healed:.1f}s after the fault, port {port}, rebinds "
                        f"{[a.get('result') for a in rebinds]}" if healed else
                        f"never; rebinds {[a.get('result') for a in rebinds]}"),
            Expectation("the cloud learned the new mapping (roaming): the new public address",
                        endpoint.startswith(f"{new}:"),
                        f"cloud's endpoint for the edge {endpoint} (old address {old})"),
            Expectation("no Flannel restart", not lab.world.kube.deletions,
                        f"{len(lab.world.kube.deletions)} pod deletions"),
            Expectation("collector messages flowing through the tunnel again", after > before,
                        f"delivered {before} -> {after} in 6 s")]


async def stale_nat_restart(lab: Lab) -> list[Expectation]:
    """The same stale mapping, with the agent restarting Flannel only (no rebind): the
    restart re-creates the device on port 51820, the same flow, the same dead mapping; the
    tunnel stays down through the restarts."""
    edge = lab.world.edges[0]
    out = await settle(lab)
    fault, old, _, _ = await _renumber(lab, edge)
    restarted = await lab.until(lambda: bool(lab.world.kube.deletions), lab.scaled(60, 180),
                                "a Flannel restart")
    t_restart = lab.now() - fault
    # the restart's verification window, and a little more: the tunnel stays down
    await lab.hold(lab.scaled(45, 75))
    ok_after = tunnel_ok(lab, edge)
    builds = edge.device_builds
    endpoint = lab.world.cloud_endpoint(edge)
    return [*out,
            Expectation("the agent restarted Flannel (the device re-created on port 51820)",
                        restarted and builds >= 2 and lab.world.listen_port(edge) == 51820,
                        f"{len(lab.world.kube.deletions)} pod deletions, first "
                        f"{t_restart:.1f}s after the fault, device built {builds} times"
                        if restarted else "no restart"),
            Expectation("a restart alone does not cure a stale mapping: still down",
                        restarted and not ok_after,
                        f"wireguard {lab.state(edge, 'wireguard')} "
                        f"({lab.reason(edge, 'wireguard')}); cloud's endpoint {endpoint} "
                        f"(the old address {old})")]


def _port(endpoint: str) -> int:
    """The port of ``ip:port`` (0: none)."""
    tail = endpoint.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


async def port_drift(lab: Lab) -> list[Expectation]:
    """flannel-io/flannel#1770's port drift, in two legs. First the carrier's NAT re-maps
    the edge's flow to a new random public port and drops what the cloud still sends to
    the old one: the edge's next packet teaches the cloud the new port (roaming), nothing
    to do. Then the NAT drifts both sides — the cloud sees the edge at a random port and
    the edge the cloud — and forgets those mappings: both ends send to ports nothing
    forwards, and neither ever falls back to the configured port. A rebind cannot cure it
    (a new source port, still sent to the stale endpoint); a Flannel restart does (the
    device comes back with the configured endpoint, and the cloud roams to the handshake
    from it), which is 1770's workaround."""
    edge = lab.world.edges[0]
    out = await settle(lab)
    configured = lab.world.edge_endpoint(edge)
    first = lab.world.cloud_endpoint(edge)
    remapped = lab.mark("nat_remapped")
    lab.world.nat_drift(edge, "remap")
    lab.note("lab", f"fault: the carrier's NAT re-maps {edge.name}'s flow to a new random "
             f"port (the cloud sends to {first}, which it no longer forwards)", edge.name)
    roamed = await lab.until(lambda: _port(lab.world.cloud_endpoint(edge)) not in (
        0, _port(first)), lab.k + 10, "the cloud to roam to the new port")
    t_roamed = lab.now() - remapped
    second = lab.world.cloud_endpoint(edge)
    await lab.hold(lab.scaled(10, 30))
    quiet = not failed_ever(lab, edge, "wireguard", remapped) and not _actions(lab, edge) \
        and not lab.world.kube.deletions
    lab.world.nat_drift(edge, "remap")
    lab.world.nat_drift(edge, "drift")
    drifting = lab.mark("nat_drifted")
    lab.note("lab", "the NAT drifts both sides of the flow to random ports", edge.name)
    both = await lab.until(lambda: _port(lab.world.cloud_endpoint(edge)) not in (
        0, _port(second)) and _port(lab.world.edge_endpoint(edge)) not in (
        0, _port(configured)), 2 * lab.k + 10, "both ends to roam to random ports")
    t_both = lab.now() - drifting
    drifted = (lab.world.cloud_endpoint(edge), lab.world.edge_endpoint(edge))
    await lab.hold(4)
    working = tunnel_ok(lab, edge)
    fault = lab.mark("nat_forgot")
    lab.world.nat_drift(edge, "forget")
    lab.note("lab", f"fault: the NAT forgets the drifted mappings: the cloud sends to "
             f"{drifted[0]}, the edge to {drifted[1]}, neither forwarded", edge.name)
    within = lab.scaled(30, 90)
    seen: dict[str, str] = {}

    def failing() -> bool:
        for check in ("wireguard", "broker-tunnel"):
            if lab.state(edge, check) == "failed":
                seen[check] = str(lab.reason(edge, check))
        return bool(seen)

    detected = await lab.until(failing, within, "the agent to see the tunnel fail")
    t_detect = lab.now() - fault
    at_rebind: dict[str, str] = {}

    def rebind_done() -> bool:
        done = [a for a in _actions(lab, edge) if a.get("mode") == "rebind"
                and a.get("result") not in (None, "", "in_progress")]
        if done and not at_rebind:
            at_rebind.update(result=str(done[0].get("result")),
                             endpoint=lab.world.edge_endpoint(edge),
                             port=str(lab.world.listen_port(edge)))
        return bool(done)

    def restarted_and_ok() -> bool:
        """A restart, the configured endpoint again, and both tunnel checks ok: at K = 25 s
        the tunnel-path probe fails long before ``wireguard`` would, which may still say
        ok from before."""
        rebind_done()  # noted on the way: where the edge sent when the rebind was judged
        return bool(lab.world.kube.deletions) and tunnel_ok(lab, edge) \
            and lab.state(edge, "broker-tunnel") == "ok" \
            and lab.world.edge_endpoint(edge) == configured

    healed = await lab.until(restarted_and_ok, lab.scaled(150, 300),
                             "a Flannel restart to heal the tunnel")
    t_healed = lab.mark("recovered") - fault
    rebind_done()
    after = (lab.world.cloud_endpoint(edge), lab.world.edge_endpoint(edge))
    before_n = lab.world.collector_stats(edge).get("delivered", 0) or 0
    await lab.hold(6)
    after_n = lab.world.collector_stats(edge).get("delivered", 0) or 0
    rebinds = [a.get("result") for a in _actions(lab, edge) if a.get("mode") == "rebind"]
    return [*out,
            Expectation("a one-sided re-map heals by itself: the cloud roams to the new "
                        "port on the edge's next packet", roamed and quiet,
                        f"{first} -> {second} {t_roamed:.1f}s after the re-map; no failure, "
                        "no remediation" if roamed and quiet else
                        f"roamed {roamed}, failure or remediation {not quiet}"),
            Expectation("both ends drift to random ports and the tunnel still works (1770's "
                        "wg show)", both and working,
                        f"cloud sees the edge at {drifted[0]}, the edge the cloud at "
                        f"{drifted[1]} (configured {configured}) {t_both:.1f}s after"),
            Expectation(f"the forgotten mappings break the tunnel and the agent sees it "
                        f"within {within:g} s", detected and t_detect <= within,
                        ", ".join(f"{k} {v}" for k, v in seen.items())
                        + f" {t_detect:.1f}s after the fault" if detected else "never"),
            Expectation("a rebind does not cure it: the edge still sends to the drifted "
                        "endpoint", not rebinds or "recovered" not in rebinds,
                        f"rebinds {rebinds}; at the rebind's verdict the device on port "
                        f"{at_rebind.get('port')} sending to {at_rebind.get('endpoint')}"
                        if rebinds else "rebind not enabled"),
            Expectation("healed by a Flannel restart: the configured endpoint again, the "
                        "cloud roamed to the new mapping", healed
                        and after[1] == configured and _port(after[0]) not in (
                            0, _port(drifted[0])),
                        f"{t_healed:.1f}s after the fault, {len(lab.world.kube.deletions)} "
                        f"pod deletions; cloud sees {after[0]}, the edge sends to {after[1]}"
                        if healed else f"never; rebinds {rebinds}, "
                        f"{len(lab.world.kube.deletions)} pod deletions"),
            Expectation("collector messages flowing through the tunnel again",
                        after_n > before_n, f"delivered {before_n} -> {after_n} in 6 s")]
