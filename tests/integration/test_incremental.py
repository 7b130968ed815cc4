"""Incremental Sync on real Spark + Delta: an availableNow change-feed sweep through the stream's
MERGE path; a second sweep is a no-op, a replayed batch is skipped by its transaction id, and the
replica equals the source row for row."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.checkpoints.audit import InMemoryAuditLog
from lakemirror.checkpoints.state import FileStateStore
from lakemirror.daemon.context import ReplicateContext
from lakemirror.daemon.settings.replicate import CliOverrides, load_replicate_config
from lakemirror.errors import DestinationConflict
from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.clone import CLONE_VERSION_PROPERTY, DeltaCloner
from lakemirror.sinks.batch.incremental import IncrementalSweep
from lakemirror.sinks.batch.snapshot_copy import PIPELINE_PROPERTY, replica_properties, set_properties
from tests.integration.conftest import lose_commit_entry
from lakemirror.sources.catalog import LocalCatalog

pytestmark = pytest.mark.integration

SRC, DST = TableName("src", "s", "t"), TableName("dst", "s", "t")


def rows(spark: Any, loc: tables.TableLocation) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in tables.read(spark, loc).select("id", "v", "n").collect()), key=repr)


def version(spark: Any, loc: tables.TableLocation) -> int:
    return int(tables.delta_table(spark, loc).history(1).collect()[0]["version"])


def sweeper(spark: Any, root: Path) -> IncrementalSweep:
    return IncrementalSweep(spark, LocalCatalog(root / "lh"), FileStateStore(root / "cp" / "p1" / "incremental"),
                            str(root / "cp"), "p1")


def create_source(spark: Any, src: Any) -> None:
    spark.sql(f"CREATE TABLE {src.sql} (id INT NOT NULL, v STRING, n BIGINT) USING DELTA "
              f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")


def test_sweeps_apply_every_change_once_and_a_second_sweep_is_a_noop(spark: Any, tmp_path: Path) -> None:
    cat = LocalCatalog(tmp_path / "lh")
    src, rep = cat.locate(SRC), cat.locate(DST)
    create_source(spark, src)
    spark.sql(f"INSERT INTO {src.sql} SELECT id, concat('v', id), id FROM range(0, 50)")
    sweep = sweeper(spark, tmp_path)

    first = sweep.sweep(SRC, DST)                                   # bootstrap at the current version
    assert (first.action, first.rows_read) == ("bootstrap", 0)
    assert rows(spark, rep) == rows(spark, src)

    spark.sql(f"INSERT INTO {src.sql} VALUES (100, 'new', 1), (101, 'new', 2)")          # insert
    spark.sql(f"UPDATE {src.sql} SET v = 'upd', n = n + 1000 WHERE id < 5")               # update
    spark.sql(f"DELETE FROM {src.sql} WHERE id >= 40")                                   # delete
    spark.sql(f"INSERT INTO {src.sql} VALUES (45, 'back', 45)")                           # re-insert
    spark.sql(f"UPDATE {src.sql} SET v = 'twice' WHERE id = 1")                           # same key again
    spark.sql(f"DELETE FROM {src.sql} WHERE id = 100")                                   # insert then delete
    second = sweep.sweep(SRC, DST)
    assert second.action == "stream" and second.batches >= 1 and second.batches_replayed == 0
    assert rows(spark, rep) == rows(spark, src)
    assert second.mirrored_version == version(spark, src)
    assert replica_properties(spark, rep)[CLONE_VERSION_PROPERTY] == str(version(spark, src))
    txns = [r["userMetadata"] for r in tables.delta_table(spark, rep).history().collect() if r["userMetadata"]]
    assert txns and all(json.loads(t)["lakemirror_txn"].startswith("lakemirror-incremental/p1/") for t in txns)

    before = version(spark, rep)
    third = sweep.sweep(SRC, DST)                                   # nothing new: nothing written
    assert (third.action, third.rows_read, third.rows_inserted + third.rows_updated + third.rows_deleted) == \
        ("stream", 0, 0)
    assert version(spark, rep) == before and rows(spark, rep) == rows(spark, src)

    # A sweep that crashed after its MERGE but before Spark's commit log replays that batch: Delta
    # skips it by its transaction id, so nothing is applied twice.
    spark.sql(f"UPDATE {src.sql} SET n = -n WHERE id BETWEEN 10 AND 14")
    fourth = sweep.sweep(SRC, DST)
    assert fourth.batches == 1 and fourth.batches_replayed == 0
    commits = sorted((tmp_path / "cp" / "p1" / "incremental" / DST.slug / f"e{fourth.epoch}" / "commits").iterdir(),
                     key=lambda p: int(p.name) if p.name.isdigit() else -1)
    lose_commit_entry(commits[-1].parent, commits[-1].name)
    merged = version(spark, rep)
    replay = sweep.sweep(SRC, DST)
    assert replay.batches == 1 and replay.batches_replayed == 1
    assert version(spark, rep) == merged and rows(spark, rep) == rows(spark, src)


def test_a_cloned_replica_is_adopted_without_a_copy_and_replicate_runs_the_operation(spark: Any, tmp_path: Path) -> None:
    cat = LocalCatalog(tmp_path / "lh")
    src, rep = cat.locate(SRC), cat.locate(DST)
    create_source(spark, src)
    spark.sql(f"INSERT INTO {src.sql} SELECT id, 'a', id FROM range(0, 20)")
    DeltaCloner(spark).clone(src, rep, keys=["id"])
    cloned_at = version(spark, rep)
    spark.sql(f"UPDATE {src.sql} SET v = 'b' WHERE id < 3")
    spark.sql(f"DELETE FROM {src.sql} WHERE id = 19")

    config = load_replicate_config(None, CliOverrides(operations=["incremental", "reconcile"]), data={
        "checkpoint_volume": str(tmp_path / "cp"), "runtime": {"mode": "local", "warehouse": str(tmp_path / "lh")},
        "catalogs": [{"name": "src", "target_catalog": "dst", "include_schemas": ["s"]}]})
    audit = InMemoryAuditLog()
    summary = ReplicateContext(config).replace(spark=spark, audit=audit, execution_user="tester",
                                               sleep=lambda s: None).run()
    assert summary.ok, summary.failed
    inc = [r for r in audit.records if json.loads(r.details or "{}")["operation"] == "incremental"]
    assert len(inc) == 1 and inc[0].operation_type == "replication" and inc[0].status == "success"
    details = json.loads(inc[0].details or "{}")
    assert details["action"] == "adopt" and details["start_version"] == 1 and details["rows_deleted"] == 1
    assert version(spark, rep) > cloned_at and rows(spark, rep) == rows(spark, src)
    assert (tmp_path / "cp" / "replicate" / "incremental" / DST.slug).is_dir()


def test_a_replica_of_a_continuous_pipeline_is_refused(spark: Any, tmp_path: Path) -> None:
    cat = LocalCatalog(tmp_path / "lh")
    src, rep = cat.locate(SRC), cat.locate(DST)
    create_source(spark, src)
    spark.sql(f"CREATE TABLE {rep.sql} (id INT NOT NULL, v STRING, n BIGINT) USING DELTA")
    set_properties(spark, rep, {PIPELINE_PROPERTY: "live"})
    with pytest.raises(DestinationConflict, match="continuously by pipeline 'live'"):
        sweeper(spark, tmp_path).sweep(SRC, DST)
    shutil.rmtree(tmp_path / "lh" / "dst")


def test_the_daemon_runs_a_scheduled_sweep_and_reconcile_with_audit_rows(make_pipeline: Any) -> None:
    p = make_pipeline(tables=["orders"], schedules=[
        {"name": "archive-sweep", "operations": ["incremental", "reconcile"], "every_seconds": 60,
         "tables": ["archive"], "reconcile": {"buckets": 16}}])
    p.create("archive", "id INT NOT NULL, v STRING", key="id")
    p.sql("archive", "INSERT INTO {t} SELECT id, concat('v', id) FROM range(0, 30)")
    now = [1000.0]

    def inline(target: Any, name: str) -> Any:
        target()
        return type("Done", (), {"join": lambda self, t=None: None, "is_alive": lambda self: False})()

    app = p.app
    service = app.replace(clock=lambda: now[0], spawn=inline).subtasks
    now[0] += 60
    service.tick()                                                     # bootstrap + reconcile
    p.sql("archive", "UPDATE {t} SET v = 'x' WHERE id < 3")
    p.sql("archive", "DELETE FROM {t} WHERE id >= 25")
    now[0] += 60
    service.tick()                                                     # sweep + reconcile
    views = {v.task: v for v in service.views()}  # the schedule, beside the replicas' own maintenance
    view = views["archive-sweep"]
    assert (view.runs, view.last_outcome, view.last_error) == (2, "success", None)
    p.assert_replica_equals_source("archive")
    audit = tables.read(p.spark, app.catalog.locate(TableName("dst", "continuous_sync", "audit_log"))).collect()
    ops = sorted((json.loads(r["details"])["operation"], r["status"], r["object_name"]) for r in audit)
    assert ops == [("incremental", "success", "archive")] * 2 + [("reconcile", "success", "archive")] * 2
    assert len({r["run_id"] for r in audit}) == 2
    labels = {"pipeline": "test", "task": "archive-sweep"}
    registry = app.metrics.registry
    assert registry.get_sample_value("lakemirror_subtask_runs_total", {**labels, "status": "success"}) == 2
    assert registry.get_sample_value("lakemirror_reconcile_mismatched_keys",
                                     {"pipeline": "test", "table": "archive", "kind": "different"}) == 0


class AlterAfterDescribing(LocalCatalog):
    """A catalog that runs ``alter`` once, right after it describes the source: a commit that lands
    between a sweep's description and the frames it reads."""

    def __init__(self, root: Path, alter: Any) -> None:
        super().__init__(root)
        self.alter = alter
        self.descriptions = 0

    def describe(self, spark: Any, name: Any) -> Any:
        info = super().describe(spark, name)
        self.descriptions += 1
        if self.descriptions == 1:
            self.alter()
        return info


