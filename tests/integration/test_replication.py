"""Replica equals source, row for row, through the real stream: CDF -> foreachBatch -> MERGE."""

from __future__ import annotations

import pytest

from lakemirror.identifiers import TableName

pytestmark = pytest.mark.integration


#: Small local replicas take batches by a delta-rs MERGE on the driver by default; without it they
#: are rewritten whole by Spark; rewrite_below_bytes 0 makes every batch a Spark MERGE.
_PATH_SETTINGS = {"driver": {}, "rewrite": {"driver_apply": False}, "merge": {"rewrite_below_bytes": 0}}


def apply_paths(*slow: str) -> pytest.MarkDecorator:
    """Every apply path as a row of ``apply_settings``; the paths named in ``slow`` in the slow tier."""
    return pytest.mark.parametrize("apply_settings", [
        pytest.param(settings, id=path, marks=[pytest.mark.slow] if path in slow else [])
        for path, settings in _PATH_SETTINGS.items()])
#: The replica commits each path makes (operation, engine), after the bootstrap's.
PATH_COMMITS = {"driver": {"MERGE by delta-rs"}, "rewrite": {"WRITE by Spark"}, "merge": {"MERGE by Spark"}}


def _path(apply_settings: dict) -> str:
    return "merge" if apply_settings.get("rewrite_below_bytes") == 0 else \
        "rewrite" if apply_settings.get("driver_apply") is False else "driver"


def _replica_operations(pipeline, table: str) -> set[str]:
    from lakemirror import tables

    history = tables.delta_table(pipeline.spark, pipeline.replica(table)).history()
    return {f"{r['operation']} by {'delta-rs' if str(r['engineInfo']).startswith('delta-rs') else 'Spark'}"
            for r in history.where("version > 1").select("operation", "engineInfo").collect()}


#: Spark's two paths in the slow tier: in the default tier they take the composite-key scenario below
#: (every kind of change, several versions in one batch, the same commit and metric checks).
@apply_paths("rewrite", "merge")
def test_inserts_updates_deletes_reach_the_replica(make_pipeline, apply_settings):
    pipeline = make_pipeline(**apply_settings)
    pipeline.create("orders", "id BIGINT NOT NULL, status STRING, amount DOUBLE")
    pipeline.sql("orders", "INSERT INTO {t} SELECT id, 'new', id * 1.5 FROM range(0, 50)")
    pipeline.start()
    pipeline.wait_caught_up("orders")
    pipeline.assert_replica_equals_source("orders")

    pipeline.sql("orders", "INSERT INTO {t} SELECT id, 'new', id * 1.5 FROM range(50, 80)")
    pipeline.sql("orders", "UPDATE {t} SET status = 'paid', amount = amount + 1 WHERE id % 3 = 0")
    pipeline.sql("orders", "DELETE FROM {t} WHERE id % 5 = 0")
    pipeline.wait_caught_up("orders")
    pipeline.assert_replica_equals_source("orders")
    view = pipeline.views()["orders"]
    assert view.state == "running" and view.last_error is None
    assert _replica_operations(pipeline, "orders") == PATH_COMMITS[_path(apply_settings)]
    feed = pipeline.runner("orders").batch_feed
    if _path(apply_settings) == "driver":
        assert feed is not None and feed.read_by_delta_rs >= 1, "whole-version batches are read by delta-rs"
    _assert_batch_paths(pipeline, apply_settings)


def _assert_batch_paths(pipeline, apply_settings: dict) -> None:
    """The batches were read and written by the engines of the path (the batch-path metric)."""
    paths = {(s.labels["read"], s.labels["write"]) for m in pipeline.app.metrics.registry.collect()
             if m.name == "lakemirror_batch_paths" for s in m.samples if s.name.endswith("_total") and s.value > 0}
    assert paths == {"driver": {("delta-rs", "delta-rs-merge")}, "rewrite": {("spark", "spark-rewrite")},
                     "merge": {("spark", "spark-merge")}}[_path(apply_settings)], paths


