"""A Delta table's Change Data Feed as a :class:`~lakemirror.sources.contract.ChangeSource`, read by Spark.

Thin: each method is one call into :mod:`lakemirror.sources.change_feed`,
:mod:`lakemirror.sources.catalog` or :mod:`lakemirror.delta_log.commit_times`; this class only binds
the session, the catalog and the table's name. Positions are commit versions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from lakemirror.delta_log.commit_times import CommitLog, commit_log_for
from lakemirror.identifiers import TableName
from lakemirror.sources import change_feed
from lakemirror.sources.catalog import Catalog, TableInfo, enable_change_feed_sql, table_id
from lakemirror.sources.change_feed import SourceHead
from lakemirror.sql_exec import run_sql
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class DeltaChangeFeed:
    """The change feed of one Delta table, in ``spark``'s session.

    ``kernel``: stream through Delta's Kernel-based source where it can
    (:func:`~lakemirror.sources.change_feed.kernel_stream`); a batch function then calls
    :meth:`leave_kernel_mode` on the batch's session before it touches any table.
    """

    def __init__(self, spark: "SparkSession", catalog: Catalog, name: TableName, *, kernel: bool = False) -> None:
        self.spark = spark
        self.catalog = catalog
        self.name = name
        self.kernel = kernel

    @property
    def location(self) -> TableLocation:
        return self.catalog.locate(self.name)

    def describe(self) -> TableInfo:
        return self.catalog.describe(self.spark, self.name)

    def enable_change_feed(self) -> None:
        run_sql(self.spark, enable_change_feed_sql(self.location))

    def head(self, since_version: int, window: int = 32) -> SourceHead:
        return change_feed.source_head(self.spark, self.location, since_version, window=window)

    def snapshot(self, version: int) -> "DataFrame":
        return change_feed.snapshot(self.spark, self.location, version)

    def changes(self, after_version: int, options: Mapping[str, Any] | None = None) -> "DataFrame":
        return change_feed.change_stream(self.spark, self.location, after_version, options, kernel=self.kernel)

    def identity(self, batch: "DataFrame") -> str | None:
        """The table id, read in the batch's own session (the one its files were planned in)."""
        return table_id(batch.sparkSession, self.location)

    def commit_log(self) -> CommitLog | None:
        return commit_log_for(self.spark, self.location)

    def leave_kernel_mode(self, batch: "DataFrame") -> None:
        if self.kernel:
            change_feed.leave_kernel_mode(batch.sparkSession)
