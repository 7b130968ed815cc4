"""A path-based table's id read from Delta's log agrees with DESCRIBE DETAIL, also after the
table is dropped and recreated under the same path (the check that keeps a replica from
following a different table)."""

from __future__ import annotations

import shutil

import pytest

from lakemirror.identifiers import TableName

pytestmark = pytest.mark.integration


def test_the_logged_table_id_follows_a_table_recreated_under_its_path(spark, tmp_path):
    from lakemirror.sources import catalog
    from lakemirror.tables import TableLocation

    loc = TableLocation(TableName("src", "s", "ident"), str(tmp_path / "ident"))

    def described() -> str:
        return spark.sql(f"DESCRIBE DETAIL {loc.sql}").collect()[0]["id"]

    spark.sql(f"CREATE TABLE {loc.sql} (id BIGINT) USING DELTA")
    spark.sql(f"INSERT INTO {loc.sql} VALUES (1)")
    first = catalog._logged_table_id(spark, loc.path)
    assert first is not None and first == described() == catalog.table_id(spark, loc)

    shutil.rmtree(loc.path)
    assert catalog._logged_table_id(spark, loc.path) is None, "no table there: DESCRIBE DETAIL names the problem"
    with pytest.raises(Exception):
        catalog.table_id(spark, loc)

    spark.sql(f"CREATE TABLE {loc.sql} (id BIGINT) USING DELTA")  # version 0, behind the old table's 1
    second = catalog.table_id(spark, loc)
    assert second != first and second == described()
    for i in range(3):  # and past the old table's versions
        spark.sql(f"INSERT INTO {loc.sql} VALUES ({i})")
    assert catalog.table_id(spark, loc) == second == described()


def test_a_table_known_by_name_is_described(spark, tmp_path):
    from lakemirror.sources import catalog
    from lakemirror.tables import TableLocation

    spark.sql(f"CREATE TABLE ident_by_name (id BIGINT) USING DELTA LOCATION '{tmp_path / 'named'}'")
    try:
        loc = TableLocation(TableName("spark_catalog", "default", "ident_by_name"))
        assert catalog.table_id(spark, loc) == spark.sql("DESCRIBE DETAIL ident_by_name").collect()[0]["id"]
    finally:
        spark.sql("DROP TABLE ident_by_name")
