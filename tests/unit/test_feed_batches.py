"""Batches planned from the commit files and applied on the driver, without Spark: a source and a
replica written by delta-rs in a temp folder, the real sink, batch apply and stream log, the
in-memory checkpoint store."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lakemirror.checkpoints.records import CheckpointRow, InMemoryCheckpointStore
from lakemirror.checkpoints.round_rows import RoundRows
from lakemirror.checkpoints.state import TableProgress
from lakemirror.checkpoints.stream_log import StreamLog
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sinks.merge.apply_choice import DRIVER, ApplyChoice
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.merge.planner import plan_merge
from lakemirror.sinks.txn import txn_app_id
from lakemirror.supervisor.change_feed.batch_apply import BatchApply, RowWriter
from lakemirror.supervisor.change_feed.commit_file_batches import FeedBatches
from lakemirror.supervisor.change_feed.shared_state import TableLive
from lakemirror.tables import TableLocation

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
CDF = {"delta.enableChangeDataFeed": "true"}
APP = txn_app_id("p", "src__s__t", 1)
META = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {"spark.sql.shuffle.partitions": "2"}}


class Crash(Exception):
    pass


def offset(table_id: str, version: int) -> str:
    return json.dumps({"sourceVersion": 1, "reservoirId": table_id, "reservoirVersion": version, "index": -1,
                       "isStartingVersion": False})


def batch_rows(t: "Table") -> list[Any]:
    """The checkpoint rows of batches (a failure records a row with its error, as a crash would not)."""
    return [r for r in t.store.rows if r.error is None]


def rows(path: Path) -> list[tuple[Any, ...]]:
    data = DeltaTable(str(path)).to_pyarrow_table(columns=["id", "v"]).to_pylist()
    return sorted((r["id"], r["v"]) for r in data)


class Table:
    """A source bootstrapped at version 0, Spark's batch 0 (version 1) applied and logged, and the
    parts of a launch that plan the next batches from the commit files."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.source, self.replica, self.checkpoint = tmp / "src", tmp / "dst", tmp / "ck"
        write_deltalake(str(self.source), pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=SCHEMA),
                        configuration=CDF)                                        # version 0: the snapshot
        write_deltalake(str(self.replica), pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}, schema=SCHEMA))
        write_deltalake(str(self.source), pa.table({"id": [3], "v": ["c"]}, schema=SCHEMA), mode="append")
        self.table_id = DeltaTable(str(self.source)).metadata().id
        (self.checkpoint / "offsets").mkdir(parents=True)
        (self.checkpoint / "offsets" / "0").write_text("v1\n" + json.dumps(META) + "\n" + offset(self.table_id, 2))
        StreamLog(self.checkpoint).write_commit(0)                                 # Spark's batch 0: version 1
        self.store = InMemoryCheckpointStore()
        self.points: list[str] = []
        self.crash_at: str | None = None

    def fault(self, point: str) -> None:
        self.points.append(point)
        if point == self.crash_at:
            self.crash_at = None
            raise Crash(point)

    def launch(self, window: int = 32, rows: RoundRows | None = None) -> FeedBatches:
        plan = plan_merge((Column("id", "bigint", False), Column("v", "string")), ["id"])
        target = TableLocation(TableName("dst", "s", "t"), str(self.replica))
        sink = DeltaMergeSink(target, plan, stable_source=True, replica_rows=3, fault=self.fault,
                              choice=ApplyChoice(DRIVER, "applies on the driver", 10.0, 1 << 30, 1 << 20))
        live = TableLive("t", applied_through=1)
        progress = TableProgress(epoch=1, bootstrap_version=0, bootstrapped=True, source_table_id=self.table_id)
        apply = BatchApply(live, lambda batch: self.table_id, RowWriter("p", "src.s.t", "dst.s.t", self.store, lambda: 0.0),
                           load_progress=lambda: progress, lag_seconds=lambda: None, clock=lambda: 0.0,
                           sleep=lambda s: None, fault=self.fault)
        return FeedBatches(label="src.s.t", checkpoint=str(self.checkpoint), source=(str(self.source), {}), sink=sink,
                           apply_batch=apply, app_id=APP, epoch=1, after_version=0, source_table_id=self.table_id,
                           live=live, read_range=lambda versions: pytest.fail("no Spark read expected"), window=window,
                           rows=rows)

    def change(self) -> None:
        """Versions 2-4: an update, a delete, a re-insert."""
        source = DeltaTable(str(self.source))
        source.update(updates={"v": "'B'"}, predicate="id = 2")
        DeltaTable(str(self.source)).delete("id = 1")
        write_deltalake(str(self.source), pa.table({"id": [1], "v": ["again"]}, schema=SCHEMA), mode="append")


