"""Issue 27's last finding: two agents with the same ``node_name`` on one broker.

They send the same client id, so the broker lets each one in by throwing the other out
(MQTT's session takeover: under MQTT 5 a broker may send the older client DISCONNECT with
reason 0x8E, "Session taken over"; Mosquitto 2.0.11 and every MQTT 3.1.1 broker just close
its socket), and their
reconnects knock each other off forever, silently. Now each link counts the connections the
broker ended that way; at ``TAKEOVER_COUNT`` within ``TAKEOVER_WINDOW`` it logs it once and
the agent raises ``alerts.duplicate_client_id`` once, with a metric and ``/status``. The
client id itself is unchanged (an operator's ACLs may name it).

Real Mosquitto throughout: two real links in one loop for each protocol, a control with
different ids, and two real ``edgeheal run`` processes with one ``node_name``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from edgeheal.boundaries.mqtt.link import TAKEOVER_COUNT, TAKEOVER_WINDOW, Link, Takeovers
from edgeheal.cli.status import render_status
from edgeheal.lab.mosquitto import Mosquitto, free_port
from edgeheal.lab.netns import Sandbox
from tests.hardening.test_agent_process import (
    AgentProcess,
    get,
    metric,
    wait_serving,
    write_config,
)
from tests.mqtt.conftest import target_for
from tests.support import until, wait_until


async def _run(links: list[Link]) -> list[asyncio.Task[None]]:
    return [asyncio.create_task(link.run(), name=f"test.link.{i}")
            for i, link in enumerate(links)]


async def _stop(links: list[Link], tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for link in links:
        await link.close()


EVIDENCE = {"5": {"session_taken_over", "closed_by_broker"}, "3.1.1": {"closed_by_broker"}}
"""What a takeover looks like: MQTT 3.1.1 has no server DISCONNECT; under MQTT 5 Mosquitto
2.0.11 (Debian 12's) still just closes the socket, later releases send reason 0x8E."""


@pytest.mark.parametrize("protocol", list(EVIDENCE))
async def test_two_links_with_one_client_id_are_found_out(broker: Mosquitto,
                                                          protocol: str) -> None:
    target = target_for(broker, protocol=protocol, keepalive=5.0, timeout=2.0)
    links = [Link(target, "edge-twin", min_delay=0.05, max_delay=0.2) for _ in range(2)]
    assert links[0].takeovers.client_id == links[1].takeovers.client_id == \
        "edgeheal-edge-twin-broker"  # unchanged: ACLs may name it
    tasks = await _run(links)
    try:
        await until(lambda: all(link.duplicate for link in links), within=30,
                    what="both links to see repeated takeovers",
                    report=lambda _v: str([link.takeovers for link in links]))
    finally:
        await _stop(links, tasks)
    for link in links:
        assert link.takeovers.total >= TAKEOVER_COUNT
        assert link.takeovers.how in EVIDENCE[protocol]


async def test_links_with_their_own_ids_are_never_counted_as_taken_over(
        broker: Mosquitto) -> None:
    """The control: two nodes on one broker, each connection ended three times by the
    agent itself: reconnects, but no takeover."""
    links = [Link(target_for(broker, protocol="5", keepalive=5.0, timeout=2.0), node,
                  min_delay=0.05, max_delay=0.2) for node in ("edge-a", "edge-b")]
    tasks = await _run(links)
    try:
        for _ in range(TAKEOVER_COUNT):
            for link in links:
                await until(lambda link=link: link.connected, within=10)  # type: ignore[misc]
                link.drop()
        await until(lambda: all(link.state.connects > TAKEOVER_COUNT for link in links),
                    within=10, what="every link to reconnect after each drop")
    finally:
        await _stop(links, tasks)
    assert [link.takeovers.total for link in links] == [0, 0]
    assert not any(link.duplicate for link in links)


# --- through two real agents -----------------------------------------------------------------

@pytest.mark.daemon  # mosquitto
def test_two_agents_with_one_node_name_say_so_once_each(sandbox: Sandbox,
                                                        tmp_path: Path) -> None:
    broker = Mosquitto(sandbox, tmp_path)
    broker.start()
    received = tmp_path / "received.txt"
    broker.subscribe("edgeheal/+/alerts", received)
    agents, ports = [], []
    for name in ("first", "second"):
        work = tmp_path / name
        work.mkdir()
        state = work / "state"
        state.mkdir(mode=0o700)
        port = free_port()
        extra = (f'[[mqtt.targets]]\nname = "broker"\nhost = "127.0.0.1"\n'
                 f'port = {broker.port}\nprotocol = "5"\nkeepalive = "5s"\ntimeout = "2s"\n'
                 '[alerts]\ntarget = "broker"\nreconnect_max = "1s"\n')
        cfg = write_config(work / "edgeheal.toml", state, port, extra)  # one node_name
        agents.append(AgentProcess(sandbox, work, cfg, name="agent"))
        ports.append(port)
    for agent, port in zip(agents, ports, strict=True):
        wait_serving(agent, port)

    def said(agent: AgentProcess) -> int:
        return agent.log.count("alert alerts.duplicate_client_id ")

    wait_until(lambda: all(said(agent) for agent in agents), within=60,
               what="both agents to raise alerts.duplicate_client_id",
               report=lambda _v: agents[0].log[-2000:])
    for port in ports:
        status = json.loads(get(port, "/status")[1])["alerts"]["session_taken_over"]
        assert status["client_id"] == "edgeheal-edge-hard-broker"
        assert status["duplicate_client_id"] is True
        assert status["total"] >= TAKEOVER_COUNT
        assert status["evidence"] in EVIDENCE["5"]
        metrics = get(port, "/metrics")[1]
        assert metric(metrics, "edgeheal_alerts_duplicate_client_id") == 1.0
        assert metric(metrics, "edgeheal_alerts_session_taken_over_total") >= TAKEOVER_COUNT
    wait_until(lambda: any('"alerts.duplicate_client_id"' in line
                           for line in received.read_text(errors="replace").splitlines()),
               within=30, what="the alert to reach the broker between takeovers")
    for agent in agents:
        assert agent.stop() == 0, agent.log[-3000:]
        assert said(agent) == 1, agent.log[-3000:]  # once per run, however many follow
        errors = [line for line in agent.log.splitlines() if "level=error" in line
                  and "another client connected with our client id" in line]
        assert len(errors) == 1, errors


def test_edgeheal_status_says_another_client_uses_the_id() -> None:
    doc = {"node": "n", "version": "v", "uptime_seconds": 1, "ready": True, "checks": {},
           "actions": [], "alerts": {"session_taken_over": {
               "client_id": "edgeheal-n-broker", "total": 4, "duplicate_client_id": True}}}
    assert "another client uses client id edgeheal-n-broker (4 session takeovers)" in \
        render_status(doc)
    doc["alerts"]["session_taken_over"]["duplicate_client_id"] = False  # type: ignore[index]
    assert "another client" not in render_status(doc)


@pytest.mark.parametrize(("times", "now", "duplicate"), [
    ((), 0.0, False),
    ((1.0, 2.0), 3.0, False),                       # two: a broker restart and one more
    ((1.0, 2.0, 3.0), 3.0, True),
    ((1.0, 2.0, 3.0), 1.0 + TAKEOVER_WINDOW, False),  # the oldest has left the window
    ((100.0, 200.0, 300.0), 100.0 + TAKEOVER_WINDOW - 1, True),
])
def test_a_duplicate_is_three_takeovers_inside_the_window(
        times: tuple[float, ...], now: float, duplicate: bool) -> None:
    assert Takeovers("id", len(times), times).duplicate(now) is duplicate
