"""Writing a replica from a source snapshot (the bootstrap's copy step) and replica DDL.

The snapshot write replaces the replica atomically (one Delta commit with ``overwriteSchema``),
so a bootstrap killed half-way is simply redone at the same pinned version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from lakemirror import tables
from lakemirror.identifiers import sql_string
from lakemirror.schema import Column, columns_from_struct
from lakemirror.sinks.apply_choice import ReplicaFacts
from lakemirror.sinks.planner import add_columns_sql
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Table properties lakemirror sets on every replica it creates.
PIPELINE_PROPERTY = "lakemirror.pipelineId"
SOURCE_PROPERTY = "lakemirror.source"
EPOCH_PROPERTY = "lakemirror.epoch"
BOOTSTRAP_VERSION_PROPERTY = "lakemirror.bootstrapVersion"
#: The Delta table feature that lets column names hold characters Parquet cannot (spaces, commas…).
COLUMN_MAPPING_PROPERTY = "delta.columnMapping.mode"


def creation_options(source_properties: Mapping[str, str]) -> dict[str, str]:
    """Writer options for a replica of a source with these properties.

    A source with column mapping may have column names Parquet cannot hold (``' ,;{}()\\n\\t='``),
    now or after a later ADD COLUMNS, so its replica is created with column mapping too (by name:
    physical names are the replica's own business)."""
    mode = (source_properties.get(COLUMN_MAPPING_PROPERTY) or "none").lower()
    return {COLUMN_MAPPING_PROPERTY: "name"} if mode in ("name", "id") else {}


def write_snapshot(snapshot: "DataFrame", target: TableLocation, columns: Sequence[Column],
                   properties: Mapping[str, str], source_properties: Mapping[str, str] | None = None) -> None:
    """Replace ``target`` with ``snapshot``'s ``columns``, then stamp the replica's properties."""
    projected = snapshot.select(*[f"`{c.name.replace('`', '``')}`" for c in columns])
    tables.write(projected, target, "overwrite", overwriteSchema="true", **creation_options(source_properties or {}))
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


def replica_facts(spark: "SparkSession", target: TableLocation) -> ReplicaFacts:
    """What choosing how batches reach a replica needs to know of it (one DESCRIBE DETAIL and a
    row count, which Delta answers from file statistics)."""
    import importlib.util

    detail = spark.sql(f"DESCRIBE DETAIL {target.sql}").collect()[0].asDict()
    replica = tables.read(spark, target)
    features = detail.get("tableFeatures")
    return ReplicaFacts(size_bytes=int(detail["sizeInBytes"] or 0), rows=replica.count(),
                        columns=tuple(replica.columns), properties=dict(detail["properties"] or {}),
                        observable=hasattr(spark, "_jsparkSession"),  # classic PySpark, not Spark Connect
                        local=target.path is not None and tables.is_local_table(str(detail.get("location") or "")),
                        features=tuple(features) if features is not None else None,
                        driver_engine=importlib.util.find_spec("deltalake") is not None)


def add_columns(spark: "SparkSession", target: TableLocation, added: Sequence[Column]) -> None:
    spark.sql(add_columns_sql(target.sql, added))

