"""Reconciliation, repair and clone on real Spark + Delta (one shared local session)."""

from __future__ import annotations

import json

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.clone import CLONE_VERSION_PROPERTY, DeltaCloner
from lakemirror.sinks.batch.reconcile import DeltaReconciliationStore, ReconcileOptions, Reconciler
from lakemirror.sinks.batch.snapshot_copy import replica_properties
from lakemirror.sources.catalog import LocalCatalog

pytestmark = pytest.mark.integration


def _rows(spark, loc):
    return sorted((tuple(r) for r in tables.read(spark, loc).collect()), key=repr)


def test_clone_reconcile_finds_each_kind_of_mismatch_and_repair_fixes_them(spark, tmp_path):
    cat = LocalCatalog(tmp_path)
    src, rep = cat.locate(TableName("src", "s", "t")), cat.locate(TableName("dst", "s", "t"))
    spark.sql(f"CREATE TABLE {src.sql} (id BIGINT NOT NULL, name STRING, amount DECIMAL(12,2), "
              f"ts TIMESTAMP) USING DELTA TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    spark.sql(f"INSERT INTO {src.sql} SELECT id, CASE WHEN id % 7 = 0 THEN NULL ELSE concat('n', id) END, "
              f"id / 4, timestamp'2024-01-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) FROM range(0, 3000)")

    cloned = DeltaCloner(spark).clone(src, rep, keys=["id"])
    assert cloned.mode == "full"
    assert replica_properties(spark, rep)[CLONE_VERSION_PROPERTY] == str(cloned.source_version)

    rec = Reconciler(spark)
    clean = rec.reconcile(src, rep, ["id"], ReconcileOptions(buckets=64))
    assert clean.equal and clean.mismatched_keys == 0 and clean.buckets_differing == 0
    assert clean.source_rows == clean.replica_rows == 3000

    spark.sql(f"DELETE FROM {rep.sql} WHERE id = 10")                                   # missing
    spark.sql(f"INSERT INTO {rep.sql} VALUES (5000, 'x', 1.00, timestamp'2024-01-01 00:00:00')")  # extra
    spark.sql(f"UPDATE {rep.sql} SET amount = amount + 0.01 WHERE id = 20")             # different
    spark.sql(f"UPDATE {rep.sql} SET name = '' WHERE id = 14")                          # NULL -> ''
    spark.sql(f"UPDATE {rep.sql} SET ts = ts + INTERVAL 1 MICROSECOND WHERE id = 30")  # sub-millisecond
    spark.sql(f"INSERT INTO {rep.sql} SELECT * FROM {rep.sql} WHERE id = 40")           # duplicated key

    found = rec.reconcile(src, rep, ["id"], ReconcileOptions(buckets=64))
    assert (found.missing, found.extra, found.different) == (1, 1, 4)
    assert found.sample_keys["missing"] == ('{"id":10}',)
    assert found.sample_keys["extra"] == ('{"id":5000}',)
    assert sorted(json.loads(k)["id"] for k in found.sample_keys["different"]) == [14, 20, 30, 40]
    assert 1 <= found.buckets_differing <= 6 and found.status == "different"
    assert found.metric_samples() == {"missing": 1, "extra": 1, "different": 4}

    repaired = rec.reconcile(src, rep, ["id"], ReconcileOptions(buckets=64, repair=True), run_id="r1")
    assert repaired.repaired and repaired.mismatched_keys == 6
    assert rec.reconcile(src, rep, ["id"], ReconcileOptions(buckets=64)).equal
    assert _rows(spark, rep) == _rows(spark, src)

    store = DeltaReconciliationStore(spark, cat.locate(TableName("dst", "continuous_sync", "reconciliation")))
    store.append("r1", found)
    row = tables.read(spark, store.location).collect()[0]
    assert (row["missing_keys"], row["extra_keys"], row["different_keys"], row["status"]) == (1, 1, 4, "different")


