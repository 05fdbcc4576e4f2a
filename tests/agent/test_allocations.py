"""``EDGEHEAL_TRACEMALLOC`` and the ``debug.allocations`` control command."""

from __future__ import annotations

import tracemalloc

import pytest

from edgeheal.agent.tasks import TRACEMALLOC_ENV, Allocations, trace_allocations


@pytest.mark.parametrize("value", ["", "0"])
def test_tracing_is_off_unless_asked(value: str) -> None:
    assert trace_allocations({TRACEMALLOC_ENV: value}) == 0
    assert trace_allocations({}) == 0
    assert not tracemalloc.is_tracing()


@pytest.mark.parametrize("value", ["yes", "-1", "101", "2.5"])
def test_a_bad_value_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=f"{TRACEMALLOC_ENV}='{value}'.*1 to 100"):
        trace_allocations({TRACEMALLOC_ENV: value})
    assert not tracemalloc.is_tracing()


async def test_the_command_says_how_to_turn_tracing_on() -> None:
    with pytest.raises(ValueError, match=f"tracemalloc is off.*{TRACEMALLOC_ENV}"):
        await Allocations()({})


async def test_the_second_answer_shows_what_grew_in_between() -> None:
    assert trace_allocations({TRACEMALLOC_ENV: "3"}) == 3
    try:
        command = Allocations()
        first = await command({"top": 5})
        assert "grown" not in first
        assert 1 <= len(first["top"]) <= 5
        held = [bytearray(1024) for _ in range(2000)]  # ~2 MB, from this line
        second = await command({"top": 5})
        top = second["grown"][0]
        assert top["size_diff_kib"] >= 1900
        assert "test_allocations.py" in top["where"][0]
        assert second["traced_mib"] > first["traced_mib"]
        del held
        for bad, match in (({"top": 0}, "top=0"), ({"top": True}, "top=True"),
                           ({"by": "size"}, "by='size'")):
            with pytest.raises(ValueError, match=match):
                await command(bad)
    finally:
        tracemalloc.stop()
