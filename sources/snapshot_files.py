"""The data files of a Delta table at a version, and the rows of a group of them (a bootstrap chunk).

Delta's file index cannot be narrowed to some files from the DataFrame API (a filter on
``_metadata.file_path`` is applied after the scan: every file is still read), so a chunk's rows are
read through Delta's own ``DeltaLog.createDataFrame(snapshot, files)``, the call Delta's commands
use to read a subset of a snapshot. It honours what a plain Parquet read would not: partition
values, column mapping, deletion vectors. It needs a session with its own JVM (local Spark, a
Databricks job); :func:`files_at` answers None elsewhere (Spark Connect), and the table is then
copied in one chunk, as a plain snapshot read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from lakemirror.sources.chunks import SourceFile
from lakemirror.tables import TableLocation, has_own_jvm

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def _table_path(spark: "SparkSession", loc: TableLocation) -> str:
    if loc.path is not None:
        return loc.path
    return str(spark.sql(f"DESCRIBE DETAIL {loc.sql}").collect()[0]["location"])


def _snapshot(spark: "SparkSession", loc: TableLocation, version: int) -> tuple[Any, Any]:
    jvm = spark._jvm  # type: ignore[attr-defined]
    none = jvm.scala.Option.empty()
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession,  # type: ignore[attr-defined]
                                                           _table_path(spark, loc))
    return log, log.getSnapshotAt(version, none, none, False)


def files_at(spark: "SparkSession", loc: TableLocation, version: int) -> list[SourceFile] | None:
    """Every data file of the table at ``version`` with its size and row count; None where the
    session cannot read a subset of files (no JVM of its own)."""
    if not has_own_jvm(spark):
        return None
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    _, snapshot = _snapshot(spark, loc, version)
    rows = (DataFrame(snapshot.allFiles().toDF(), spark)
            .select("path", "size", F.get_json_object("stats", "$.numRecords").cast("long").alias("rows"))
            .collect())
    return [SourceFile(str(r["path"]), int(r["size"]), None if r["rows"] is None else int(r["rows"])) for r in rows]


def read_files(spark: "SparkSession", loc: TableLocation, version: int, paths: Sequence[str]) -> "DataFrame":
    """The rows of the files ``paths`` (as the log names them) of the table at ``version``."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    log, snapshot = _snapshot(spark, loc, version)
    jvm = spark._jvm  # type: ignore[attr-defined]
    adds = snapshot.allFiles().where(F.col("path").isin(list(paths))._jc).collectAsList()
    if adds.size() != len(set(paths)):
        raise FileNotFoundError(f"{loc}: {len(set(paths)) - adds.size()} of the chunk's files are no longer in "
                                f"version {version} of the table's log")
    files = jvm.scala.jdk.javaapi.CollectionConverters.asScala(adds).toList()
    return DataFrame(log.createDataFrame(snapshot, files, False, jvm.scala.Option.empty()), spark)
