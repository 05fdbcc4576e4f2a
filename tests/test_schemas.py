"""The schema helpers really check ``"format": "date-time"``.

jsonschema's ``FormatChecker`` passes any string for a format whose checker library is
missing (``rfc3339-validator`` for date-time, a dev extra): the schemas would then accept
"yesterday" as a time without a word. These tests fail when that happens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from tests.agent.support import validate as agent_validate
from tests.alerts.support import validate as alerts_validate

HELPERS: dict[str, Callable[[Any, str], None]] = {"agent": agent_validate,
                                                   "alerts": alerts_validate}
STATUS = {"state": "ok", "time": "2026-12-02T20:00:00Z", "checks": {"wireguard": "ok"}}
"""A valid retained MQTT status document (schemas/mqtt-status.schema.json)."""


def test_the_format_checker_checks_date_time() -> None:
    assert "date-time" in jsonschema.FormatChecker().checkers


@pytest.mark.parametrize("helper", HELPERS)
@pytest.mark.parametrize("time", ["2026-12-02T20:00:00Z", "2026-12-02T20:00:00.123+01:00"])
def test_a_good_date_time_passes(helper: str, time: str) -> None:
    HELPERS[helper]({**STATUS, "time": time}, "mqtt-status.schema.json")


@pytest.mark.parametrize("helper", HELPERS)
@pytest.mark.parametrize("time", ["yesterday", "2026-12-02", "2026-12-02T20:00:00",
                                  "2026-13-02T20:00:00Z"])
def test_a_bad_date_time_is_rejected(helper: str, time: str) -> None:
    with pytest.raises(jsonschema.ValidationError, match="is not a 'date-time'"):
        HELPERS[helper]({**STATUS, "time": time}, "mqtt-status.schema.json")