def test_the_versions_since_the_last_batch_are_applied_as_one_batch_and_logged_as_sparks(tmp_path: Path) -> None:
    t = Table(tmp_path)
    feed = t.launch()
    assert feed.take() is None and feed.counts.from_commit_files == 0, "nothing new: no batch"
    t.change()
    assert feed.take() is None
    assert rows(t.replica) == rows(t.source) == [(1, "again"), (2, "B"), (3, "c")]
    assert feed.counts.from_commit_files == 1 and feed.live.applied_through == 4
    log = StreamLog(t.checkpoint)
    assert (log.latest_offsets(), log.latest_commit()) == (1, 1)
    assert json.loads(log.source_offset(1) or "") == {"sourceVersion": 1, "reservoirId": t.table_id,
                                                       "reservoirVersion": 5, "index": -1, "isStartingVersion": False}
    assert log.batch_metadata(1)["conf"] == META["conf"]  # type: ignore[index]
    assert DeltaTable(str(t.replica)).transaction_version(APP) == 1
    [row] = t.store.rows
    assert (row.batch_id, row.txn_app_id, row.first_version, row.last_version) == (1, APP, 2, 4)
    assert (row.rows_inserted, row.rows_updated, row.rows_deleted) == (0, 2, 0), "id 1 and id 2 updated"
    assert t.points == ["before_merge", "after_driver_commit", "after_merge", "before_commit_log"]


def test_a_crash_after_the_driver_commit_is_rerun_from_its_logged_offsets_and_skipped(tmp_path: Path) -> None:
    t = Table(tmp_path)
    t.change()
    t.crash_at = "after_driver_commit"
    with pytest.raises(Crash):
        t.launch().take()
    log = StreamLog(t.checkpoint)
    assert (log.latest_offsets(), log.latest_commit()) == (1, 0), "logged, not committed"
    assert rows(t.replica) == rows(t.source) and not batch_rows(t)
    write_deltalake(str(t.source), pa.table({"id": [9], "v": ["later"]}, schema=SCHEMA), mode="append")  # version 5
    feed = t.launch()                     # the next run: batch 1 again, with its own range (2-4), not 2-5
    assert feed.take() is None
    [row] = batch_rows(t)
    assert (row.batch_id, row.first_version, row.last_version) == (1, 2, 4)
    history = DeltaTable(str(t.replica)).history()
    assert [h.get("userMetadata") for h in history].count(json.dumps({"batch": 1, "lakemirror_txn": APP})) == 1
    assert feed.take() is None            # then version 5, as batch 2
    assert rows(t.replica) == rows(t.source) and [r.batch_id for r in batch_rows(t)] == [1, 2]


def test_a_schema_change_or_a_backlog_is_left_to_spark_with_nothing_logged(tmp_path: Path) -> None:
    t = Table(tmp_path)
    feed = t.launch()
    wider = pa.schema([*SCHEMA, pa.field("extra", pa.string())])
    write_deltalake(str(t.source), pa.table({"id": [4], "v": ["d"], "extra": ["x"]}, schema=wider), mode="append",
                    schema_mode="merge")
    assert "changes the table's metadata or protocol" in (feed.take() or "")
    assert StreamLog(t.checkpoint).latest_offsets() == 0 and not t.store.rows
    t2 = Table(tmp_path / "backlog")
    for i in range(3):
        write_deltalake(str(t2.source), pa.table({"id": [100 + i], "v": ["x"]}, schema=SCHEMA), mode="append")
    feed2 = t2.launch(window=2)
    assert "3 versions to apply, more than 2" in (feed2.take() or "")
    assert feed2.counts.by_spark == 1 and feed2.counts.last_spark_reason is not None


def test_a_source_recreated_under_its_location_is_refused(tmp_path: Path) -> None:
    t = Table(tmp_path)
    feed = t.launch()
    t.change()
    assert feed.take() is None
    import shutil

    shutil.rmtree(t.source)
    for i in range(7):  # a new table, past the old one's versions
        write_deltalake(str(t.source), pa.table({"id": [i], "v": ["new"]}, schema=SCHEMA), mode="append",
                        configuration=CDF)
    reason = feed.take()
    assert reason is not None and "table id is now" in reason, reason
    assert rows(t.replica) == [(1, "again"), (2, "B"), (3, "c")], "nothing of the new table applied"


def test_the_applied_version_moves_once_the_replica_commits_before_the_checkpoint_row(tmp_path: Path) -> None:
    """The lag is priced from the applied version: a replica that holds a batch is not shown a batch
    behind while its checkpoint row is written (a commit of its own on an object store)."""
    t = Table(tmp_path)
    t.change()
    feed = t.launch()
    seen: dict[str, int | None] = {}
    append = t.store.append

    def append_seeing_the_live_version(row: Any, spark: Any = None, *, known_new: bool = False) -> None:
        seen["while the row is written"] = feed.live.applied_through
        append(row, spark, known_new=known_new)

    t.store.append = append_seeing_the_live_version  # type: ignore[method-assign]
    assert feed.take() is None
    assert seen == {"while the row is written": 4} and feed.live.applied_through == 4


