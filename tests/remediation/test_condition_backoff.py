"""Issue 27, finding 8: the Node condition is not re-sent every second while the API fails.

With the API answering 500, the reporter re-sent the condition on every evaluation (36
requests in 12 s from one node). Now one sender backs off (capped, jittered) and a
condition already sent is never sent again: the requests are counted at the test API
server over a failing window, then after it heals.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeheal.agent.remediation.reporting import NodeReporter
from edgeheal.boundaries.kube import KubeClient
from edgeheal.lab.kubeapi import Credentials, FakeKube
from edgeheal.model import State
from tests.remediation.conftest import NODE, settings_for
from tests.remediation.support import make_config, until

WINDOW = 3.0
"""Seconds of a failing API after the third send, with the condition evaluated every
50 ms."""


@dataclass
class View:
    """The few fields of a TunnelView the reporter reads."""

    healthy: bool
    wireguard: State | None = State.FAILED
    wireguard_reason: str = "stalled"
    tunnel_mqtt: dict[str, State] = field(default_factory=dict)

    def failure(self) -> str | None:
        return None if self.healthy else "wireguard_stalled"


def most_sends(seconds: float) -> int:
    """The most sends the backoff allows in ``seconds``: the first at once, then gaps of
    at least 0.1, 0.2, 0.4 and 0.5 s from then on."""
    sends, at = 1, 0.0
    for gap in (0.1, 0.2, 0.4, *[0.5] * 1000):
        at += gap
        if at > seconds:
            return sends
        sends += 1
    return sends


def patches(api: FakeKube) -> int:
    return sum(1 for r in api.requests if r.method == "PATCH")


async def _evaluate(reporter: NodeReporter, view: Any, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        reporter.follow(view)
        await asyncio.sleep(0.05)


async def test_a_failing_api_gets_the_condition_with_backoff_and_never_twice(
        api: FakeKube, token: Credentials, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token)
    config = make_config(tmp_path, kube=f'[kubernetes]\nkubeconfig = "{kubeconfig}"\n')
    kube = KubeClient(settings_for(kubeconfig, retries=0))
    reporter = NodeReporter(config, lambda: kube, retry_min=0.2, retry_max=1.0,
                            rng=random.Random(27))  # noqa: S311 - jitter
    fault = api.fail(500, times=1_000_000, method="PATCH")
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        for _ in range(600):  # at least three sends (a loaded machine may take its time)
            if patches(api) >= 3:
                break
            reporter.follow(View(healthy=False))
            await asyncio.sleep(0.05)
        await _evaluate(reporter, View(healthy=False), WINDOW)
        failed = patches(api)
        # evaluated every 50 ms, yet the backoff paces the sends: at 0 and after at least
        # 0.1, 0.2, 0.4, then 0.5 s each (half of 0.2 doubling to the 1.0 s cap, jittered)
        assert 3 <= failed <= most_sends(loop.time() - began), failed
        assert reporter.failures == failed
        fault.times = 0  # the API heals
        await until(lambda: (api.condition(NODE, "EdgeTunnelHealthy") or {}).get("status")
                    == "False", what="the condition sent", within=5.0)
        assert patches(api) == failed + 1
        await _evaluate(reporter, View(healthy=False), 1.0)
        assert patches(api) == failed + 1  # unchanged: never sent again
        await _evaluate(reporter, View(healthy=True, wireguard=State.OK), 0.5)
        await until(lambda: (api.condition(NODE, "EdgeTunnelHealthy") or {}).get("status")
                    == "True", what="the change sent")
        assert patches(api) == failed + 2
    finally:
        reporter.cancel()
        await asyncio.gather(*reporter.background, return_exceptions=True)
        await kube.close()


async def test_an_unexpected_error_in_the_sender_is_logged_and_retried(
        tmp_path: Path, caplog: Any) -> None:
    class Broken:
        calls = 0

        async def set_node_condition(self, *args: object) -> None:
            Broken.calls += 1
            raise AttributeError("'list' object has no attribute 'get'")

    config = make_config(tmp_path, kube='[kubernetes]\nkubeconfig = "/nonexistent"\n')
    reporter = NodeReporter(config, Broken,  # type: ignore[arg-type]
                            retry_min=0.05, retry_max=0.1)
    try:
        reporter.follow(View(healthy=False))
        await until(lambda: Broken.calls >= 3, what="retried after a bug")
        assert "could not update the EdgeTunnelHealthy condition" in caplog.text
        assert "AttributeError" in caplog.text
        assert reporter.background  # still alive
    finally:
        reporter.cancel()
        await asyncio.gather(*reporter.background, return_exceptions=True)
