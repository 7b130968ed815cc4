"""Reconciliation, repair and clone on real Spark + Delta (one shared local session)."""

from __future__ import annotations

import json

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.clone import CLONE_VERSION_PROPERTY, DeltaCloner
from lakemirror.sinks.reconcile import DeltaReconciliationStore, ReconcileOptions, Reconciler
from lakemirror.sinks.snapshot_copy import replica_properties
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

    found = rec.reconcile(src, rep, ["id"], ReconcileOptions(buckets=64))
    assert (found.missing, found.extra, found.different) == (1, 1, 3)
    assert found.sample_keys["missing"] == ('{"id":10}',)
    assert found.sample_keys["extra"] == ('{"id":5000}',)
    assert sorted(json.loads(k)["id"] for k in found.sample_keys["different"]) == [14, 20, 30]
    assert 1 <= found.buckets_differing <= 5 and found.status == "different"
    assert found.metric_samples() == {"missing": 1, "extra": 1, "different": 3}

    repaired = rec.reconcile(src, rep, ["id"], ReconcileOptions(buckets=64, repair=True), run_id="r1")
    assert repaired.repaired and repaired.mismatched_keys == 5
    assert rec.reconcile(src, rep, ["id"], ReconcileOptions(buckets=64)).equal
    assert _rows(spark, rep) == _rows(spark, src)

    store = DeltaReconciliationStore(spark, cat.locate(TableName("dst", "continuous_sync", "reconciliation")))
    store.append("r1", found)
    row = tables.read(spark, store.location).collect()[0]
    assert (row["missing_keys"], row["extra_keys"], row["different_keys"], row["status"]) == (1, 1, 3, "different")


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
