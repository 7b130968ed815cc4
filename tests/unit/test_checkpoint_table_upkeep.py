"""The checkpoint table stays small while every batch appends to it: its one-row files are
compacted, the files they replaced vacuumed after the table's retention, and no row is lost or
doubled on the way (delta-rs on the driver's disk, no Spark)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from lakemirror.checkpoints.delta_store import DeltaCheckpointStore
from lakemirror.checkpoints.offline import read_rows
from lakemirror.checkpoints.records import CheckpointRow
from lakemirror.checkpoints.table_upkeep import RETENTION, RETENTION_PROPERTIES, Upkeep, UpkeepSchedule
from lakemirror.identifiers import TableName
from lakemirror.tables import TableLocation
from tests.unit.test_checkpoint_table_ensure import JvmSession


def store(path: Path, compact_every: int = 5, vacuum_every: int = 2) -> DeltaCheckpointStore:
    s = DeltaCheckpointStore(JvmSession(), TableLocation(TableName("dst", "continuous_sync", "checkpoints"),  # type: ignore[arg-type]
                                                         str(path)))
    s.upkeep_schedule = UpkeepSchedule(compact_every=compact_every, vacuum_every=vacuum_every)
    return s


def row(batch_id: int) -> CheckpointRow:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return CheckpointRow(pipeline_id="p", source_fqn="a.b.c", dest_fqn="d.e.f", epoch=1, batch_id=batch_id,
                         txn_app_id="lakemirror/p/t/e1", first_version=batch_id, last_version=batch_id,
                         last_committed_version=batch_id, rows_read=1, rows_merged=1, rows_inserted=1,
                         rows_updated=0, rows_deleted=0, lag_seconds=0.0, error=None, degraded=False,
                         started_at=now, ended_at=now)


def parquet_files(path: Path) -> int:
    return sum(1 for f in path.iterdir() if f.suffix == ".parquet")


def test_the_schedule_compacts_every_interval_and_vacuums_every_few_compactions() -> None:
    schedule = UpkeepSchedule(compact_every=3, vacuum_every=2)
    steps = [schedule.appended() for _ in range(12)]
    none, compact, vacuum = Upkeep.NONE, Upkeep.COMPACT, Upkeep.COMPACT_AND_VACUUM
    assert steps == [none, none, compact, none, none, vacuum] * 2


def test_appends_keep_the_live_file_list_short_and_every_row_once(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints"
    s = store(path)
    s.ensure()
    configuration = DeltaTable(str(path)).metadata().configuration
    assert [configuration[p] for p in RETENTION_PROPERTIES] == [RETENTION, RETENTION]
    for b in range(23):
        s.append(row(b), known_new=True)
    table = DeltaTable(str(path))
    assert len(table.file_uris()) <= 5, "at most one compacted file and the appends since"
    rows = read_rows(str(path), "p")
    assert rows is not None and sorted(r.batch_id for r in rows) == list(range(23))
    assert parquet_files(path) > 5, "the replaced files stay for readers within the retention"


def test_a_retention_set_by_hand_is_kept_and_the_vacuum_deletes_what_it_no_longer_covers(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints"
    s = store(path)
    s.ensure()
    files_retention = RETENTION_PROPERTIES[0]
    DeltaTable(str(path)).alter.set_table_properties({files_retention: "interval 1 seconds"})
    for b in range(4):
        s.append(row(b), known_new=True)
    first = {Path(u).name for u in DeltaTable(str(path)).file_uris()}
    s.append(row(4), known_new=True)  # the first compaction
    time.sleep(1.5)  # the files it replaced are now older than the retention
    for b in range(5, 10):  # the second compaction, and the vacuum
        s.append(row(b), known_new=True)
    table = DeltaTable(str(path))
    assert table.metadata().configuration[files_retention] == "interval 1 seconds"
    kept = {f.name for f in path.iterdir() if f.suffix == ".parquet"}
    assert len(first) == 4 and not first & kept, "the files the first compaction replaced are gone from storage"
    assert len(kept) == 7, "the second compaction's file, and the six it replaced a moment ago"
    rows = read_rows(str(path), "p")
    assert rows is not None and sorted(r.batch_id for r in rows) == list(range(10))


def test_a_failed_compaction_loses_no_row_and_is_tried_again_an_interval_later(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "checkpoints"
    s = store(path)
    s.ensure()
    real = s._upkeep  # noqa: SLF001
    calls: list[bool] = []

    def on_a_table_that_is_not_there(uri: str, options: dict[str, str], *, vacuum: bool) -> None:
        calls.append(vacuum)
        real(str(tmp_path / "missing"), options, vacuum=vacuum)  # delta-rs refuses: no table there

    s._upkeep = on_a_table_that_is_not_there  # type: ignore[method-assign]  # noqa: SLF001
    for b in range(10):
        s.append(row(b), known_new=True)
    assert calls == [False, True], "tried at each interval, never once per append"
    assert "compaction failed (tried again after 5 more appends)" in caplog.text
    rows = read_rows(str(path), "p")
    assert rows is not None and sorted(r.batch_id for r in rows) == list(range(10))


def commit_files(path: Path) -> list[str]:
    return sorted(f.name for f in (path / "_delta_log").iterdir() if f.name.endswith(".json"))


def test_appends_leave_the_logs_clean_up_to_the_compaction(tmp_path: Path) -> None:
    """delta-rs's clean-up after a commit lists the whole log: the appends skip it, each compaction
    runs it, and a table whose clean-up is turned off by hand keeps every commit file."""
    path = tmp_path / "checkpoints"
    s = store(path, compact_every=6, vacuum_every=100)
    s.ensure()
    DeltaTable(str(path)).alter.set_table_properties({"delta.logRetentionDuration": "interval 1 seconds",
                                                      "delta.checkpointInterval": "2"})
    for b in range(4):
        s.append(row(b), known_new=True)
    time.sleep(1.5)
    s.append(row(4), known_new=True)  # a checkpoint, and commit files past their retention
    before = commit_files(path)
    assert before[0].startswith("00000000000000000000"), "the appends deleted no commit file"
    s.append(row(5), known_new=True)  # the compaction
    after = commit_files(path)
    assert after and not after[0].startswith("00000000000000000000"), "the compaction's clean-up deleted them"
    rows = read_rows(str(path), "p")
    assert rows is not None and sorted(r.batch_id for r in rows) == list(range(6))

    kept = tmp_path / "kept"
    k = store(kept, compact_every=3, vacuum_every=100)
    k.ensure()
    DeltaTable(str(kept)).alter.set_table_properties({"delta.logRetentionDuration": "interval 1 seconds",
                                                      "delta.checkpointInterval": "2",
                                                      "delta.enableExpiredLogCleanup": "false"})
    k.append(row(0), known_new=True)
    time.sleep(1.5)
    for b in range(1, 6):
        k.append(row(b), known_new=True)
    assert commit_files(kept)[0].startswith("00000000000000000000"), "clean-up off: every commit file stays"


def test_appends_load_the_table_once_and_read_only_the_commits_made_since(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading the table reads every commit file since its last checkpoint (on object storage one
    request each): the appender loads it once and brings it up to date before each append, also
    past another writer's commits and a compaction's, with every row written once."""
    import deltalake

    path = tmp_path / "checkpoints"
    s = store(path, compact_every=7, vacuum_every=100)
    s.ensure()
    loads: list[str] = []
    load = deltalake.DeltaTable.__init__

    def counted(self: deltalake.DeltaTable, uri: str, *args: Any, **kwargs: Any) -> None:
        loads.append(str(uri))
        load(self, uri, *args, **kwargs)

    monkeypatch.setattr(deltalake.DeltaTable, "__init__", counted)
    s.append(row(0), known_new=True)  # the first append looks at the table's protocol and loads it
    first = len(loads)
    for b in range(1, 6):
        s.append(row(b), known_new=True)
    assert len(loads) == first, "the appends after the first use the table they loaded"
    deltalake.write_deltalake(str(path), deltalake.DeltaTable(str(path)).to_pyarrow_table().slice(0, 0),
                              mode="append")  # another writer's commit: the kept table is behind it
    first = len(loads)
    for b in range(6, 12):
        s.append(row(b), known_new=True)  # the seventh append compacts (a load of its own)
    assert len(loads) == first + 1, f"only the compaction loaded the table again, not the appends: {loads}"
    rows = read_rows(str(path), "p")
    assert rows is not None and sorted(r.batch_id for r in rows) == list(range(12))
    assert DeltaTable(str(path)).version() == s._delta_rs_table.version(), "the kept table is at the newest version"  # noqa: SLF001


def test_an_append_that_fails_loads_the_table_afresh_for_the_next(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints"
    s = store(path)
    s.ensure()
    s.append(row(0), known_new=True)
    kept = s._delta_rs_table  # noqa: SLF001

    class Refusing:
        def update_incremental(self) -> None:
            raise OSError("the store refused the listing")

    s._delta_rs_table = Refusing()  # noqa: SLF001
    s.append(row(1), known_new=True)  # a listing that fails: the table is loaded afresh, the row written
    assert s._delta_rs_table is not kept and s._delta_rs_table.version() == DeltaTable(str(path)).version()  # noqa: SLF001
    rows = read_rows(str(path), "p")
    assert rows is not None and sorted(r.batch_id for r in rows) == [0, 1]