@pytest.mark.parametrize("swept_before", [True, False], ids=["stream", "bootstrap"])
def test_a_column_added_while_a_sweep_is_planned_reaches_the_replica_with_its_values(
        spark: Any, tmp_path: Path, swept_before: bool) -> None:
    """A sweep plans its MERGE from a description of the source, then reads a snapshot or a change
    stream, each with the schema of its own moment. A column added in between would be read and
    written by no plan, its values lost; the sweep plans again with it."""
    cat = LocalCatalog(tmp_path / "lh")
    src, rep = cat.locate(SRC), cat.locate(DST)
    create_source(spark, src)
    spark.sql(f"INSERT INTO {src.sql} VALUES (1, 'a', 1), (2, 'b', 2)")
    states = FileStateStore(tmp_path / "cp" / "p1" / "incremental")
    if swept_before:
        IncrementalSweep(spark, cat, states, str(tmp_path / "cp"), "p1").sweep(SRC, DST)

    def alter() -> None:
        spark.sql(f"ALTER TABLE {src.sql} ADD COLUMNS (note STRING)")
        spark.sql(f"INSERT INTO {src.sql} VALUES (3, 'c', 3, 'added while the sweep was planned')")
        spark.sql(f"UPDATE {src.sql} SET note = 'filled' WHERE id = 1")

    altering = AlterAfterDescribing(tmp_path / "lh", alter)
    IncrementalSweep(spark, altering, states, str(tmp_path / "cp"), "p1").sweep(SRC, DST)
    every = ("id", "v", "n", "note")
    assert sorted(map(tuple, tables.read(spark, rep).select(*every).collect()), key=repr) == \
        sorted(map(tuple, tables.read(spark, src).select(*every).collect()), key=repr)
    assert altering.descriptions == 2, "planned again once"
