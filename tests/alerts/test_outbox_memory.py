"""The outbox's memory queue on its own: its bound, the exempt kind, and the numbers of
held alerts that moved into the database (the outbox's use of it, with real SQLite
faults, is ``tests/hardening/test_alerts_outbox_faults.py``)."""

from __future__ import annotations

from edgeheal.agent.alerts.outbox_memory import MemoryQueue

DROPPED = "alerts.dropped"


def _held(queue: MemoryQueue) -> list[str]:
    return [e.id for e in queue.entries]


def test_the_bound_drops_the_oldest_but_never_the_report_of_a_loss() -> None:
    queue = MemoryQueue(2, exempt=DROPPED)
    assert queue.hold("d", DROPPED, 1.0, b"") == 0
    assert [queue.hold(i, "agent.test", 2.0, b"") for i in ("a", "b", "c", "e")] == [0, 0, 1, 1]
    assert _held(queue) == ["d", "c", "e"]
    assert queue.lost() == 2  # the report of the loss is not itself counted as lost
    assert [e.seq for e in queue.entries] == [-1, -4, -5]  # numbers are never reused


def test_pruning_by_age_spares_the_report_of_a_loss() -> None:
    queue = MemoryQueue(10, exempt=DROPPED)
    queue.hold("old", "agent.test", 1.0, b"")
    queue.hold("d", DROPPED, 1.0, b"")
    queue.hold("new", "agent.test", 5.0, b"")
    assert queue.prune(cutoff=3.0) == 1
    assert _held(queue) == ["d", "new"]


def test_a_held_alert_written_to_the_database_keeps_answering_to_its_old_number() -> None:
    queue = MemoryQueue(10, exempt=DROPPED)
    queue.hold("a", "agent.test", 1.0, b"")
    queue.hold("b", "agent.test", 1.0, b"")
    queue.acked.add(7)
    queue.meta["problems"] = "{}"
    assert not queue.holds_nothing
    queue.written([(-1, 41), (-2, 42)])
    assert queue.holds_nothing
    assert queue.current(-2) == 42  # replace() asks: the number stays known
    assert queue.current(-1, forget=True) == 41  # delete() asks for the last time
    assert queue.current(-1) == -1
    assert queue.current(9) == 9  # a row's own number is its number


def test_a_held_alert_is_updated_and_deleted_in_place() -> None:
    queue = MemoryQueue(10, exempt=DROPPED)
    queue.hold("d", DROPPED, 1.0, b"1")
    queue.hold("a", "agent.test", 1.0, b"")
    assert queue.replace(-1, b"2")
    assert not queue.replace(-9, b"3")
    latest = queue.latest(DROPPED)
    assert latest is not None
    assert latest.payload == b"2"
    queue.delete(-1)
    assert queue.latest(DROPPED) is None
    assert _held(queue) == ["a"]