def test_incremental_clone_applies_only_the_change_feed(spark, tmp_path):
    cat = LocalCatalog(tmp_path)
    src, rep = cat.locate(TableName("src", "s", "c")), cat.locate(TableName("dst", "s", "c"))
    spark.sql(f"CREATE TABLE {src.sql} (id INT NOT NULL, v STRING) USING DELTA "
              f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    spark.sql(f"INSERT INTO {src.sql} SELECT id, concat('v', id) FROM range(0, 200)")
    cloner = DeltaCloner(spark)
    first = cloner.clone(src, rep, keys=["id"])
    assert first.mode == "full"

    spark.sql(f"UPDATE {src.sql} SET v = 'changed' WHERE id < 5")
    spark.sql(f"DELETE FROM {src.sql} WHERE id >= 190")
    spark.sql(f"INSERT INTO {src.sql} VALUES (500, 'new')")
    second = cloner.clone(src, rep, keys=["id"])
    assert (second.mode, second.from_version) == ("incremental", first.source_version + 1)
    assert second.rows_changed == 5 + 10 + 1
    assert _rows(spark, rep) == _rows(spark, src)
    assert replica_properties(spark, rep)[CLONE_VERSION_PROPERTY] == str(second.source_version)

    again = cloner.clone(src, rep, keys=["id"])
    assert again.mode == "noop"
    # Without a key, the clone cannot merge: it copies in full, and stays exact.
    spark.sql(f"INSERT INTO {src.sql} VALUES (501, 'x')")
    assert cloner.clone(src, rep).mode == "full"
    assert _rows(spark, rep) == _rows(spark, src)


def test_replicate_command_end_to_end_with_audit_metadata_and_a_failure(spark, tmp_path):
    from lakemirror.daemon.context import ReplicateContext
    from lakemirror.daemon.settings.replicate import load_replicate_config

    cat = LocalCatalog(tmp_path)
    orders, nokey = cat.locate(TableName("prod", "sales", "orders")), cat.locate(TableName("prod", "sales", "nokey"))
    comment = "it's a `tick` and a \\ backslash"
    spark.sql(f"CREATE TABLE {orders.sql} (id BIGINT NOT NULL, `no``te` STRING COMMENT 'col''s `c`') USING DELTA "
              f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true', 'team' = 'o''hara')")
    spark.sql(f"COMMENT ON TABLE {orders.sql} IS 'it\\'s a `tick` and a \\\\ backslash'")
    spark.sql(f"INSERT INTO {orders.sql} SELECT id, CAST(id AS STRING) FROM range(0, 100)")
    spark.sql(f"CREATE TABLE {nokey.sql} (a STRING, b STRING) USING DELTA")
    spark.sql(f"INSERT INTO {nokey.sql} VALUES ('x', 'y')")

    cfg = load_replicate_config(None, data={
        "operations": ["clone", "reconcile", "metadata"], "max_workers": 2,
        "retry": {"max_attempts": 2, "base_delay_seconds": 0.01},
        "runtime": {"warehouse": str(tmp_path)},
        "catalogs": [{"name": "prod", "target_catalog": "dr"}]})
    # The source moves on after its clone (a writer in another thread would do the same): the
    # reconciliation compares with the version the clone mirrors, so it finds nothing.
    from lakemirror.sinks.batch.operations import SparkOperations

    class WriteAfterClone(SparkOperations):
        def run(self, operation, job, tag):
            out = super().run(operation, job, tag)
            if operation == "clone" and job.source.table == "orders":
                spark.sql(f"INSERT INTO {orders.sql} VALUES (1000, 'late')")
            return out

    app = ReplicateContext(cfg).replace(spark=spark, run_id="run-1", execution_user="tester")
    app.replace(operations=WriteAfterClone(spark, app.catalog, app.results, run_id="run-1"))
    summary = app.run()

    assert not summary.ok
    assert [(o.operation, str(o.job.source), o.attempts) for o in summary.failed] == [
        ("reconcile", "prod.sales.nokey", 1)]
    audit = tables.read(spark, cat.locate(TableName("dr", "continuous_sync", "audit_log"))).collect()
    by = sorted((r["object_name"], r["operation_type"], r["status"], r["attempt_number"]) for r in audit)
    assert by == [("nokey", "reconciliation", "failed", 1), ("nokey", "replication", "success", 1),
                  ("nokey", "uc_replication", "success", 1), ("orders", "reconciliation", "success", 1),
                  ("orders", "replication", "success", 1), ("orders", "uc_replication", "success", 1)]
    failed = next(r for r in audit if r["status"] == "failed")
    assert "no usable primary key" in failed["error_message"] and failed["max_attempts"] == 2
    assert {r["run_id"] for r in audit} == {"run-1"} and {r["execution_user"] for r in audit} == {"tester"}

    recon = tables.read(spark, cat.locate(TableName("dr", "continuous_sync", "reconciliation"))).collect()
    assert [(r["source_table"], r["status"], r["source_rows"]) for r in recon] == [("prod.sales.orders", "equal", 100)]
    assert app.operations.latest_results["prod.sales.orders"].mismatched_keys == 0

    replica = cat.locate(TableName("dr", "sales", "orders"))
    detail = spark.sql(f"DESCRIBE DETAIL {replica.sql}").collect()[0]
    assert detail["description"] == comment
    assert detail["properties"]["team"] == "o'hara"
    field = tables.read(spark, replica).schema["no`te"]
    assert field.metadata.get("comment") == "col's `c`"

    # Metadata alone, from the CLI: changed comments (quotes, backticks) reach the existing replica.
    from lakemirror.daemon.settings.replicate import CliOverrides

    spark.sql(f"ALTER TABLE {orders.sql} ALTER COLUMN `no``te` COMMENT 'new \"q\" `b` \\'s'")
    spark.sql(f"COMMENT ON TABLE {orders.sql} IS 'v2 `x`'")
    again = ReplicateContext(load_replicate_config(
        None, CliOverrides(operations=["metadata"], target_schemas=["sales"]), data=cfg.model_dump(exclude={"cli"}))
    ).replace(spark=spark, run_id="run-2", execution_user="tester").run()
    assert again.ok and {o.operation for o in again.outcomes} == {"metadata"}
    assert spark.sql(f"DESCRIBE DETAIL {replica.sql}").collect()[0]["description"] == "v2 `x`"
    assert tables.read(spark, replica).schema["no`te"].metadata.get("comment") == "new \"q\" `b` 's"
