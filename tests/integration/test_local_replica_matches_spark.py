"""A local replica's columns and facts read by delta-rs on the driver are Spark's own answers, for
the replicas the daemon makes (Spark's writes, delta-rs's MERGEs, a change feed, properties),
and where delta-rs cannot tell them exactly it says so and Spark is asked; so is a source's
description read from its log (id, columns, properties, declared key), whatever features it has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakemirror.identifiers import TableName
from lakemirror.schema import columns_from_struct
from lakemirror.sources.catalog import LocalCatalog
from lakemirror.sources.log_description import describe_from_log
from lakemirror.sinks.batch.snapshot_copy import replica_facts
from lakemirror.sinks.merge.local_replica import LocalReplica
from lakemirror.tables import TableLocation

pytestmark = pytest.mark.integration

TYPES = ("id BIGINT NOT NULL, i INT, s SMALLINT, t TINYINT, f FLOAT, d DOUBLE, dec DECIMAL(12,3), b BOOLEAN, "
         "bin BINARY, day DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, str STRING, chr CHAR(3), vc VARCHAR(5), "
         "arr ARRAY<STRUCT<a_b: INT, c: STRING>>, m MAP<STRING, ARRAY<BIGINT>>, st STRUCT<x: DOUBLE, y: DATE>")


def _table(spark: Any, path: Path, ddl: str, properties: str = "") -> TableLocation:
    loc = TableLocation(TableName("dst", "s", path.name), str(path))
    spark.sql(f"CREATE TABLE {loc.sql} ({ddl}) USING DELTA" + (f" TBLPROPERTIES ({properties})" if properties else ""))
    return loc


def _same_facts(spark: Any, loc: TableLocation) -> None:
    local = LocalReplica.open(loc.path)
    assert local is not None
    mine, sparks = local.facts(observable=True), replica_facts(spark, loc)
    assert mine is not None
    assert (mine.size_bytes, mine.rows, mine.columns, dict(mine.properties), mine.local, mine.observable) == (
        sparks.size_bytes, sparks.rows, sparks.columns, dict(sparks.properties), sparks.local, sparks.observable)
    assert set(mine.features or ()) == set(sparks.features or ())


def test_every_type_is_named_as_spark_reads_it(spark: Any, tmp_path: Path) -> None:
    loc = _table(spark, tmp_path / "types", TYPES)
    local = LocalReplica.open(loc.path)
    assert local is not None
    assert local.columns() == columns_from_struct(spark.read.format("delta").load(loc.path).schema)


@pytest.mark.parametrize("properties", ["", "'delta.enableChangeDataFeed' = 'true'",
                                        "'delta.appendOnly' = 'false', 'lakemirror.pipeline' = 'p'"],
                         ids=["plain", "change feed", "properties"])
def test_the_facts_are_sparks_for_spark_and_delta_rs_writes(spark: Any, tmp_path: Path, properties: str) -> None:
    loc = _table(spark, tmp_path / "r", "id BIGINT NOT NULL, v STRING", properties)
    spark.sql(f"INSERT INTO {loc.sql} SELECT id, CAST(id AS STRING) FROM range(0, 50)")
    spark.sql(f"INSERT INTO {loc.sql} SELECT id, 'x' FROM range(50, 60)")
    _same_facts(spark, loc)
    (DeltaTable(loc.path).merge(pa.table({"id": pa.array([1, 70], pa.int64()), "v": ["one", "seventy"]}),
                                "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    _same_facts(spark, loc)


def test_a_replica_with_deletion_vectors_on_leaves_its_facts_to_spark(spark: Any, tmp_path: Path) -> None:
    # delta-rs does not show a file's deletion vector: it cannot tell the rows Spark's count leaves out.
    loc = _table(spark, tmp_path / "dv", "id BIGINT NOT NULL, v STRING", "'delta.enableDeletionVectors' = 'true'")
    spark.sql(f"INSERT INTO {loc.sql} SELECT id, 'a' FROM range(0, 100)")
    spark.sql(f"DELETE FROM {loc.sql} WHERE id % 10 = 0")
    local = LocalReplica.open(loc.path)
    assert local is not None and local.facts(observable=True) is None
    assert replica_facts(spark, loc).rows == 90


#: Sources of every shape the description must read as Spark does: every type with a change feed and a
#: declared key; column mapping, comments and generated columns; identity, variant, deletion vectors, row
#: tracking and v2 checkpoints; then each altered (a column added, a type widened, a property set).
SOURCES = {
    "types": (TYPES, "'delta.enableChangeDataFeed' = 'true', 'lakemirror.primaryKey' = 'id, i'"),
    "mapping": ("id INT NOT NULL COMMENT 'the id', `a col` STRING, v INT GENERATED ALWAYS AS (id * 2), s SMALLINT",
                "'delta.columnMapping.mode' = 'name', 'delta.enableTypeWidening' = 'true', 'custom.prop' = 'x'"),
    "features": ("id BIGINT GENERATED ALWAYS AS IDENTITY, v VARIANT, n INT",
                 "'delta.enableDeletionVectors' = 'true', 'delta.enableRowTracking' = 'true', "
                 "'delta.checkpointPolicy' = 'v2', 'delta.checkpointInterval' = '2'"),
}


@pytest.mark.parametrize("shape", sorted(SOURCES))
def test_a_source_described_from_its_log_is_described_as_spark_does(spark: Any, tmp_path: Path, shape: str) -> None:
    ddl, properties = SOURCES[shape]
    catalog = LocalCatalog(tmp_path)
    name = TableName("src", "s", shape)
    loc = _table(spark, Path(catalog.locate(name).path or ""), ddl, properties)
    if shape == "features":
        spark.sql(f"INSERT INTO {loc.sql} (v, n) SELECT parse_json('{{\"a\": 1}}'), 1 FROM range(3)")
        spark.sql(f"DELETE FROM {loc.sql} WHERE id = 1")
    if shape == "mapping":
        spark.sql(f"ALTER TABLE {loc.sql} ALTER COLUMN s TYPE INT")
    spark.sql(f"ALTER TABLE {loc.sql} ADD COLUMNS (added DECIMAL(38, 6))")
    spark.sql(f"ALTER TABLE {loc.sql} SET TBLPROPERTIES ('lakemirror.note' = 'altered')")

    assert describe_from_log(spark, loc.path) is not None  # the driver read it: no Spark job
    assert catalog.describe(spark, name) == catalog.describe_by_spark(spark, name)
