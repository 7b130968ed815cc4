"""lakemirror.checkpoints: the file-backed pipeline state and the in-memory checkpoint store."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from lakemirror.checkpoints.records import CheckpointRow, InMemoryCheckpointStore
from lakemirror.checkpoints.state import FileStateStore, InMemoryStateStore, TableProgress
from lakemirror.identifiers import TableName

SLUG = TableName("main", "sales", "orders").slug


def test_unknown_table_loads_defaults(tmp_path: Path) -> None:
    assert FileStateStore(tmp_path).load(SLUG) == TableProgress()
    assert InMemoryStateStore().load(SLUG) == TableProgress()


def test_file_store_round_trip(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path)
    progress = TableProgress(epoch=3, bootstrap_version=41, bootstrapped=True, source_table_id="abc-123",
                             paused=True)
    store.save(SLUG, progress)
    assert store.load(SLUG) == progress
    assert FileStateStore(tmp_path).load(SLUG) == progress  # a new process reads the same
    assert json.loads((tmp_path / "state" / f"{SLUG}.json").read_text()) == {
        "epoch": 3, "bootstrap_version": 41, "bootstrapped": True, "source_table_id": "abc-123", "paused": True}


def test_save_replaces_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path)
    for epoch in range(1, 6):
        store.save(SLUG, TableProgress(epoch=epoch))
    store.save("other", TableProgress(paused=True))
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == sorted([f"{SLUG}.json", "other.json"])
    assert store.load(SLUG).epoch == 5


def test_failed_save_keeps_the_old_state_and_no_temp_file(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path)
    store.save(SLUG, TableProgress(epoch=1))
    with pytest.raises(TypeError):
        store.save(SLUG, TableProgress(epoch=2, source_table_id=object()))  # type: ignore[arg-type]
    assert store.load(SLUG) == TableProgress(epoch=1)
    assert [p.name for p in (tmp_path / "state").iterdir()] == [f"{SLUG}.json"]


def test_unknown_keys_in_the_json_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / f"{SLUG}.json").write_text(json.dumps(
        {"epoch": 2, "paused": True, "written_by": "lakemirror 9.9", "future_field": [1, 2]}))
    assert FileStateStore(tmp_path).load(SLUG) == TableProgress(epoch=2, paused=True)


def test_next_epoch_resets_the_bootstrap_but_keeps_the_pause() -> None:
    old = TableProgress(epoch=1, bootstrap_version=5, bootstrapped=True, source_table_id="a", paused=True)
    assert old.next_epoch(9, "b") == TableProgress(epoch=2, bootstrap_version=9, bootstrapped=False,
                                                   source_table_id="b", paused=True)


# -- InMemoryCheckpointStore --------------------------------------------------------------------

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def row(source: str, batch_id: int, *, app: str | None = None, pipeline: str = "p", minute: int = 0,
        rows_merged: int = 1) -> CheckpointRow:
    return CheckpointRow(
        pipeline_id=pipeline, source_fqn=source, dest_fqn=source.replace("src", "dst"), epoch=1,
        batch_id=batch_id, txn_app_id=app or f"lakemirror/{pipeline}/{source}/e1", first_version=batch_id,
        last_version=batch_id, last_committed_version=batch_id, rows_read=2, rows_merged=rows_merged,
        rows_inserted=rows_merged, rows_updated=0, rows_deleted=0, lag_seconds=0.5, error=None, degraded=False,
        started_at=T0 + timedelta(minutes=minute), ended_at=T0 + timedelta(minutes=minute, seconds=3))


def test_append_skips_replays_per_app_id() -> None:
    store = InMemoryCheckpointStore()
    store.append(row("src.s.a", 0))
    store.append(row("src.s.a", 1))
    store.append(row("src.s.a", 1, rows_merged=99))  # replay of batch 1
    store.append(row("src.s.a", 0, rows_merged=99))  # replay of an older batch
    assert [(r.batch_id, r.rows_merged) for r in store.rows] == [(0, 1), (1, 1)]


def test_a_new_epoch_app_id_starts_again_at_batch_zero() -> None:
    store = InMemoryCheckpointStore()
    store.append(row("src.s.a", 7, app="lakemirror/p/a/e1"))
    store.append(row("src.s.a", 0, app="lakemirror/p/a/e2", minute=5))
    assert [(r.txn_app_id, r.batch_id) for r in store.rows] == [("lakemirror/p/a/e1", 7), ("lakemirror/p/a/e2", 0)]
    assert store.latest("p")["src.s.a"].txn_app_id == "lakemirror/p/a/e2"


def test_latest_is_the_newest_row_per_source_of_one_pipeline() -> None:
    store = InMemoryCheckpointStore()
    for r in (row("src.s.a", 0, minute=0), row("src.s.a", 1, minute=1), row("src.s.b", 0, minute=2),
              row("src.s.a", 0, pipeline="other", minute=9)):
        store.append(r)
    latest = store.latest("p")
    assert sorted(latest) == ["src.s.a", "src.s.b"]
    assert (latest["src.s.a"].batch_id, latest["src.s.b"].batch_id) == (1, 0)
    assert store.latest("missing") == {}


def test_checkpoint_row_columns_match_the_ddl() -> None:
    from lakemirror.checkpoints.records import CHECKPOINT_DDL
    assert CheckpointRow.column_names() == [c.split()[0] for c in CHECKPOINT_DDL.split(", ")]
    r = replace(row("src.s.a", 3), error="boom", degraded=True)
    assert r.as_dict()["error"] == "boom" and r.as_dict()["batch_id"] == 3


def _batch_row(batch_id: int, app: str = "lakemirror/p/t/e1") -> CheckpointRow:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return CheckpointRow(pipeline_id="p", source_fqn="a.b.c", dest_fqn="d.e.f", epoch=1, batch_id=batch_id,
                         txn_app_id=app, first_version=batch_id, last_version=batch_id,
                         last_committed_version=batch_id, rows_read=1, rows_merged=1, rows_inserted=1,
                         rows_updated=0, rows_deleted=0, lag_seconds=0.0, error=None, degraded=False,
                         started_at=now, ended_at=now)


def test_a_replayed_batch_writes_its_row_only_if_the_first_attempt_did_not() -> None:
    store = InMemoryCheckpointStore()
    store.append(_batch_row(0), known_new=True)
    store.append(_batch_row(0))          # replay after a crash past the row: skipped
    store.append(_batch_row(1))          # replay after a crash before the row: written
    store.append(_batch_row(1))
    store.append(_batch_row(0, app="lakemirror/p/t/e2"), known_new=True)  # a new epoch's batch 0
    assert [(r.txn_app_id[-2:], r.batch_id) for r in store.rows] == [("e1", 0), ("e1", 1), ("e2", 0)]


def test_a_row_declared_new_that_exists_is_a_bug_the_twin_reports() -> None:
    store = InMemoryCheckpointStore()
    store.append(_batch_row(3), known_new=True)
    with pytest.raises(AssertionError):
        store.append(_batch_row(3), known_new=True)
