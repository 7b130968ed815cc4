"""The data files of a Delta table at a version, and the rows of a group of them (a bootstrap chunk).

Delta's file index cannot be narrowed to some files from the DataFrame API (a filter on
``_metadata.file_path`` is applied after the scan: every file is still read), so a chunk's rows are
read through Delta's own ``DeltaLog.createDataFrame(snapshot, files)``, the call Delta's commands
use to read a subset of a snapshot. It honours what a plain Parquet read would not: partition
values, column mapping, deletion vectors. It needs a session with its own JVM (local Spark, a
Databricks job); :func:`snapshot_files` answers None elsewhere (Spark Connect), and the table is then
copied in one chunk, as a plain snapshot read.
"""

from __future__ import annotations

import json
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


class SnapshotFiles:
    """The data files of the table at ``version``, listed once (one pass over the snapshot's state)
    and kept as Delta's own ``AddFile`` objects, so reading a chunk costs no further listing."""

    def __init__(self, spark: "SparkSession", loc: TableLocation, version: int) -> None:
        self.spark, self.loc, self.version = spark, loc, version
        self._log, self._snapshot = _snapshot(spark, loc, version)
        self._listed: dict[str, Any] | None = None

    @property
    def _adds(self) -> dict[str, Any]:
        if self._listed is None:
            self._listed = {str(add.path()): add for add in self._snapshot.allFiles().collectAsList()}
        return self._listed

    def size_bytes(self) -> int:
        """The bytes of the table's data files at the version (from the version's checksum file
        when its writer left one: then without listing the files)."""
        return int(self._snapshot.sizeInBytes())

    def files(self) -> list[SourceFile]:
        out = []
        for path, add in self._adds.items():
            stats = add.stats()
            rows = json.loads(stats).get("numRecords") if stats else None
            out.append(SourceFile(path, int(add.size()), None if rows is None else int(rows)))
        return out

    def read(self, paths: Sequence[str]) -> "DataFrame":
        """The rows of the files ``paths`` (as the log names them)."""
        from pyspark.sql import DataFrame

        missing = [p for p in paths if p not in self._adds]
        if missing:
            raise FileNotFoundError(f"{self.loc}: {len(missing)} of the chunk's files are not in version "
                                    f"{self.version} of the table's log (first: {missing[0]})")
        jvm = self.spark._jvm  # type: ignore[attr-defined]
        chosen = jvm.java.util.ArrayList()
        for p in paths:
            chosen.add(self._adds[p])
        files = jvm.scala.jdk.javaapi.CollectionConverters.asScala(chosen).toList()
        return DataFrame(self._log.createDataFrame(self._snapshot, files, False, jvm.scala.Option.empty()), self.spark)


def snapshot_files(spark: "SparkSession", loc: TableLocation, version: int) -> SnapshotFiles | None:
    """The table's files at ``version``; None where the session cannot read a subset of files (no
    JVM of its own: Spark Connect)."""
    return SnapshotFiles(spark, loc, version) if has_own_jvm(spark) else None
