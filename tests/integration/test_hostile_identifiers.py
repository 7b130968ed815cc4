"""Hostile identifiers end to end: quotes, backticks, spaces, unicode and SQL fragments in table
and column names are quoted everywhere lakemirror writes SQL (snapshot, MERGE, schema evolution,
checkpoint rows), so the replica is exact and nothing is interpolated unsafely.

Delta itself (4.x) cannot UPDATE a CDF-enabled table with a backtick in a column name (its change
writer fails with INVALID_ATTRIBUTE_NAME_SYNTAX on ``packedData.`…```), so the backtick column
here is one added later and only inserted into; the table name carries backticks throughout."""

from __future__ import annotations

import pytest

from lakemirror import tables
from lakemirror.identifiers import quote

pytestmark = pytest.mark.integration

TABLE = "order's `items` ü; DROP TABLE x --"
KEY = "k'ey it's"
COLUMNS = {
    KEY: "BIGINT NOT NULL",
    "sp ace": "STRING",
    "ünïcødé": "INT",
    "a,b;c{d}(e)=f": "STRING",
    "x'); DROP TABLE y; --": "STRING",
}


def test_hostile_table_and_column_names_replicate_exactly(pipeline):
    ddl = ", ".join(f"{quote(name)} {kind}" for name, kind in COLUMNS.items())
    loc = pipeline.source(TABLE)
    pipeline.spark.sql(
        f"CREATE TABLE {loc.sql} ({ddl}) USING DELTA TBLPROPERTIES ("
        f"'delta.enableChangeDataFeed' = 'true', 'delta.columnMapping.mode' = 'name', "
        f"'lakemirror.primaryKey' = '{KEY.replace(chr(39), chr(92) + chr(39))}')")
    cols = ", ".join(quote(c) for c in COLUMNS)
    t = loc.sql

    def sql(statement: str) -> None:  # no str.format: the names hold braces
        pipeline.spark.sql(statement)

    sql(f"INSERT INTO {t} ({cols}) VALUES (1, 'a b', 1, 'x,y', 'z'''), (2, NULL, 2, NULL, '`')")
    pipeline.start()
    pipeline.wait_caught_up(TABLE)
    pipeline.assert_replica_equals_source(TABLE)

    # Stream: an update, a delete and a re-insert, then a new hostile column.
    sql(f"UPDATE {t} SET {quote('sp ace')} = 'it''s' WHERE {quote(KEY)} = 1")
    sql(f"DELETE FROM {t} WHERE {quote(KEY)} = 2")
    sql(f"INSERT INTO {t} ({cols}) VALUES (2, 'back', 3, '}}{{', NULL)")
    pipeline.wait_caught_up(TABLE)
    pipeline.assert_replica_equals_source(TABLE)

    sql(f"ALTER TABLE {t} ADD COLUMNS ({quote('new `col` é')} STRING)")
    sql(f"INSERT INTO {t} ({cols}, {quote('new `col` é')}) VALUES (3, 'c', 4, 'd', 'e', 'f''g')")
    pipeline.wait_caught_up(TABLE)
    pipeline.assert_replica_equals_source(TABLE)
    replica_columns = tables.read(pipeline.spark, pipeline.replica(TABLE)).columns
    assert replica_columns == [*COLUMNS, "new `col` é"]
