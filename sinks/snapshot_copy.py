"""Writing a replica from a source snapshot (the bootstrap's copy step) and replica DDL.

The snapshot write replaces the replica atomically (one Delta commit with ``overwriteSchema``),
so a bootstrap killed half-way is simply redone at the same pinned version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from lakemirror import tables
from lakemirror.identifiers import sql_string
from lakemirror.schema import Column, columns_from_struct
from lakemirror.sinks.planner import add_columns_sql
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Table properties lakemirror sets on every replica it creates.
PIPELINE_PROPERTY = "lakemirror.pipelineId"
SOURCE_PROPERTY = "lakemirror.source"
EPOCH_PROPERTY = "lakemirror.epoch"
BOOTSTRAP_VERSION_PROPERTY = "lakemirror.bootstrapVersion"


def write_snapshot(snapshot: "DataFrame", target: TableLocation, columns: Sequence[Column],
                   properties: Mapping[str, str]) -> None:
    """Replace ``target`` with ``snapshot``'s ``columns``, then stamp the replica's properties."""
    projected = snapshot.select(*[f"`{c.name.replace('`', '``')}`" for c in columns])
    tables.write(projected, target, "overwrite", overwriteSchema="true")
    set_properties(snapshot.sparkSession, target, properties)


def set_properties(spark: "SparkSession", target: TableLocation, properties: Mapping[str, str]) -> None:
    if not properties:
        return
    pairs = ", ".join(f"{sql_string(k)} = {sql_string(v)}" for k, v in sorted(properties.items()))
    spark.sql(f"ALTER TABLE {target.sql} SET TBLPROPERTIES ({pairs})")


def replica_columns(spark: "SparkSession", target: TableLocation) -> tuple[Column, ...]:
    return columns_from_struct(tables.read(spark, target).schema)


def replica_properties(spark: "SparkSession", target: TableLocation) -> dict[str, str]:
    row = spark.sql(f"DESCRIBE DETAIL {target.sql}").collect()[0]
    return dict(row["properties"] or {})


def add_columns(spark: "SparkSession", target: TableLocation, added: Sequence[Column]) -> None:
    spark.sql(add_columns_sql(target.sql, added))

