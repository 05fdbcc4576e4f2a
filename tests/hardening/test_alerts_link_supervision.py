"""Issue 17, finding 5: alerts that silently never leave.

The alert connection's task met an error that is not an MQTT error (the IDNA codec
rejecting a host name with a double dot; paho failing to pack a 70,000-character client
id) and died unsupervised: the target said ``connecting`` forever, the outbox grew, and
nothing was logged. Now (1) the config is refused at load, naming the key; (2) a target
that gets past that anyway (a config built in code) says ``config_error`` with one log
line, however often it is retried; (3) any other exception in a connect attempt is
``internal_error`` with a traceback, and the link keeps retrying; (4) if the link's task
itself dies, the alert engine restarts it with backoff.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import pytest

from edgeheal import settings as validation
from edgeheal.agent.alerts import link_keeper
from edgeheal.agent.alerts.engine import AlertEngine
from edgeheal.boundaries.mqtt import transport
from edgeheal.boundaries.mqtt.link import Link
from edgeheal.config import ConfigError, MqttTarget
from tests.alerts.support import harness
from tests.support import until

BAD_HOSTS = ["broker..example", "a" * 64 + ".example", "-lead.example", "sp ace", "x" * 300,
             "nul\0host", "tab\thost", "."]


def _toml(host: str = "127.0.0.1", client_id: str = "") -> str:
    return (f'[[mqtt.targets]]\nname = "alerts"\nhost = "{host}"\nport = 1883\n'
            f'client_id = "{client_id}"\n[alerts]\ntarget = "alerts"\n')


@pytest.mark.parametrize("host", BAD_HOSTS)
def test_a_host_name_that_cannot_be_resolved_is_refused_at_load(host: str) -> None:
    escaped = host.replace("\0", "\\u0000").replace("\t", "\\t")
    with pytest.raises(ConfigError) as info:
        validation.loads(_toml(host=escaped))
    assert "mqtt.targets[0].host" in str(info.value)


@pytest.mark.parametrize("client_id", ["c" * 70_000, "\\u0000id"])
def test_a_client_id_mqtt_cannot_carry_is_refused_at_load(client_id: str) -> None:
    with pytest.raises(ConfigError) as info:
        validation.loads(_toml(client_id=client_id))
    assert "mqtt.targets[0].client_id" in str(info.value)
    assert "c" * 100 not in str(info.value)


@pytest.mark.parametrize("host", ["broker.example", "bücher.example", "fd00::1", "10.0.0.1",
                                  "host.", "_mqtt.example"])
def test_good_host_names_still_load(host: str) -> None:
    assert validation.loads(_toml(host=host)).mqtt.targets[0].host == host


async def _config_error(target: MqttTarget, caplog: pytest.LogCaptureFixture) -> Link:
    link = Link(target, "edge-1", min_delay=0.01, max_delay=0.02)
    task = asyncio.create_task(link.run())
    try:
        await until(lambda: link.state.attempts >= 5, within=10)
    finally:
        link.abort()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return link


@pytest.mark.parametrize(("field", "value", "says"), [
    ("host", "broker..example", "host is not a valid host name"),
    ("client_id", "c" * 70_000, "client id is 70000 bytes long"),
])
async def test_a_target_that_slipped_past_validation_says_config_error_once(
        caplog: pytest.LogCaptureFixture, field: str, value: str, says: str) -> None:
    caplog.set_level(logging.DEBUG)
    target = dataclasses.replace(MqttTarget(name="alerts", host="127.0.0.1", port=9,
                                            timeout=2.0), **{field: value})
    link = await _config_error(target, caplog)
    assert not link.state.up
    assert link.state.reason == "config_error"
    assert says in link.state.message
    lines = [r for r in caplog.records if "config_error" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage()[:200] for r in lines]
    assert "c" * 100 not in caplog.text


async def test_an_unexpected_exception_while_connecting_is_internal_error_and_retried(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: object, **kw: object) -> object:
        raise LookupError("simulated bug")

    monkeypatch.setattr(transport, "_resolve", broken)
    link = await _config_error(MqttTarget(name="alerts", host="127.0.0.1", port=9,
                                          timeout=2.0), caplog)
    assert link.state.reason == "internal_error"
    assert link.state.attempts >= 5  # kept trying
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1  # once, not once per attempt
    assert "unexpected LookupError" in tracebacks[0].getMessage()


async def test_the_engine_restarts_a_link_task_that_died(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link_keeper, "LINK_RESTART_MAX", 0.05)
    h = harness(tmp_path, _toml())
    assert h.link is not None
    engine = AlertEngine(h.ctx, link=h.link)
    calls = 0
    real_run = h.link.run

    async def run(**kw: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("simulated crash of the link task")
        await real_run(**kw)  # type: ignore[arg-type]

    monkeypatch.setattr(h.link, "run", run)
    monkeypatch.setattr(asyncio, "sleep", _fast_sleep(asyncio.sleep))
    serve = asyncio.create_task(engine.serve())
    try:
        await until(lambda: calls >= 2, within=10)
    finally:
        serve.cancel()
        await asyncio.gather(serve, return_exceptions=True)
        h.link.abort()
        await engine.close()
    assert "alert link task crashed" in caplog.text


def _fast_sleep(real: object) -> object:
    async def sleep(delay: float, result: object = None) -> object:
        return await real(min(delay, 0.05), result)  # type: ignore[operator]
    return sleep
