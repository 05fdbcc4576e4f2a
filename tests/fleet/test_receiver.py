"""``edgeheal fleet receive``'s logic and its HTTP bounds: what a version-4 webhook message
asks of the hold, what is refused (and answered how: Alertmanager retries 5xx only), the
bearer token, and the command's usage errors. The publish is a recorder here; the real
Prometheus -> Alertmanager -> receiver -> Mosquitto -> link path is
tests/fleet/test_automatic_hold.py.

The messages follow Alertmanager's webhook ``Message`` (notify/webhook/webhook.go, 0.25:
``template.Data`` plus ``version``, ``groupKey``, ``truncatedAlerts``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from edgeheal.base.compat import UTC
from edgeheal.boundaries.mqtt import MqttError, hold
from edgeheal.tools import hold_receiver
from edgeheal.tools.hold_receiver import Receiver, WebhookRefused, verdict

ALERT = "EdgehealHubFaultFleetwide"
NOW = datetime(2026, 12, 4, 19, 0, tzinfo=UTC)


def _message(*alerts: tuple[str, str], **over: Any) -> bytes:
    doc: dict[str, Any] = {
        "receiver": "edgeheal-fleet-hold", "status": "firing",
        "alerts": [{"status": status, "labels": {"alertname": name, "severity": "critical"},
                    "annotations": {"summary": "s"}, "startsAt": "2026-12-04T19:00:00Z",
                    "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
                    "fingerprint": "1a30ba71cca2921f"} for name, status in alerts],
        "groupLabels": {"alertname": ALERT}, "commonLabels": {}, "commonAnnotations": {},
        "externalURL": "http://am:9093", "version": "4",
        "groupKey": '{}/{alertname="EdgehealHubFaultFleetwide"}:{alertname="x"}',
        "truncatedAlerts": 0}
    doc.update(over)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("body", "said"), [
    (_message((ALERT, "firing")), "hold"),
    (_message((ALERT, "resolved")), "release"),
    (_message((ALERT, "resolved"), (ALERT, "firing")), "hold"),
    (_message(("EdgehealTunnelFailed", "firing")), None),
    (_message(), None),
])
def test_a_message_holds_while_the_alert_fires_and_releases_when_it_resolves(
        body: bytes, said: str | None) -> None:
    assert verdict(body, ALERT) == said


@pytest.mark.parametrize(("body", "said"), [
    (b"hold!", "not JSON"),
    (b"[1]", "not a JSON object (list)"),
    (b"[" * 100_000, "bytes, more than 65536"),
    (_message((ALERT, "firing"), version="3"), '"version" is not "4"'),
    (_message((ALERT, "firing"), alerts={"a": 1}), '"alerts" is missing or not a list'),
    (_message(alerts=[1]), "alerts[0] is not an object"),
    (_message(alerts=[{"status": "firing", "labels": {"alertname": 5}}]),
     'alerts[0]."labels" is not an object of strings'),
    (_message(alerts=[{"status": "pending", "labels": {"alertname": ALERT}}]),
     'alerts[0]."status" is not "firing" or "resolved"'),
    (_message(alerts=[{"status": "firing", "labels": {}}] * 1001), "more than 1000"),
])
def test_a_body_that_is_not_a_webhook_message_is_refused_saying_why(body: bytes,
                                                                    said: str) -> None:
    with pytest.raises(WebhookRefused) as err:
        verdict(body, ALERT)
    assert said in str(err.value)


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.payloads: list[bytes] = []
        self.fail = fail

    async def __call__(self, payload: bytes) -> None:
        if self.fail:
            raise MqttError("refused", "127.0.0.1:1883: not authorized")
        self.payloads.append(payload)


async def test_a_firing_notification_publishes_a_hold_the_agents_obey_and_a_resolve_clears_it(
) -> None:
    sink = Recorder()
    receiver = Receiver(sink, ALERT, 1800.0, now=lambda: NOW)
    assert await receiver.handle(_message((ALERT, "firing"))) == \
        (200, "held until 2026-12-04T19:30:00Z")
    got = hold.parse(sink.payloads[0], NOW, 3600.0)  # what every agent does with it
    assert (got.reason, got.until, got.by) == (ALERT, NOW + timedelta(minutes=30),
                                               "alertmanager")
    assert await receiver.handle(_message(("Other", "firing"))) == \
        (200, f"ignored: no {ALERT} alert in it")
    assert await receiver.handle(_message((ALERT, "resolved"))) == (200, "released")
    assert sink.payloads[1:] == [b""]
    assert (receiver.published, receiver.refused) == (2, 0)
    status, text = await receiver.handle(b"{}")
    assert (status, receiver.refused) == (400, 1)
    assert text.startswith("refused: ")


async def test_a_broker_that_refuses_answers_503_so_alertmanager_retries() -> None:
    receiver = Receiver(Recorder(fail=True), ALERT, 1800.0)
    assert await receiver.handle(_message((ALERT, "firing"))) == \
        (503, "broker: 127.0.0.1:1883: not authorized")
    assert receiver.published == 0


def _post(url: str, body: bytes, headers: dict[str, str], method: str = "POST",
          ) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body if method == "POST" else None,  # noqa: S310 - loopback
                                     headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 - loopback
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


async def test_the_server_asks_for_the_token_and_bounds_every_request(caplog: Any) -> None:
    token = "tok-9f2c-never-logged"
    sink = Recorder()
    receiver = Receiver(sink, ALERT, 1800.0, token)
    stop = asyncio.Event()
    names: list[str] = []
    server = asyncio.create_task(hold_receiver.serve(receiver, "127.0.0.1:0", stop,
                                                     names.append), name="test.receive")
    try:
        for _ in range(200):
            if names or server.done():
                break
            await asyncio.sleep(0.02)
        assert names, server
        url = names[0] + hold_receiver.PATH
        good = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        cases = [
            (url, _message((ALERT, "firing")), {}, "POST", 401),
            (url, _message((ALERT, "firing")), {"Authorization": "Bearer nope"}, "POST", 401),
            (url, _message((ALERT, "firing")), {"Authorization": token}, "POST", 401),
            (url, b"x" * (hold_receiver.MAX_BODY + 1), good, "POST", 413),
            (url, _message((ALERT, "firing"), version="2"), good, "POST", 400),
            (url, b"", good, "GET", 405),
            (names[0] + "/other", _message((ALERT, "firing")), good, "POST", 404),
            (url, _message((ALERT, "firing")), good, "POST", 200),
        ]
        for where, body, headers, method, want in cases:
            status, text = await asyncio.to_thread(_post, where, body, headers, method)
            assert status == want, (method, where, headers.keys(), text)
        assert len(sink.payloads) == 1
        assert hold.parse(sink.payloads[0], datetime.now(UTC), 3600.0).reason == ALERT
    finally:
        stop.set()
        await asyncio.wait_for(server, 10)
    assert token not in caplog.text
    assert "without the right bearer token" in caplog.text


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "ops.toml"
    config.write_text(
        f'[agent]\nnode_name = "ops-box"\nstate_dir = "{tmp_path}/state"\n'
        '[[mqtt.targets]]\nname = "cloud"\nhost = "127.0.0.1"\nport = 1\n'
        '[alerts]\ntarget = "cloud"\n[fleet]\nmax_hold = "2h"\n')
    return subprocess.run([sys.executable, "-m", "edgeheal", "--config", str(config),
                           "fleet", "receive", *args], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize(("args", "said"), [
    (("--for", "3h"), "--for must be 1m to [fleet] max_hold (7200s), got 10800s"),
    (("--for", "soon"), "--for: "),
    (("--token-file", "/nonexistent/token"), "cannot read it (FileNotFoundError)"),
    (("--listen", "nowhere"), "--listen nowhere: expected host:port"),
])
def test_the_command_says_what_is_wrong_with_its_arguments(tmp_path: Path,
                                                           args: tuple[str, ...],
                                                           said: str) -> None:
    proc = _cli(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr
