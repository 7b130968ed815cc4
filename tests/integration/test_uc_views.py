"""Views replicated on Spark's own catalog: definitions rewritten to the target schema's names (qualified
and schema-qualified references; literals and comments untouched), created in dependency order, with
their comments; a view that cannot be created is reported, so is its dependent, and the others are
created; a second run replaces them in place."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from lakemirror.daemon.context import ReplicateContext
from lakemirror.daemon.settings.replicate import load_replicate_config

pytestmark = pytest.mark.integration


def describe(spark: Any, view: str) -> dict[str, str]:
    return {r["col_name"].strip(): r["data_type"] for r in spark.sql(f"DESCRIBE TABLE EXTENDED {view}").collect()}


def test_views_follow_their_tables_to_the_target_schema(spark: Any, tmp_path: Path) -> None:
    for db in ("lm_src_sales", "lm_dr_sales"):
        spark.sql(f"DROP DATABASE IF EXISTS {db} CASCADE")
        spark.sql(f"CREATE DATABASE {db} LOCATION '{tmp_path / db}'")
    for db, rows in (("lm_src_sales", "(1, 10), (2, 20)"), ("lm_dr_sales", "(1, 100), (2, 200), (3, 300)")):
        spark.sql(f"CREATE TABLE {db}.orders (id INT, total INT) USING parquet")
        spark.sql(f"INSERT INTO {db}.orders VALUES {rows}")
    spark.sql("CREATE TABLE lm_src_sales.refunds (id INT) USING parquet")  # not in the target
    spark.sql("CREATE VIEW lm_src_sales.big_orders COMMENT 'orders over 15' AS "
              "SELECT /* read from lm_src_sales.orders */ id, total, 'lm_src_sales.orders' AS origin "
              "FROM spark_catalog.lm_src_sales.orders WHERE total > 15")
    spark.sql("CREATE VIEW lm_src_sales.big_count AS SELECT count(*) AS n FROM lm_src_sales.big_orders")
    spark.sql("USE lm_src_sales")  # bare names: read in the view's own schema
    try:
        spark.sql("CREATE VIEW lm_src_sales.summary AS SELECT b.n, o.total FROM big_count b "
                  "CROSS JOIN (SELECT sum(total) AS total FROM orders) o")
    finally:
        spark.sql("USE default")
    spark.sql("CREATE VIEW lm_src_sales.broken AS SELECT * FROM lm_src_sales.refunds")
    spark.sql("CREATE VIEW lm_src_sales.on_broken AS SELECT * FROM lm_src_sales.broken")
    config = load_replicate_config(None, data={
        "runtime": {"mode": "local", "warehouse": str(tmp_path / "lakehouse")},
        "retry": {"max_attempts": 1}, "operations": ["uc_objects"], "uc_objects": {"object_types": ["view"]},
        "catalogs": [{"name": "spark_catalog", "target_catalog": "spark_catalog", "include_schemas": ["lm_src_sales"],
                      "schemas": [{"name": "lm_src_sales", "target_schema": "lm_dr_sales"}]}]})
    for run in (1, 2):
        context = ReplicateContext(config, out=io.StringIO()).replace(spark=spark)
        summary = context.run()
        assert sorted(o.job.source.table for o in summary.failed) == ["broken", "on_broken"], run
        on_broken = next(o for o in summary.failed if o.job.source.table == "on_broken")
        assert "broken" in str(on_broken.error)
        assert sorted(tuple(r) for r in spark.sql("SELECT * FROM lm_dr_sales.big_orders").collect()) == [
            (1, 100, "lm_src_sales.orders"), (2, 200, "lm_src_sales.orders"), (3, 300, "lm_src_sales.orders")]
        assert spark.sql("SELECT * FROM lm_dr_sales.summary").collect()[0].asDict() == {"n": 3, "total": 600}
    info = describe(spark, "lm_dr_sales.big_orders")
    assert info["Comment"] == "orders over 15"
    assert "spark_catalog.lm_dr_sales.orders" in info["View Text"] and "'lm_src_sales.orders'" in info["View Text"]
    assert "/* read from lm_src_sales.orders */" in info["View Text"]
    assert "lm_dr_sales.big_orders" in describe(spark, "lm_dr_sales.big_count")["View Text"]
    levels = {o.job.source.table: o.details.get("level") for o in summary.outcomes if o.status == "success"}
    assert levels == {"big_orders": 0, "big_count": 1, "summary": 2}
