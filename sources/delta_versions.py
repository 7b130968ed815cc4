"""A Delta table read whole or between two versions, for the cycles of triggered and snapshot
replicas (:mod:`lakemirror.sinks.postgres.cycles`): batch reads, no stream, no checkpoint.

Each method is one Spark job (or a read of the log): the latest version from the newest commit
of the history, the row count at a version (Delta answers ``count()`` from the files' statistics
when it has them), the change rows between two versions without their ``update_preimage`` rows
(counted, or brought to the driver as one Arrow table), and the table at a version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from lakemirror import tables
from lakemirror.identifiers import TableName, quote
from lakemirror.sources.catalog import Catalog, TableInfo, enable_change_feed_sql
from lakemirror.sources.contract import CDF_CHANGE_TYPE, CDF_COMMIT_TIMESTAMP, CDF_COMMIT_VERSION, CDF_PREIMAGE
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


class DeltaVersions:
    """One Delta source table, as the cycles read it (:class:`~lakemirror.sinks.postgres.cycles.CycleSource`)."""

    def __init__(self, spark: "SparkSession", catalog: Catalog, name: TableName) -> None:
        self.spark = spark
        self.catalog = catalog
        self.name = name

    def describe(self) -> TableInfo:
        return self.catalog.describe(self.spark, self.name)

    def enable_change_feed(self) -> None:
        run_sql(self.spark, enable_change_feed_sql(self.catalog.locate(self.name)))

    def latest_version(self) -> int:
        loc = self.catalog.locate(self.name)
        return int(tables.history(self.spark, loc, 1).select("version").collect()[0][0])

    def row_count(self, version: int) -> int:
        return int(tables.read(self.spark, self.catalog.locate(self.name), versionAsOf=version).count())

    def _changes(self, after: int, through: int) -> "DataFrame":
        df = tables.read(self.spark, self.catalog.locate(self.name), readChangeFeed="true",
                         startingVersion=str(after + 1), endingVersion=str(through))
        return df.where(f"{quote(CDF_CHANGE_TYPE)} <> '{CDF_PREIMAGE}'")

    def change_count(self, after: int, through: int) -> int:
        """Change rows of the versions ``after + 1`` … ``through`` (inserts, deletes, postimages)."""
        return int(self._changes(after, through).select(quote(CDF_CHANGE_TYPE)).count())

    def changes(self, after: int, through: int, columns: Sequence[str]) -> "pa.Table":
        """Those change rows with ``columns`` and the change-feed columns, on the driver."""
        wanted = (*columns, CDF_CHANGE_TYPE, CDF_COMMIT_VERSION, CDF_COMMIT_TIMESTAMP)
        return self._changes(after, through).select(*[quote(c) for c in wanted]).toArrow()

    def snapshot(self, version: int, columns: Sequence[str]) -> "pa.Table":
        df = tables.read(self.spark, self.catalog.locate(self.name), versionAsOf=version)
        return df.select(*[quote(c) for c in columns]).toArrow()