def test_the_replicas_checkpoint_due_at_the_batchs_version_is_written_once_the_batch_counts_as_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch's commit (the replica's version 1) is due a checkpoint: it is written after the
    applied version moved and the row was handed on, not inside the commit that lag waits for."""
    t = Table(tmp_path)
    DeltaTable(str(t.replica)).alter.set_table_properties({"delta.checkpointInterval": "2"})  # version 1 of the replica
    t.change()
    feed = t.launch()
    seen: list[tuple[int | None, int]] = []
    create_checkpoint = DeltaTable.create_checkpoint

    def checkpoint_seeing_the_live_version(table: DeltaTable) -> None:
        seen.append((feed.live.applied_through, len(t.store.rows)))
        create_checkpoint(table)

    monkeypatch.setattr(DeltaTable, "create_checkpoint", checkpoint_seeing_the_live_version)
    assert feed.take() is None
    assert seen == [(4, 1)], "the checkpoint came after the batch counted as applied and its row"
    assert (t.replica / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()


class HeldAppends(InMemoryCheckpointStore):
    """A checkpoint store whose row writer's appends wait until let go, or fail."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.refuse: Exception | None = None

    def append_rows(self, rows: list[CheckpointRow]) -> None:
        assert self.go.wait(30), "the test did not let the append go"
        if self.refuse is not None:
            raise self.refuse
        super().append_rows(rows)


def writer_launch(tmp_path: Path) -> tuple[Table, HeldAppends, RoundRows]:
    t = Table(tmp_path)
    store = t.store = HeldAppends()
    return t, store, RoundRows(store, fault=t.fault, linger_seconds=0.0)


def test_a_batch_row_is_appended_off_the_worker_and_its_commit_logged_only_once_the_row_is_durable(
        tmp_path: Path) -> None:
    t, store, writer = writer_launch(tmp_path)
    feed = t.launch(rows=writer)
    t.change()
    assert feed.take() is None, "the turn ends once the replica holds the batch"
    log = StreamLog(t.checkpoint)
    assert rows(t.replica) == rows(t.source) and feed.live.applied_through == 4
    assert not feed.settled and not store.rows
    assert (log.latest_offsets(), log.latest_commit()) == (1, 0), "no commit before the row is durable"
    store.go.set()
    assert feed.wait_settled(30) and writer.flush(30)
    assert log.latest_commit() == 1
    [row] = batch_rows(t)
    assert (row.batch_id, row.first_version, row.last_version) == (1, 2, 4)
    assert t.points == ["before_merge", "after_driver_commit", "after_merge", "before_commit_log"]
    assert writer.round_sizes == [1]
    write_deltalake(str(t.source), pa.table({"id": [9], "v": ["later"]}, schema=SCHEMA), mode="append")
    assert feed.take() is None and feed.wait_settled(30)
    assert rows(t.replica) == rows(t.source) and [r.batch_id for r in batch_rows(t)] == [1, 2]


def test_the_next_turn_of_a_table_waits_for_its_last_batchs_row(tmp_path: Path) -> None:
    t, store, writer = writer_launch(tmp_path)
    feed = t.launch(rows=writer)
    t.change()
    assert feed.take() is None
    write_deltalake(str(t.source), pa.table({"id": [9], "v": ["later"]}, schema=SCHEMA), mode="append")
    second = threading.Thread(target=feed.take)
    second.start()
    second.join(0.5)
    assert second.is_alive(), "batch 2 is not planned while batch 1 is not in the query's log"
    assert StreamLog(t.checkpoint).latest_offsets() == 1
    store.go.set()
    second.join(30)
    assert feed.wait_settled(30) and [r.batch_id for r in batch_rows(t)] == [1, 2]
    assert rows(t.replica) == rows(t.source)


@pytest.mark.parametrize("failure", ["append refused", "killed before the commit log"])
def test_a_row_not_written_fails_the_table_at_its_next_turn_and_the_relaunch_records_the_batch_once(
        tmp_path: Path, failure: str) -> None:
    t, store, writer = writer_launch(tmp_path)
    feed = t.launch(rows=writer)
    t.change()
    if failure == "append refused":
        store.refuse = OSError("the checkpoint table refused the append")
    else:
        t.crash_at = "before_commit_log"  # the row is durable, the commit log not written
    store.go.set()
    assert feed.take() is None and feed.wait_settled(30)
    with pytest.raises((OSError, Crash)):
        feed.take()
    assert feed.settled, "the failure is reported once"
    [degraded] = [r for r in t.store.rows if r.error is not None]
    assert degraded.batch_id == 1 and degraded.degraded
    assert StreamLog(t.checkpoint).latest_commit() == 0, "the batch is replayed by the relaunch"
    store.refuse = None
    relaunched = t.launch(rows=writer)
    assert relaunched.take() is None and relaunched.wait_settled(30)
    [row] = batch_rows(t)
    assert (row.batch_id, row.first_version, row.last_version) == (1, 2, 4)
    history = DeltaTable(str(t.replica)).history()
    assert [h.get("userMetadata") for h in history].count(json.dumps({"batch": 1, "lakemirror_txn": APP})) == 1
    assert StreamLog(t.checkpoint).latest_commit() == 1 and rows(t.replica) == rows(t.source)
