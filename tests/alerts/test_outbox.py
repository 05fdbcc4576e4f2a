"""The durable outbox: order, acknowledgement, bounds, persistence, corruption."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from edgeheal.agent.alerts.outbox import DROPPED_KIND, Outbox


class Wall:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _add(box: Outbox, n: int, kind: str = "agent.test", prefix: str = "a") -> list[str]:
    ids = []
    for i in range(n):
        alert_id = f"{prefix}{i:04d}"
        box.add(alert_id, kind, box.wall(), alert_id.encode())
        ids.append(alert_id)
    return ids


def test_alerts_come_out_oldest_first_and_leave_only_when_acknowledged(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_count=100, max_age=3600)
    ids = _add(box, 5)
    seen = []
    while (entry := box.oldest()) is not None:
        assert box.oldest() == entry  # looking does not consume
        seen.append(entry.id)
        box.delete(entry.seq)
    assert seen == ids
    assert box.depth() == 0
    box.close()


def test_the_outbox_survives_reopening_with_order_kept(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    box = Outbox(path, max_count=100, max_age=3600)
    first = _add(box, 3, prefix="x")
    box.delete(box.oldest().seq)  # type: ignore[union-attr]
    box.close()
    again = Outbox(path, max_count=100, max_age=3600)
    assert again.existed
    later = _add(again, 2, prefix="y")
    assert [e.id for e in again.entries()] == first[1:] + later
    again.close()


def test_sequence_numbers_are_never_reused_after_everything_was_delivered(
        tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_count=100, max_age=3600)
    _add(box, 2)
    last = box.entries()[-1].seq
    for entry in box.entries():
        box.delete(entry.seq)
    _add(box, 1, prefix="b")
    assert box.oldest().seq > last  # type: ignore[union-attr]
    box.close()


def test_the_database_is_wal_with_synchronous_full(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_count=10, max_age=60)
    _add(box, 1)
    db = sqlite3.connect(tmp_path / "o.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert box._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    # a committed row is visible to another connection at once (it is on disk)
    assert db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 1
    db.close()
    box.close()


def test_the_page_cache_is_capped_so_a_backlog_costs_little_memory(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_count=10, max_age=60)
    assert box._db is not None
    # negative: KiB; SQLite's default is -2000 (docs/footprint.md measures both)
    assert box._db.execute("PRAGMA cache_size").fetchone()[0] == -512
    box.close()


@pytest.mark.parametrize(("max_count", "added", "dropped_total", "kept"), [
    (5, 5, 0, 5),
    (5, 6, 1, 5),
    (5, 12, 7, 5),
    (1, 3, 2, 1),
])
def test_the_count_bound_drops_the_oldest(tmp_path: Path, max_count: int, added: int,
                                          dropped_total: int, kept: int) -> None:
    box = Outbox(tmp_path / "o.db", max_count=max_count, max_age=3600)
    dropped = 0
    ids = []
    for i in range(added):
        ids.append(f"a{i:04d}")
        dropped += box.add(ids[-1], "agent.test", 0.0, b"{}")
    assert dropped == dropped_total
    assert [e.id for e in box.entries()] == ids[-kept:]
    box.close()


def test_the_dropped_report_is_exempt_from_the_bounds(tmp_path: Path) -> None:
    wall = Wall()
    box = Outbox(tmp_path / "o.db", max_count=2, max_age=60, wall=wall)
    box.add("d", DROPPED_KIND, wall(), b"{}")
    _add(box, 4)
    assert [e.id for e in box.entries()] == ["d", "a0002", "a0003"]
    wall.now += 3600
    assert box.prune() == 2
    assert [e.id for e in box.entries()] == ["d"]
    box.close()


def test_the_age_bound_drops_only_alerts_older_than_max_age(tmp_path: Path) -> None:
    wall = Wall()
    box = Outbox(tmp_path / "o.db", max_count=100, max_age=600, wall=wall)
    _add(box, 2, prefix="old")
    wall.now += 400
    _add(box, 2, prefix="new")
    wall.now += 300  # old ones are 700 s old, new ones 300 s
    assert box.prune() == 2
    assert [e.id for e in box.entries()] == ["new0000", "new0001"]
    assert box.prune() == 0
    box.close()


def test_a_pending_alert_can_be_updated_in_place(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_count=100, max_age=600)
    box.add("d", DROPPED_KIND, 0.0, b'{"n":1}')
    _add(box, 1)
    entry = box.latest(DROPPED_KIND)
    assert entry is not None
    assert box.replace(entry.seq, b'{"n":2}')
    assert box.entries()[0].payload == b'{"n":2}'
    assert [e.id for e in box.entries()] == ["d", "a0000"]
    box.close()


def test_a_corrupt_database_is_moved_aside_and_a_new_one_started(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "o.db"
    path.write_bytes(b"this is not a database" * 100)
    box = Outbox(path, max_count=10, max_age=60)
    assert box.depth() == 0
    assert list(tmp_path.glob("o.db.corrupt-*"))
    assert "is corrupt" in caplog.text
    _add(box, 1)
    assert box.depth() == 1
    box.close()


def test_meta_values_persist(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db", max_count=10, max_age=60)
    box.set_meta("k", "v1")
    box.set_meta("k", "v2")
    box.close()
    again = Outbox(tmp_path / "o.db", max_count=10, max_age=60)
    assert again.get_meta("k") == "v2"
    again.close()