@apply_paths()
def test_composite_keys_nulls_and_reinsert_within_one_batch(make_pipeline, apply_settings):
    pipeline = make_pipeline(**apply_settings)
    pipeline.create("items", "order_id BIGINT NOT NULL, line INT NOT NULL, sku STRING, qty INT",
                    key="order_id,line")
    pipeline.sql("items", "INSERT INTO {t} VALUES (1, 1, 'a', 1), (1, 2, NULL, 2), (2, 1, 'c', NULL)")
    pipeline.start()
    pipeline.wait_caught_up("items")
    pipeline.stop()  # the next changes pile up: several versions, one batch on restart

    pipeline.sql("items", "DELETE FROM {t} WHERE order_id = 1 AND line = 1")
    pipeline.sql("items", "INSERT INTO {t} VALUES (1, 1, 'a-again', 7)")             # re-insert
    pipeline.sql("items", "UPDATE {t} SET sku = NULL, qty = qty + 1 WHERE order_id = 1 AND line = 2")
    pipeline.sql("items", "INSERT INTO {t} VALUES (2, 2, NULL, NULL)")
    pipeline.sql("items", "DELETE FROM {t} WHERE order_id = 2 AND line = 1")
    pipeline.sql("items", "INSERT INTO {t} VALUES (2, 1, 'c2', 3)")                   # re-insert
    pipeline.sql("items", "UPDATE {t} SET qty = 100 WHERE order_id = 2 AND line = 1")
    pipeline.restart()
    pipeline.wait_caught_up("items")
    pipeline.assert_replica_equals_source("items")

    rows = pipeline.app.checkpoints.latest("test")
    row = rows["src.sales.items"]
    assert row.last_version - row.first_version >= 6, "all pending versions arrived in one batch"
    assert (row.rows_inserted, row.rows_updated, row.rows_deleted) == (1, 3, 0)
    runner = pipeline.runner("items")
    feed, planned = runner.batch_feed, runner.turns.feed
    if _path(apply_settings) == "driver":
        # Planned from the commit files (a batch after Spark's first), or by Spark and read by delta-rs.
        from_files = planned.counts.from_commit_files if planned is not None else 0
        assert feed is not None and feed.read_by_delta_rs + from_files >= 1 and feed.read_by_spark == 0, \
            "the restart's batches (seven versions in one) were read by delta-rs"
    assert _replica_operations(pipeline, "items") == PATH_COMMITS[_path(apply_settings)]
    _assert_batch_paths(pipeline, apply_settings)


def test_a_destination_that_is_the_source_under_another_name_is_refused_never_written(pipeline):
    """``dst.sales`` is a link to ``src.sales`` (one folder, two names: validation cannot see it): the
    replica would be the source itself. The table fails saying so, and no advice is to drop it."""
    import os
    from pathlib import Path

    pipeline.create("t", "id BIGINT NOT NULL, v STRING", key="id")
    pipeline.sql("t", "INSERT INTO {t} VALUES (1, 'a')")
    source_dir = Path(pipeline.source("t").path).parent
    Path(pipeline.replica("t").path).parent.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(source_dir, Path(pipeline.replica("t").path).parent)
    before = pipeline.latest_version("t")
    pipeline.start()
    pipeline.tick_until(lambda: pipeline.views()["t"].state == "failed", what="t to be refused")
    error = pipeline.views()["t"].last_error
    assert "is the source table itself: a replica must be another table" in error, error
    assert "drop" not in error
    assert pipeline.latest_version("t") == before, "nothing was written to the source"


def test_an_existing_table_lakemirror_did_not_create_is_never_advised_dropped(pipeline):
    pipeline.create("t", "id BIGINT NOT NULL, v STRING", key="id")
    replica = pipeline.replica("t")
    pipeline.spark.sql(f"CREATE TABLE {replica.sql} (id BIGINT, v STRING) USING DELTA")
    pipeline.start()
    pipeline.tick_until(lambda: pipeline.views()["t"].state == "failed", what="t to be refused")
    error = pipeline.views()["t"].last_error
    assert "already exists and was not created by pipeline 'test'" in error, error
    assert "not created by lakemirror" in error and "set destination_catalog or destination_schema" in error
    assert "drop" not in error


