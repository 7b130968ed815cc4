"""A replica's delta-rs commits list its whole log for expired commit files on one commit in
LOG_CLEANUP_EVERY, not on each batch; a batch's commit runs no hook itself, and what it leaves due
(a checkpoint, the clean-up) runs once the batch is reported (delta-rs on the driver's disk, no Spark)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from lakemirror.delta_log.commit_hooks import LOG_CLEANUP_EVERY, cleans_log, post_commit_hooks, upkeep_due
from lakemirror.schema import Column
from lakemirror.sinks.accelerator.driver_apply import DriverApply
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.merge.planner import plan_merge
from lakemirror.sinks.txn import MergeOutcome, TxnId, run_upkeep

CHANGES = pa.schema([("id", pa.int64()), ("v", pa.string()), ("_change_type", pa.string()),
                     ("_commit_version", pa.int64()), ("_commit_timestamp", pa.timestamp("us", tz="UTC"))])


def upsert(key: int, value: str, version: int) -> pa.Table:
    return pa.table({"id": [key], "v": [value], "_change_type": ["update_postimage"], "_commit_version": [version],
                     "_commit_timestamp": [datetime.fromtimestamp(version, timezone.utc)]}, schema=CHANGES)


def commit_files(path: Path) -> list[str]:
    return sorted(f.name for f in (path / "_delta_log").iterdir() if f.name.endswith(".json"))


def test_one_commit_in_every_hundred_versions_cleans_the_log_as_the_table_says() -> None:
    assert [v for v in range(1, 301) if cleans_log(v)] == [100, 200, 300]
    assert post_commit_hooks(LOG_CLEANUP_EVERY).cleanup_expired_logs is None, "the table's own setting decides"
    assert post_commit_hooks(LOG_CLEANUP_EVERY + 1).cleanup_expired_logs is False


def test_batches_delete_expired_commit_files_only_at_a_hundredth_version(tmp_path: Path) -> None:
    replica = tmp_path / "replica"
    write_deltalake(str(replica), pa.table({"id": pa.array([1], pa.int64()), "v": ["a"]}),
                    configuration={"delta.logRetentionDuration": "interval 1 seconds",
                                   "delta.checkpointInterval": "5"})
    apply = DriverApply(str(replica), plan_merge((Column("id", "bigint", False), Column("v", "string")), ["id"]),
                        max_rows=100)

    def batch(n: int) -> None:
        outcome = apply.apply_changes(upsert(n % 3, f"v{n}", n), TxnId("app", n), lambda: ApplyCounts())
        assert outcome is not None and not outcome.replayed
        run_upkeep(outcome)

    for n in range(1, 10):
        batch(n)
    time.sleep(1.5)  # versions 0-9 are past the log's retention, before the checkpoint of version 10
    while DeltaTable(str(replica)).version() < LOG_CLEANUP_EVERY - 1:
        batch(DeltaTable(str(replica)).version() + 1)
    assert commit_files(replica)[0] == f"{0:020d}.json", "no batch's commit listed the log to clean it"
    batch(LOG_CLEANUP_EVERY)
    assert commit_files(replica)[0] > f"{9:020d}.json", "version 100's commit deleted the expired ones"
    assert {r["id"]: r["v"] for r in DeltaTable(str(replica)).to_pyarrow_table().to_pylist()} == \
        {1: "v100", 2: "v98", 0: "v99"}


def test_the_deletion_vector_paths_checkpoints_clean_the_log_once_a_hundred_versions(tmp_path: Path) -> None:
    from deltalake import PostCommitHookProperties

    from lakemirror.delta_log.local_log import checkpoint_if_due

    table = tmp_path / "replica"
    quiet = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
    write_deltalake(str(table), pa.table({"id": [0]}), configuration={"delta.logRetentionDuration": "interval 1 seconds"},
                    post_commithook_properties=quiet)
    for _ in range(19):
        write_deltalake(str(table), pa.table({"id": [1]}), mode="append", post_commithook_properties=quiet)
    time.sleep(1.5)
    config = {"delta.checkpointInterval": "7"}
    checkpoint_if_due(table, 14, config)  # a checkpoint, no clean-up: no hundredth version in 8-14
    assert commit_files(table)[0] == f"{0:020d}.json"
    checkpoint_if_due(table, 105, {**config, "delta.enableExpiredLogCleanup": "false"})  # due, but turned off
    assert commit_files(table)[0] == f"{0:020d}.json"
    checkpoint_if_due(table, 105, config)  # 100 is in 99-105
    assert commit_files(table)[0] > f"{0:020d}.json"


def test_the_upkeep_due_after_a_version_follows_the_tables_interval_and_the_cleanup_cadence() -> None:
    every_ten = {"delta.checkpointInterval": "10"}
    assert [v for v in range(0, 101) if upkeep_due(v, every_ten)[0]] == list(range(10, 101, 10))
    assert [v for v in range(0, 301) if upkeep_due(v, {})[0]] == [100, 200, 300], "delta-rs's own interval"
    assert [v for v in range(0, 301) if upkeep_due(v, every_ten)[1]] == [100, 200, 300]
    assert upkeep_due(100, {**every_ten, "delta.enableExpiredLogCleanup": "false"}) == (True, False)
    assert upkeep_due(7, {"delta.checkpointInterval": "x"}) == (False, False)


def checkpointed(path: Path, version: int) -> bool:
    return (path / "_delta_log" / f"{version:020d}.checkpoint.parquet").exists()


def every_other_version(tmp_path: Path) -> tuple[Path, DriverApply]:
    replica = tmp_path / "replica"
    write_deltalake(str(replica), pa.table({"id": pa.array([1], pa.int64()), "v": ["a"]}),
                    configuration={"delta.checkpointInterval": "2"})
    plan = plan_merge((Column("id", "bigint", False), Column("v", "string")), ["id"])
    return replica, DriverApply(str(replica), plan, max_rows=100)


def apply_batch(apply: DriverApply, n: int) -> MergeOutcome:
    outcome = apply.apply_changes(upsert(n, f"v{n}", n), TxnId("app", n), lambda: ApplyCounts())
    assert outcome is not None and not outcome.replayed
    return outcome


def test_a_batch_commit_returns_before_the_checkpoint_its_version_is_due_and_the_upkeep_writes_it(
        tmp_path: Path) -> None:
    replica, apply = every_other_version(tmp_path)
    outcome = apply_batch(apply, 1)  # version 1: nothing due
    assert outcome.upkeep is not None
    run_upkeep(outcome)
    outcome = apply_batch(apply, 2)  # version 2: a checkpoint is due
    assert DeltaTable(str(replica)).version() == 2 and not checkpointed(replica, 2), \
        "the batch's commit did not wait for its checkpoint"
    run_upkeep(outcome)
    assert checkpointed(replica, 2)
    run_upkeep(outcome)  # once only: a second call finds nothing due
    assert {r["id"]: r["v"] for r in DeltaTable(str(replica)).to_pyarrow_table().to_pylist()} == \
        {1: "v1", 2: "v2"}


def test_an_upkeep_its_caller_did_not_run_is_run_by_the_next_batch(tmp_path: Path) -> None:
    replica, apply = every_other_version(tmp_path)
    apply_batch(apply, 1)
    apply_batch(apply, 2)
    assert not checkpointed(replica, 2)
    run_upkeep(apply_batch(apply, 3))
    assert checkpointed(replica, 2) and not checkpointed(replica, 3)


def test_a_failed_checkpoint_is_logged_and_the_batch_stands(tmp_path: Path, caplog: "pytest.LogCaptureFixture") -> None:
    replica, apply = every_other_version(tmp_path)
    run_upkeep(apply_batch(apply, 1))
    outcome = apply_batch(apply, 2)

    def refuse() -> None:
        raise OSError("the store refused the checkpoint")

    apply._table.create_checkpoint = refuse  # the handle the upkeep checkpoints through
    with caplog.at_level(logging.WARNING):
        run_upkeep(outcome)
    assert "the store refused the checkpoint" in caplog.text and "version 2" in caplog.text
    assert not checkpointed(replica, 2) and DeltaTable(str(replica)).transaction_version("app") == 2
    run_upkeep(apply_batch(apply, 3))
    assert DeltaTable(str(replica)).version() == 3
