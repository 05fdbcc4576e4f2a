"""The whole agent (`python -m edgeheal run`) inside a namespace: the offload enforcer
corrects a re-created interface and a manual change on the link events, long before the
(one hour) recheck, and /metrics counts both with cause ``link_event``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.offload.conftest import Lab
from tests.offload.helpers import set_feature
from tests.support import until

pytestmark = [pytest.mark.netns, pytest.mark.slow]

DEADLINE = 20.0
PORT = 9917  # inside the test's own fresh namespace, so no other test can hold it


def _enter(ns: str) -> None:
    from pyroute2 import netns

    netns.setns(ns, flags=0, fork=False)  # this worker thread only


@pytest.fixture
def in_ns(lab: Lab) -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """A worker thread living in the lab namespace, to reach the agent's loopback."""
    pool = concurrent.futures.ThreadPoolExecutor(1, initializer=_enter, initargs=(lab.ns,))
    yield pool
    pool.shutdown(wait=True)


def _get(path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=2) as resp:
        body: bytes = resp.read()
    return body.decode()


def _sample(metrics: str, name: str, **labels: str) -> float | None:
    for line in metrics.splitlines():
        m = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return None


async def test_the_agent_corrects_link_events_without_waiting_for_the_recheck(
        lab: Lab, in_ns: concurrent.futures.ThreadPoolExecutor, tmp_path: Path) -> None:
    lab.veth("wwan0", "peer0")
    config = tmp_path / "edgeheal.toml"
    config.write_text(f"""
[agent]
state_dir = "{tmp_path}/state"
node_name = "edge-offload"
[http]
listen = ["127.0.0.1:{PORT}"]
[wireguard]
enabled = false
[offload]
interfaces = ["wwan*"]
interval = "1h"
""", encoding="utf-8")
    log = tmp_path / "agent.log"
    agent = lab.sandbox.spawn([sys.executable, "-m", "edgeheal", "run", "--config", str(config)],
                              ns=lab.ns, log_path=log)

    async def metrics_until(what: str, predicate: Callable[[str], bool]) -> str:
        """The agent's /metrics once ``predicate`` holds for it (the agent must stay up)."""
        def probe() -> str:
            assert agent.poll() is None, "the agent exited"
            try:
                metrics = in_ns.submit(_get, "/metrics").result()
            except OSError:
                return ""
            return metrics if metrics and predicate(metrics) else ""
        try:
            return await until(probe, within=DEADLINE, every=0.1, what=what)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{log.read_text()}") from None

    def count(cause: str) -> Callable[[str], float | None]:
        return lambda m: _sample(m, "edgeheal_offload_corrections_total",
                                 interface="wwan0", cause=cause)

    await metrics_until("boot correction", lambda m: count("boot")(m) == 1)
    await asyncio.to_thread(lab.delete, "wwan0")
    await asyncio.to_thread(lab.veth, "wwan0", "peer0", expect_on=False)
    await metrics_until("re-created interface corrected", lambda m: count("link_event")(m) == 1)
    assert lab.checksums("wwan0")["tx-checksum-ip-generic"] == (False, False)

    await asyncio.to_thread(set_feature, lab.ns, "wwan0", "tx-checksum-ip-generic", "on")
    metrics = await metrics_until("manual change corrected", lambda m: count("link_event")(m) == 2)
    assert lab.checksums("wwan0")["tx-checksum-ip-generic"] == (False, False)
    assert count("recheck")(metrics) == 0  # at 0 from the start, never corrected
    assert _sample(metrics, "edgeheal_offload_feature_enabled", interface="wwan0",
                   feature="tx-checksum-ip-generic") == 0
    text = log.read_text()
    assert "event offload.drift_corrected" in text
