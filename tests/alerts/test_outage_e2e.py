"""The outage test from the issue, against the real agent process and a real broker.

A namespace holds Mosquitto (two listeners: the agent's, and one for the subscriber that
must keep working) and the agent (``python -m edgeheal run``). nftables in the namespace
drops the agent's packets to the broker; 100 test alerts are raised with
``edgeheal alert test`` while the agent is ``kill -9``-ed and restarted half-way; then the
path is restored. A persistent subscriber must get all 100 ids, in the order raised, with
duplicates only where a PUBACK could have been lost (at most one per lost connection).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeheal.boundaries import control_socket as control
from edgeheal.lab.mosquitto import Mosquitto
from edgeheal.lab.netns import Sandbox, require_programs, stop_process
from tests.alerts.support import validate

pytestmark = [pytest.mark.netns, pytest.mark.slow]

USER, PASSWORD = "edge", "pw-outage-3Qs"


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    require_programs("nft", "mosquitto", "mosquitto_sub")
    sb = Sandbox()
    try:
        yield sb
    finally:
        sb.close()


def wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def alerts(path: Path, suffix: str = "/alerts") -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        topic, _, payload = line.partition(" ")
        if topic.endswith(suffix):
            out.append(json.loads(payload))
    return out


class AgentProc:
    def __init__(self, sb: Sandbox, ns: str, config: Path, state_dir: Path, log: Path) -> None:
        self.sb, self.ns, self.config, self.state_dir, self.log = sb, ns, config, state_dir, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = self.sb.spawn([sys.executable, "-m", "edgeheal", "run", "--config",
                                   str(self.config)], ns=self.ns, log_path=self.log)
        wait(self._answers, 15, "the agent's control socket")

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited: {self.log.read_text()[-2000:]}")
        try:
            control.call(self.state_dir, "ping", timeout=2)
        except control.ControlError:
            return False
        return True

    def stop(self) -> None:
        assert self.proc is not None
        stop_process(self.proc, grace=8)
        assert self.proc.returncode == 0, self.log.read_text()[-2000:]

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def raise_test_alerts(self, count: int) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "edgeheal", "alert", "test", "--count",
                              str(count), "--ids", "--config", str(self.config)],
                             capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()


def test_alerts_raised_during_an_outage_and_a_kill_9_all_arrive_once_in_order(
        sandbox: Sandbox, tmp_path: Path) -> None:
    ns = sandbox.netns("o")
    broker = Mosquitto(sandbox, tmp_path, ns=ns, users={USER: PASSWORD}, extra_listener=True)
    broker.start()
    received = tmp_path / "received.out"
    assert broker.extra_port is not None
    broker.subscribe("edgeheal/edge-e2e/#", received, user=USER, port=broker.extra_port,
                     client_id="fleet-watch", clean=False)
    state_dir = tmp_path / "state"
    config = tmp_path / "edgeheal.toml"
    config.write_text(f"""
[agent]
node_name = "edge-e2e"
state_dir = "{state_dir}"
check_interval = "1s"
[http]
listen = ["127.0.0.1:9917"]
[wireguard]
enabled = false
[[mqtt.targets]]
name = "broker-direct"
host = "127.0.0.1"
port = {broker.port}
username = "{USER}"
password_file = "{broker.password_file_for(USER)}"
keepalive = "2s"
timeout = "2s"
[alerts]
target = "broker-direct"
reconnect_max = "1s"
""")
    agent = AgentProc(sandbox, ns, config, state_dir, tmp_path / "agent.log")
    agent.start()
    wait(lambda: any(a["kind"] == "agent.started" for a in alerts(received)), 15,
         "agent.started to arrive")

    # cut the agent's path to the broker (the subscriber's listener stays reachable)
    sandbox.nft(ns, f"table inet ehcut {{\n chain out {{\n  type filter hook output "
                    f"priority 0;\n  tcp dport {broker.port} drop\n }}\n}}\n")
    first = agent.raise_test_alerts(50)
    agent.kill9()
    agent.start()
    second = agent.raise_test_alerts(50)
    raised = first + second
    assert len(set(raised)) == 100
    # nothing may have arrived while the path is cut
    assert not [a for a in alerts(received) if a["kind"] == "agent.test"]

    sandbox.nft(ns, "delete table inet ehcut")
    wait(lambda: len({a["id"] for a in alerts(received) if a["kind"] == "agent.test"}) >= 100,
         60, "all 100 test alerts to arrive")

    got = [a for a in alerts(received) if a["kind"] == "agent.test"]
    ids = [a["id"] for a in got]
    assert list(dict.fromkeys(ids)) == raised  # every id, in the order raised
    duplicates = len(ids) - len(set(ids))
    assert duplicates <= 2, f"{duplicates} duplicates; only a lost PUBACK may cause one"
    for dup in {i for i in ids if ids.count(i) > 1}:  # a resend follows its first copy
        first_at = ids.index(dup)
        assert all(i in ids[:first_at + 1] for i in ids[first_at:ids.index(dup, first_at + 1)])
    for a in got:
        validate(a, "alert.schema.json")
    restarted = [a for a in alerts(received) if a["kind"] == "agent.started"]
    assert restarted[-1]["detail"]["previous_run"] == "unclean"

    # a clean stop says "offline" (reason shutdown) on the retained status topic
    agent.stop()
    wait(lambda: alerts(received, "/status")[-1]["state"] == "offline", 10, "offline status")
    last = alerts(received, "/status")[-1]
    validate(last, "mqtt-status.schema.json")
    assert (last["state"], last["reason"]) == ("offline", "shutdown")
    assert not (state_dir / "agent.running").exists()