def test_delete_and_reinsert_of_a_key_inside_one_version(pipeline):
    pipeline.create("t", "id BIGINT NOT NULL, v STRING")
    pipeline.sql("t", "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    pipeline.start()
    pipeline.wait_caught_up("t")
    # An overwrite shows as deletes of every old row plus inserts, all in one commit version.
    pipeline.sql("t", "INSERT OVERWRITE {t} VALUES (1, 'a2'), (3, 'c')")
    pipeline.wait_caught_up("t")
    pipeline.assert_replica_equals_source("t")


def test_a_new_source_column_reaches_the_replica_without_a_manual_restart(pipeline):
    pipeline.create("c", "id BIGINT NOT NULL, v STRING")
    pipeline.sql("c", "INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    pipeline.start()
    pipeline.wait_caught_up("c")
    pipeline.sql("c", "ALTER TABLE {t} ADD COLUMNS (score DOUBLE, note STRING)")
    pipeline.sql("c", "INSERT INTO {t} VALUES (3, 'c', 0.5, 'new')")
    pipeline.sql("c", "UPDATE {t} SET score = 9.0 WHERE id = 1")
    pipeline.wait_caught_up("c")
    pipeline.assert_replica_equals_source("c")
    from lakemirror import tables
    assert tables.read(pipeline.spark, pipeline.replica("c")).columns == ["id", "v", "score", "note"]


def test_restart_resumes_from_the_checkpoint_without_loss_or_duplicates(pipeline):
    pipeline.create("r", "id BIGINT NOT NULL, n BIGINT")
    pipeline.sql("r", "INSERT INTO {t} SELECT id, 0 FROM range(0, 20)")
    pipeline.start()
    pipeline.wait_caught_up("r")
    for round_ in range(3):
        pipeline.sql("r", f"UPDATE {{t}} SET n = n + 1 WHERE id % 2 = {round_ % 2}")
        pipeline.sql("r", f"INSERT INTO {{t}} SELECT id, 0 FROM range({20 + round_ * 5}, {25 + round_ * 5})")
        pipeline.wait_caught_up("r")
        pipeline.restart()
    pipeline.sql("r", "DELETE FROM {t} WHERE id < 3")
    pipeline.wait_caught_up("r")
    pipeline.assert_replica_equals_source("r")

    # one epoch only (no re-bootstrap on restart) and every batch's transaction committed once
    from lakemirror import tables
    from lakemirror.sinks.merge.delta_merge import is_txn_tag
    history = tables.delta_table(pipeline.spark, pipeline.replica("r")).history().collect()
    tags = [h["userMetadata"] for h in history if is_txn_tag(h["userMetadata"])]
    assert len(tags) == len(set(tags)) and len(tags) >= 4
    # The bootstrap: one chunk (a small table) committed under the epoch's bootstrap app id, once.
    bootstraps = [h for h in history if h["userMetadata"] and "/bootstrap/chunk/" in h["userMetadata"]]
    assert len(bootstraps) == 1, [(h["operation"], h["userMetadata"]) for h in history]
    assert not [h for h in history if h["operation"] in ("WRITE", "CREATE OR REPLACE TABLE AS SELECT",
                                                         "CREATE TABLE AS SELECT") and not h["userMetadata"]]


def test_bootstrap_copies_the_snapshot_then_streams_from_the_next_version(pipeline):
    pipeline.create("b", "id BIGINT NOT NULL, v STRING")
    for i in range(4):
        pipeline.sql("b", f"INSERT INTO {{t}} SELECT id, 'v{i}' FROM range({i * 10}, {i * 10 + 10})")
    pipeline.sql("b", "DELETE FROM {t} WHERE id % 7 = 0")
    v = pipeline.latest_version("b")
    pipeline.start()
    pipeline.wait_caught_up("b")
    from lakemirror.sinks.batch import snapshot_copy
    props = snapshot_copy.replica_properties(pipeline.spark, pipeline.replica("b"))
    assert props[snapshot_copy.BOOTSTRAP_VERSION_PROPERTY] == str(v)
    assert props[snapshot_copy.PIPELINE_PROPERTY] == "test"
    pipeline.sql("b", "UPDATE {t} SET v = 'changed' WHERE id < 5")
    pipeline.wait_caught_up("b")
    pipeline.assert_replica_equals_source("b")
    assert pipeline.app.checkpoints.latest("test")["src.sales.b"].first_version == v + 1


def test_replica_properties_are_set_at_bootstrap_and_a_deletion_vector_replica_stays_exact(make_pipeline):
    """``replica_properties`` reach the replica; with deletion vectors on, batches mark changed rows
    deleted instead of rewriting their files (on the driver: sinks/accelerator/dv_merge.py), and the replica must
    still equal the source."""
    pipeline = make_pipeline(replica_properties={"delta.enableDeletionVectors": "true"})  # so: never a rewrite
    pipeline.create("dv", "id BIGINT NOT NULL, v STRING", key="id")
    pipeline.sql("dv", "INSERT INTO {t} SELECT id, 'a' FROM range(0, 200)")
    pipeline.start()
    pipeline.wait_caught_up("dv")
    from lakemirror.sinks.batch import snapshot_copy
    props = snapshot_copy.replica_properties(pipeline.spark, pipeline.replica("dv"))
    assert props["delta.enableDeletionVectors"] == "true" and props[snapshot_copy.PIPELINE_PROPERTY] == "test"
    pipeline.sql("dv", "UPDATE {t} SET v = 'b' WHERE id % 3 = 0")
    pipeline.sql("dv", "DELETE FROM {t} WHERE id % 5 = 0")
    pipeline.sql("dv", "INSERT INTO {t} SELECT id, 'c' FROM range(0, 200) WHERE id % 10 = 0")
    pipeline.wait_caught_up("dv")
    pipeline.assert_replica_equals_source("dv")
    from lakemirror import tables
    merges = [h for h in tables.delta_table(pipeline.spark, pipeline.replica("dv")).history().collect()
              if h["operation"] == "MERGE"]
    # the changed rows were marked deleted in place: no MERGE copied an unchanged row to a new file
    assert merges and any(int(h["operationMetrics"]["numTargetDeletionVectorsAdded"]) > 0 for h in merges)
    assert all(int(h["operationMetrics"]["numTargetRowsCopied"]) == 0 for h in merges)
    paths = {(s.labels["read"], s.labels["write"]) for m in pipeline.app.metrics.registry.collect()
             if m.name == "lakemirror_batch_paths" for s in m.samples if s.name.endswith("_total") and s.value > 0}
    assert paths == {("delta-rs", "driver-deletion-vectors")}, paths


def test_a_batch_applied_twice_is_skipped_and_reported_as_replayed(spark, tmp_path):
    """The crash window after the MERGE commit: the same (app id, batch) again is skipped by Delta
    and reported as a replay, even though its earlier commit is still the replica's newest."""
    from datetime import datetime

    from lakemirror import tables
    from lakemirror.schema import Column
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink, TxnId
    from lakemirror.sinks.merge.planner import plan_merge
    from lakemirror.tables import TableLocation

    replica = TableLocation(TableName("dst", "s", "t"), str(tmp_path / "replica"))
    spark.sql(f"CREATE TABLE {replica.sql} (id BIGINT NOT NULL, v STRING) USING DELTA")
    plan = plan_merge((Column("id", "bigint", False), Column("v", "string")), ["id"])
    now = datetime(2026, 1, 1)
    batch = spark.createDataFrame(
        [(1, "a", "insert", 5, now), (2, "b", "insert", 5, now), (1, "a2", "update_postimage", 6, now)],
        "id BIGINT, v STRING, _change_type STRING, _commit_version BIGINT, _commit_timestamp TIMESTAMP")
    sink = DeltaMergeSink(replica, plan)
    first = sink.apply(batch, TxnId("lakemirror/test/t/e1", 0))
    again = sink.apply(batch, TxnId("lakemirror/test/t/e1", 0))
    assert (first.replayed, first.counts.inserted) == (False, 2)
    assert (again.replayed, again.counts.inserted) == (True, 2), "the replay reports the earlier commit's counts"
    assert tables.delta_table(spark, replica).history().count() == 2  # CREATE + one MERGE
    assert sorted(tuple(r) for r in tables.read(spark, replica).collect()) == [(1, "a2"), (2, "b")]


def test_checkpoint_rows_are_written_once_per_batch_with_or_without_the_known_new_hint(spark, tmp_path):
    """Fresh batches append blindly; a replayed batch appends only when its row is missing."""
    from datetime import datetime, timezone

    from lakemirror import tables
    from lakemirror.checkpoints.delta_store import DeltaCheckpointStore
    from lakemirror.checkpoints.records import CheckpointRow
    from lakemirror.tables import TableLocation

    store = DeltaCheckpointStore(spark, TableLocation(TableName("a", "b", "ck"), str(tmp_path / "ck")))
    store.ensure()
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def row(batch_id: int, error: str | None = None) -> CheckpointRow:
        return CheckpointRow(pipeline_id="p", source_fqn="s.s.t", dest_fqn="d.s.t", epoch=1, batch_id=batch_id,
                             txn_app_id="lakemirror/p/t/e1", first_version=1, last_version=1,
                             last_committed_version=1, rows_read=1, rows_merged=1, rows_inserted=1,
                             rows_updated=0, rows_deleted=0, lag_seconds=0.0, error=error, degraded=error is not None,
                             started_at=now, ended_at=now)

    store.append(row(0), known_new=True)
    store.append(row(1, error="boom"))   # a failure event of batch 1 is not batch 1's row
    store.append(row(0))                 # replay of batch 0: its row is there
    store.append(row(1))                 # replay of batch 1: its row is missing
    store.append(row(1))
    got = sorted((r["batch_id"], r["error"] or "") for r in tables.read(spark, store.location).collect())
    assert got == [(0, ""), (1, ""), (1, "boom")]


@pytest.mark.parametrize("writer", ["delta-rs", "Spark"])
def test_checkpoint_rows_read_back_exactly_whichever_engine_appends_them(spark, tmp_path, writer):
    """A local checkpoint table is appended to by delta-rs, any other by Spark: the rows Spark reads
    back are the ones written, NULLs and timestamps included, and the engine is the expected one."""
    from datetime import datetime, timezone

    from lakemirror.checkpoints.delta_store import DeltaCheckpointStore
    from lakemirror.checkpoints.records import CheckpointRow
    from lakemirror.tables import TableLocation

    store = DeltaCheckpointStore(spark, TableLocation(TableName("a", "b", "ck"), str(tmp_path / "ck")))
    store.ensure()
    if writer == "Spark":
        spark.sql(f"ALTER TABLE {store.location.sql} SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    row = CheckpointRow(pipeline_id="p", source_fqn="s.s.t", dest_fqn="d.s.t", epoch=3, batch_id=7,
                        txn_app_id="lakemirror/p/t/e3", first_version=None, last_version=12,
                        last_committed_version=None, rows_read=5, rows_merged=4, rows_inserted=2, rows_updated=1,
                        rows_deleted=1, lag_seconds=None, error=None, degraded=False,
                        started_at=datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc),
                        ended_at=datetime(2026, 1, 2, 3, 4, 6, tzinfo=timezone.utc))
    store.append(row, known_new=True)

    def instants(r: CheckpointRow) -> dict:  # Spark answers naive local times: compare the instants
        return {k: v.timestamp() if isinstance(v, datetime) else v for k, v in r.as_dict().items()}
    assert {k: instants(v) for k, v in store.latest("p").items()} == {"s.s.t": instants(row)}
    engine = spark.sql(f"DESCRIBE HISTORY {store.location.sql}").orderBy("version", ascending=False).first()
    assert str(engine["engineInfo"]).startswith("delta-rs" if writer == "delta-rs" else "Apache-Spark")


def test_checkpoint_rows_from_concurrent_streams_are_each_written_once(spark, tmp_path):
    """Several tables' streams append at once: rows are group-committed, none lost or doubled."""
    import threading
    from datetime import datetime, timezone

    from lakemirror import tables
    from lakemirror.checkpoints.delta_store import DeltaCheckpointStore
    from lakemirror.checkpoints.records import CheckpointRow
    from lakemirror.tables import TableLocation

    store = DeltaCheckpointStore(spark, TableLocation(TableName("a", "b", "ck_many"), str(tmp_path / "ck")))
    store.ensure()
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def stream(table: int) -> None:
        for batch_id in range(4):
            store.append(CheckpointRow(
                pipeline_id="p", source_fqn=f"s.s.t{table}", dest_fqn=f"d.s.t{table}", epoch=1, batch_id=batch_id,
                txn_app_id=f"lakemirror/p/t{table}/e1", first_version=batch_id, last_version=batch_id,
                last_committed_version=batch_id, rows_read=1, rows_merged=1, rows_inserted=1, rows_updated=0,
                rows_deleted=0, lag_seconds=0.0, error=None, degraded=False, started_at=now, ended_at=now),
                spark, known_new=True)

    threads = [threading.Thread(target=stream, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    got = sorted((r["txn_app_id"], r["batch_id"]) for r in tables.read(spark, store.location).collect())
    assert got == sorted((f"lakemirror/p/t{t}/e1", b) for t in range(4) for b in range(4))
    commits = tables.delta_table(spark, store.location).history().where("operation = 'WRITE' AND version > 0").count()
    assert commits == len(store._group.group_sizes) <= 16  # noqa: SLF001 (one commit per group)


def test_a_merge_that_changes_nothing_is_fresh_not_a_replay(spark, tmp_path):
    """Deleting a key the replica lacks changes no row; Delta still answers the MERGE it ran."""
    from datetime import datetime

    from lakemirror.schema import Column
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink, TxnId
    from lakemirror.sinks.merge.planner import plan_merge
    from lakemirror.tables import TableLocation

    replica = TableLocation(TableName("dst", "s", "noop"), str(tmp_path / "replica"))
    spark.sql(f"CREATE TABLE {replica.sql} (id BIGINT NOT NULL, v STRING) USING DELTA")
    plan = plan_merge((Column("id", "bigint", False), Column("v", "string")), ["id"])
    batch = spark.createDataFrame([(7, "x", "delete", 3, datetime(2026, 1, 1))],
                                  "id BIGINT, v STRING, _change_type STRING, _commit_version BIGINT, "
                                  "_commit_timestamp TIMESTAMP")
    sink = DeltaMergeSink(replica, plan)
    first = sink.apply(batch, TxnId("lakemirror/test/noop/e1", 0))
    again = sink.apply(batch, TxnId("lakemirror/test/noop/e1", 0))
    assert (first.replayed, first.counts.total) == (False, 0)
    assert again.replayed


@pytest.mark.parametrize("path", ["stable", "materialized", "rewrite", "driver"])
def test_every_apply_path_reports_the_batch_as_an_action_would(spark, tmp_path, path):
    """A change-feed batch applied with its statistics observed during the MERGE (stable), counted
    first (materialized), or by a rewrite of the whole replica: same replica, same statistics as a
    separate count, the counts a MERGE reports, a replay still recognised (its statistics then come
    from an action, a rewrite's counts from a recount), and an empty batch harmless."""
    from lakemirror import tables
    from lakemirror.schema import Column
    from lakemirror.sinks.merge.apply_choice import ApplyChoice
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink, TxnId
    from lakemirror.sinks.memory import ApplyCounts
    from lakemirror.sinks.merge.planner import plan_merge
    from lakemirror.tables import TableLocation

    name, stable = path, path != "materialized"
    source = TableLocation(TableName("src", "s", name), str(tmp_path / "source"))
    replica = TableLocation(TableName("dst", "s", name), str(tmp_path / "replica"))
    ddl = "a BIGINT, b STRING, v INT"  # a nullable composite key: NULL is a key value like any other
    spark.sql(f"CREATE TABLE {source.sql} ({ddl}) USING DELTA TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    spark.sql(f"CREATE TABLE {replica.sql} ({ddl}) USING DELTA")
    spark.sql(f"INSERT INTO {source.sql} VALUES (1, NULL, 1), (1, 'x', 2), (NULL, NULL, 3)")       # v1
    spark.sql(f"UPDATE {source.sql} SET v = v * 10 WHERE b IS NULL")                               # v2
    spark.sql(f"DELETE FROM {source.sql} WHERE a = 1 AND b = 'x'")                                 # v3
    spark.sql(f"INSERT INTO {source.sql} VALUES (1, 'x', 4)")                                      # v4
    spark.sql(f"ALTER TABLE {source.sql} SET TBLPROPERTIES ('lakemirror.test' = 'no data')")       # v5
    plan = plan_merge((Column("a", "bigint"), Column("b", "string"), Column("v", "int")), ["a", "b"])
    choice = ApplyChoice(path, "test", bytes_per_row=10.0, limit_bytes=10**9) if path in ("rewrite", "driver") else None
    sink = DeltaMergeSink(replica, plan, stable_source=stable, choice=choice)
    assert (sink.rewrite is not None, sink.driver is not None) == (path == "rewrite", path == "driver")

    def feed(lo: int, hi: int):
        return tables.read(spark, source, readChangeFeed="true", startingVersion=lo, endingVersion=hi)

    first = sink.apply(feed(1, 4), TxnId(f"lakemirror/test/{name}/e1", 0))
    assert first.stats == sink.stats(feed(1, 4)) and first.stats.rows_read == 9
    assert (first.stats.first_version, first.stats.last_version) == (1, 4)
    assert (first.replayed, first.counts) == (False, ApplyCounts(inserted=3))
    again = sink.apply(feed(1, 4), TxnId(f"lakemirror/test/{name}/e1", 0))
    assert again.replayed and again.stats == first.stats and again.counts == first.counts
    empty = sink.apply(feed(5, 5), TxnId(f"lakemirror/test/{name}/e1", 1))
    assert empty.stats.rows_read == 0 and not empty.replayed and empty.counts.total == 0
    spark.sql(f"UPDATE {source.sql} SET v = v + 1 WHERE a = 1")                                    # v6: 2 rows
    spark.sql(f"DELETE FROM {source.sql} WHERE a IS NULL")                                         # v7: the NULL key
    spark.sql(f"INSERT INTO {source.sql} VALUES (2, 'y', 5)")                                      # v8
    second = sink.apply(feed(6, 8), TxnId(f"lakemirror/test/{name}/e1", 2))
    assert (second.replayed, second.counts) == (False, ApplyCounts(inserted=1, updated=2, deleted=1))
    assert sorted(map(tuple, tables.read(spark, replica).collect()), key=repr) == \
        sorted(map(tuple, tables.read(spark, source).collect()), key=repr)
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true", "the MERGE's confs are restored after it"
    assert (sink.rewrite is not None, sink.driver is not None) == (path == "rewrite", path == "driver"), \
        "every batch went the chosen way (no fallback)"


def _driver_case(spark, tmp_path, name: str, ddl: str, keys: list[str], deletion_vectors: bool = False):
    """A CDF source and an empty replica of ``ddl``, and a sink on the driver path (by deletion
    vectors when ``deletion_vectors``)."""
    from lakemirror import tables
    from lakemirror.schema import columns_from_struct
    from lakemirror.sinks.merge.apply_choice import ApplyChoice
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
    from lakemirror.sinks.merge.planner import plan_merge
    from lakemirror.tables import TableLocation

    source = TableLocation(TableName("src", "s", name), str(tmp_path / f"{name}-source"))
    replica = TableLocation(TableName("dst", "s", name), str(tmp_path / f"{name}-replica"))
    spark.sql(f"CREATE TABLE {source.sql} ({ddl}) USING DELTA TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    dv = " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')" if deletion_vectors else ""
    spark.sql(f"CREATE TABLE {replica.sql} ({ddl}) USING DELTA{dv}")
    plan = plan_merge(columns_from_struct(tables.read(spark, source).schema), keys)
    sink = DeltaMergeSink(replica, plan, stable_source=True,
                          choice=ApplyChoice("driver", "test", bytes_per_row=10.0, limit_bytes=10**9,
                                             rewrite_limit_bytes=10**9, deletion_vectors=deletion_vectors))

    def feed(lo: int, hi: int):
        return tables.read(spark, source, readChangeFeed="true", startingVersion=lo, endingVersion=hi)

    def same() -> bool:
        return sorted(map(tuple, tables.read(spark, replica).collect()), key=repr) == \
            sorted(map(tuple, tables.read(spark, source).collect()), key=repr)
    return source, replica, sink, feed, same


#: Each reader and each writer in the default tier; their two other pairings in the slow tier.
@pytest.mark.parametrize("reader, deletion_vectors", [
    ("spark", False), pytest.param("delta-rs", False, marks=pytest.mark.slow),
    pytest.param("spark", True, marks=pytest.mark.slow), ("delta-rs", True)])
def test_the_driver_path_quotes_odd_column_names_and_keeps_every_type(spark, tmp_path, reader, deletion_vectors):
    """Names DataFusion would misread unquoted (a double quote, a single quote, upper case) and the
    types Spark hands to Arrow (decimal, timestamp, date, binary, nested) reach the replica exact,
    whether Spark or delta-rs (:mod:`lakemirror.sources.driver_feed`) reads the batch, and whether
    delta-rs MERGEs it or deletion vectors mark it (:mod:`lakemirror.sinks.accelerator.dv_merge`, with a
    composite key holding a NULL part); the batch's statistics are the same either way."""
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink, TxnId
    from lakemirror.sinks.memory import ApplyCounts
    from lakemirror.sources.driver_feed import DriverFeed
    from lakemirror.delta_log.stream_offsets import VersionRange

    ddl = ("`Key\"1` BIGINT, `it's` STRING, `MiXeD` DECIMAL(12,3), ts TIMESTAMP, d DATE, bin BINARY, "
           "tags ARRAY<STRING>, attrs MAP<STRING, INT>, pos STRUCT<x: DOUBLE, y: DOUBLE>, ok BOOLEAN")
    source, replica, sink, feed, same = _driver_case(spark, tmp_path, "odd", ddl, ['Key"1', "it's"], deletion_vectors)
    assert sink.driver is not None
    spark.sql(f"INSERT INTO {source.sql} VALUES "
              "(1, 'a', 1.5, TIMESTAMP'2026-01-02 03:04:05.123456', DATE'2026-01-02', X'00FF', array('p', NULL), "
              "map('k', 1), named_struct('x', 1.0, 'y', -2.5), true), "
              "(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), "
              "(2, 'b''c', -0.001, NULL, NULL, X'', array(), map(), NULL, false)")                            # v1
    spark.sql(f"UPDATE {source.sql} SET `MiXeD` = `MiXeD` * 2, tags = array('q') WHERE `Key\"1` = 1")       # v2
    spark.sql(f"DELETE FROM {source.sql} WHERE `it's` = 'b''c'")                                             # v3
    spark.sql(f"UPDATE {source.sql} SET ok = true WHERE `Key\"1` IS NULL")                                   # v4
    read = None
    if reader == "delta-rs":
        assert DriverFeed(source.path).unfit() is None

        def read(columns, max_rows):
            return DriverFeed(source.path).read(VersionRange(1, 4), columns, max_rows)
    outcome = sink.apply(feed(1, 4), TxnId("lakemirror/test/odd/e1", 0), read)
    assert (outcome.replayed, outcome.counts) == (False, ApplyCounts(inserted=2))
    assert same()
    spark_stats = DeltaMergeSink.stats(feed(1, 4))
    assert (outcome.stats.rows_read, outcome.stats.first_version, outcome.stats.last_version) == \
        (spark_stats.rows_read, spark_stats.first_version, spark_stats.last_version)
    assert abs(outcome.stats.max_commit_time - spark_stats.max_commit_time) < 1.0
    history = [r["engineInfo"] for r in spark.sql(f"DESCRIBE HISTORY {replica.sql}").collect()]
    assert str(history[0]).startswith("lakemirror (deletion vectors" if deletion_vectors else "delta-rs")
    spark.sql(f"UPDATE {source.sql} SET ts = NULL, bin = X'01', attrs = map('z', 2) WHERE `Key\"1` = 1")    # v5
    spark.sql(f"DELETE FROM {source.sql} WHERE `Key\"1` IS NULL")                                         # v6
    spark.sql(f"INSERT INTO {source.sql} VALUES (NULL, 'n', 0.5, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")  # v7
    if reader == "delta-rs":
        def read(columns, max_rows):
            return DriverFeed(source.path).read(VersionRange(5, 7), columns, max_rows)
    outcome = sink.apply(feed(5, 7), TxnId("lakemirror/test/odd/e1", 1), read)
    assert (outcome.replayed, outcome.counts) == (False, ApplyCounts(inserted=1, updated=1, deleted=1))
    assert same()


def test_the_driver_path_hands_a_large_batch_to_spark_and_a_refused_one_for_good(spark, tmp_path, monkeypatch):
    from lakemirror.sinks.merge.delta_merge import TxnId
    from lakemirror.sinks.accelerator.driver_apply import DriverApply

    source, replica, sink, feed, same = _driver_case(spark, tmp_path, "handoff", "id BIGINT NOT NULL, v STRING", ["id"])
    txn = "lakemirror/test/handoff/e1"
    spark.sql(f"INSERT INTO {source.sql} SELECT id, 'a' FROM range(0, 20)")                           # v1
    assert sink.driver is not None
    monkeypatch.setattr(sink.driver, "max_rows", 10)
    sink.apply(feed(1, 1), TxnId(txn, 0))                         # 20 rows > 10: this batch by Spark
    spark.sql(f"UPDATE {source.sql} SET v = 'b' WHERE id < 5")                                      # v2: 10 rows
    sink.apply(feed(2, 2), TxnId(txn, 1))                         # 10 rows: back on the driver
    assert sink.driver is not None and same()

    def refuse(*_):
        raise ValueError("simulated: a type delta-rs cannot write")
    monkeypatch.setattr(DriverApply, "_merge", refuse)
    spark.sql(f"DELETE FROM {source.sql} WHERE id = 7")                                             # v3
    outcome = sink.apply(feed(3, 3), TxnId(txn, 2))
    assert not outcome.replayed and outcome.counts.deleted == 1
    assert sink.driver is None and sink.rewrite is not None, "refused once: Spark from now on"
    engines = [str(r["engineInfo"]).split("/")[0].split(":")[0]
               for r in spark.sql(f"DESCRIBE HISTORY {replica.sql}").orderBy("version").collect()]
    assert engines == ["Apache-Spark", "Apache-Spark", "delta-rs", "Apache-Spark"]
    assert same()


def test_spark_and_the_driver_recognise_each_others_committed_batches(spark, tmp_path):
    """A batch committed by one engine is a replay for the other: the transaction id is Delta's."""
    from lakemirror.sinks.merge.apply_choice import ApplyChoice
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink, TxnId
    from lakemirror.sinks.memory import ApplyCounts

    source, replica, driver_sink, feed, same = _driver_case(spark, tmp_path, "both", "id BIGINT NOT NULL, v STRING",
                                                           ["id"])
    spark_sink = DeltaMergeSink(replica, driver_sink.plan, stable_source=True,
                                choice=ApplyChoice("rewrite", "test", bytes_per_row=10.0, limit_bytes=10**9))
    txn = "lakemirror/test/both/e1"
    spark.sql(f"INSERT INTO {source.sql} VALUES (1, 'a'), (2, 'b')")                                 # v1
    spark.sql(f"UPDATE {source.sql} SET v = 'c' WHERE id = 1")                                      # v2
    by_spark = spark_sink.apply(feed(1, 1), TxnId(txn, 0))
    assert (by_spark.read, by_spark.write) == ("spark", "spark-rewrite")
    assert driver_sink.apply(feed(1, 1), TxnId(txn, 0)) == \
        type(by_spark)(by_spark.stats, by_spark.counts, replayed=True, read="spark", write="delta-rs-merge")
    by_driver = driver_sink.apply(feed(2, 2), TxnId(txn, 1))
    assert (by_driver.replayed, by_driver.counts) == (False, ApplyCounts(updated=1))
    again = spark_sink.apply(feed(2, 2), TxnId(txn, 1))
    assert again.replayed and again.counts == by_driver.counts
    assert same()


def test_a_rewritten_replica_that_outgrows_the_limit_switches_to_merge(spark, tmp_path):
    """The rewrite limit follows the rows each rewrite observes: past it, batches MERGE."""
    from lakemirror import tables
    from lakemirror.schema import Column
    from lakemirror.sinks.merge.apply_choice import ApplyChoice
    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink, TxnId
    from lakemirror.sinks.merge.planner import plan_merge
    from lakemirror.tables import TableLocation

    source = TableLocation(TableName("src", "s", "grow"), str(tmp_path / "source"))
    replica = TableLocation(TableName("dst", "s", "grow"), str(tmp_path / "replica"))
    spark.sql(f"CREATE TABLE {source.sql} (id BIGINT NOT NULL, v STRING) USING DELTA "
              "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    spark.sql(f"CREATE TABLE {replica.sql} (id BIGINT NOT NULL, v STRING) USING DELTA")
    plan = plan_merge((Column("id", "bigint", False), Column("v", "string")), ["id"])
    sink = DeltaMergeSink(replica, plan, stable_source=True,
                          choice=ApplyChoice("rewrite", "test", bytes_per_row=10.0, limit_bytes=25))
    txn = "lakemirror/test/grow/e1"
    spark.sql(f"INSERT INTO {source.sql} VALUES (1, 'a'), (2, 'b')")                 # v1: 20 bytes
    sink.apply(tables.read(spark, source, readChangeFeed="true", startingVersion=1, endingVersion=1), TxnId(txn, 0))
    assert sink.rewrite is not None and sink.replica_rows == 2
    spark.sql(f"INSERT INTO {source.sql} VALUES (3, 'c')")                           # v2: 30 bytes
    sink.apply(tables.read(spark, source, readChangeFeed="true", startingVersion=2, endingVersion=2), TxnId(txn, 1))
    assert sink.rewrite is None, "3 rows of 10 bytes are past the 25-byte limit"
    spark.sql(f"UPDATE {source.sql} SET v = 'c2' WHERE id = 3")                      # v3
    sink.apply(tables.read(spark, source, readChangeFeed="true", startingVersion=3, endingVersion=3), TxnId(txn, 2))
    operations = [r["operation"] for r in tables.delta_table(spark, replica).history().orderBy("version").collect()]
    assert operations == ["CREATE TABLE", "WRITE", "WRITE", "MERGE"]
    assert sorted(map(tuple, tables.read(spark, replica).collect())) == [(1, "a"), (2, "b"), (3, "c2")]


def test_a_tagged_commit_is_found_among_the_newest_or_in_the_whole_history(spark, tmp_path, monkeypatch):
    from lakemirror import tables
    from lakemirror.tables import TableLocation

    loc = TableLocation(TableName("dst", "s", "tags"), str(tmp_path / "tags"))
    spark.sql(f"CREATE TABLE {loc.sql} (id BIGINT) USING DELTA")                     # v0
    for i in range(1, 5):                                                           # v1..v4
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", f"tag-{i % 2}")
        try:
            spark.sql(f"INSERT INTO {loc.sql} VALUES ({i})")
        finally:
            spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")
    monkeypatch.setattr(tables, "RECENT_COMMITS", 2)
    assert [r["version"] for r in tables.tagged_commits(spark, loc, "tag-0", "version")] == [4]  # among v4, v3
    assert [r["version"] for r in tables.tagged_commits(spark, loc, "tag-1", "version")] == [3]
    monkeypatch.setattr(tables, "RECENT_COMMITS", 1)
    assert [r["version"] for r in tables.tagged_commits(spark, loc, "tag-1", "version")] == [3, 1]  # whole history
    assert tables.tagged_commits(spark, loc, "never", "version") == []
