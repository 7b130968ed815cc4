"""Reading a bootstrap chunk: one interface, two implementations, chosen by one pure function.

- :class:`KeyRangeReads` (the default; public API only): a chunk is a range of the first key
  column (:mod:`lakemirror.sources.key_ranges`), read as ``VERSION AS OF`` a version with the range
  as a filter. Delta's data skipping prunes the scan to the files whose min/max statistics overlap
  the range (a filter on ``_metadata.file_path`` would not: Delta 4.4 still reads every file for it).
  The plan costs one aggregate over the key column at the version it is made at (each file's
  smallest and largest key); the ranges cover the whole key domain, so they hold at any version.
  Works on any session, Spark Connect included.
- :class:`DeltaLogFileReads` (opt-in, ``bootstrap.internal_file_reads``): a chunk is a group of the
  source's data files, read through Delta's INTERNAL ``DeltaLog.createDataFrame(snapshot, files)``
  over py4j. No planning scan (the file list comes from the log), any key type and any file layout
  splits, but it is Delta's internal API (it may change in any release) and needs a session with its
  own JVM: over Spark Connect it is never taken.

:func:`choose_chunk_reads` says which a bootstrap takes, and why; both honour partition values,
column mapping and deletion vectors, since both read through Delta.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from lakemirror import tables
from lakemirror.sources.chunks import Chunk, SourceFile, plan_chunks
from lakemirror.sources.key_ranges import FileKeys, KeyRange, plan_key_ranges, range_type
from lakemirror.tables import TableLocation
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KEY_RANGES, DELTA_LOG_FILES = "key_ranges", "delta_log_files"


@dataclass(frozen=True)
class ReadChoice:
    kind: str      # KEY_RANGES or DELTA_LOG_FILES
    reason: str    # shown in the bootstrap's log line


def choose_chunk_reads(*, internal_file_reads: bool, own_jvm: bool) -> ReadChoice:
    """How a bootstrap reads its chunks: Delta's internal file reads only when configured AND the
    session has a JVM of its own; the public key-range reads otherwise."""
    if internal_file_reads and own_jvm:
        return ReadChoice(DELTA_LOG_FILES, "bootstrap.internal_file_reads is on: chunks are groups of files read "
                                           "through Delta's internal DeltaLog.createDataFrame")
    if internal_file_reads:
        return ReadChoice(KEY_RANGES, "bootstrap.internal_file_reads is on, but the session has no JVM of its own "
                                      "(Spark Connect): chunks are key ranges read through the public API")
    return ReadChoice(KEY_RANGES, "chunks are key ranges read as VERSION AS OF with a range filter (public API; "
                                  "Delta's data skipping prunes the files)")


class ChunkReads(Protocol):
    """Plans a snapshot's chunks and reads one; a chunk of one kind is read only by its own kind."""

    def plan(self, target_bytes: int) -> tuple[Chunk, ...]:
        """The chunks of the snapshot at the reads' version (one whole-table chunk when it fits
        ``target_bytes``)."""
        ...

    def read(self, chunk: Chunk, version: int | None = None) -> "DataFrame":
        """The rows of ``chunk`` at V, or, for a key range or the whole table, at ``version`` (the
        bootstrap reads those at the source's latest version; a group of files is V's alone)."""
        ...


def _table_path(spark: "SparkSession", loc: TableLocation) -> str:
    if loc.path is not None:
        return loc.path
    return str(run_sql(spark, f"DESCRIBE DETAIL {loc.sql}").collect()[0]["location"])


def _size_now(spark: "SparkSession", loc: TableLocation) -> int:
    """The table's bytes at its latest version (``DESCRIBE DETAIL``): only decides whether planning
    is worth a scan; the plan itself is made at the reads' version."""
    return int(run_sql(spark, f"DESCRIBE DETAIL {loc.sql}").collect()[0]["sizeInBytes"] or 0)


WHOLE = Chunk(0, (), 0, None)


class KeyRangeReads:
    """Chunks as key ranges, through the public API (see the module docstring)."""

    def __init__(self, spark: "SparkSession", loc: TableLocation, version: int, keys: Sequence[str]) -> None:
        self.spark, self.loc, self.version, self.keys = spark, loc, version, tuple(keys)
        #: Why the last plan is one chunk although the table is larger than the target (None: it is not).
        self.note: str | None = None

    def snapshot(self, version: int | None = None) -> "DataFrame":
        return tables.read(self.spark, self.loc, versionAsOf=self.version if version is None else version)

    def file_keys(self, column: str) -> list[FileKeys]:
        """Each file's size, live rows and key range at the reads' version: one aggregate over the
        key column."""
        from pyspark.sql import functions as F

        key = F.col(column)
        rows = (self.snapshot().groupBy(F.col("_metadata.file_path").alias("path"))
                .agg(F.max(F.col("_metadata.file_size")).alias("size"), F.count(F.lit(1)).alias("rows"),
                     F.min(key).alias("low"), F.max(key).alias("high")).collect())
        return [FileKeys(str(r["path"]), int(r["size"]), int(r["rows"]), r["low"], r["high"]) for r in rows]

    def plan(self, target_bytes: int) -> tuple[Chunk, ...]:
        self.note = None
        if not self.keys or _size_now(self.spark, self.loc) <= target_bytes:
            return (WHOLE,)
        column = self.keys[0]
        sql_type = self.snapshot().schema[column].dataType.simpleString()
        if not range_type(sql_type):
            self.note = (f"its first key column {column} is of type {sql_type}, which a key range cannot bound "
                         f"exactly: copied as one chunk (bootstrap.internal_file_reads splits it by files)")
            return (WHOLE,)
        ranges = plan_key_ranges(self.file_keys(column), target_bytes, column, sql_type)
        if len(ranges) == 1:
            self.note = ("its files' key ranges all overlap, so no key range prunes a file: copied as one chunk "
                         "(bootstrap.internal_file_reads splits it by files)")
        return tuple(Chunk(n, (), size, rows, key_range) for n, (key_range, size, rows) in enumerate(ranges))

    def read(self, chunk: Chunk, version: int | None = None) -> "DataFrame":
        if chunk.paths:
            raise ValueError(f"{self.loc}: chunk {chunk.number} is a group of files (planned with "
                             f"bootstrap.internal_file_reads); resync the table or turn that option back on")
        predicate = chunk.key_range.predicate() if chunk.key_range is not None else None
        df = self.snapshot(version)
        return df if predicate is None else df.where(predicate)


class DeltaLogFileReads:
    """Chunks as groups of files, through Delta's internal API (see the module docstring). The
    files at V are listed once and kept as Delta's own ``AddFile`` objects."""

    def __init__(self, spark: "SparkSession", loc: TableLocation, version: int) -> None:
        self.spark, self.loc, self.version = spark, loc, version
        jvm = spark._jvm
        assert jvm is not None, "chosen only for a session with a JVM of its own (choose_chunk_reads)"
        self._jvm = jvm
        none = jvm.scala.Option.empty()
        self._log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, _table_path(spark, loc))
        self._snapshot = self._log.getSnapshotAt(version, none, none, False)
        self._listed: dict[str, Any] | None = None
        self.note: str | None = None

    @property
    def _adds(self) -> dict[str, Any]:
        if self._listed is None:
            self._listed = {str(add.path()): add for add in self._snapshot.allFiles().collectAsList()}
        return self._listed

    def files(self) -> list[SourceFile]:
        out = []
        for path, add in self._adds.items():
            stats = add.stats()
            rows = json.loads(stats).get("numRecords") if stats else None
            out.append(SourceFile(path, int(add.size()), None if rows is None else int(rows)))
        return out

    def plan(self, target_bytes: int) -> tuple[Chunk, ...]:
        # the version's size from its checksum file when its writer left one: then without listing
        if int(self._snapshot.sizeInBytes()) <= target_bytes:
            return (WHOLE,)
        return plan_chunks(self.files(), target_bytes)

    def read(self, chunk: Chunk, version: int | None = None) -> "DataFrame":
        from pyspark.sql import DataFrame

        if chunk.key_range is not None:
            return KeyRangeReads(self.spark, self.loc, self.version, (chunk.key_range.column,)).read(chunk, version)
        if chunk.whole_table:
            return tables.read(self.spark, self.loc, versionAsOf=self.version if version is None else version)
        missing = [p for p in chunk.paths if p not in self._adds]
        if missing:
            raise FileNotFoundError(f"{self.loc}: {len(missing)} of the chunk's files are not in version "
                                    f"{self.version} of the table's log (first: {missing[0]})")
        jvm = self._jvm
        chosen = jvm.java.util.ArrayList()
        for p in chunk.paths:
            chosen.add(self._adds[p])
        files = jvm.scala.jdk.javaapi.CollectionConverters.asScala(chosen).toList()
        return DataFrame(self._log.createDataFrame(self._snapshot, files, False, jvm.scala.Option.empty()), self.spark)


def chunk_reads(spark: "SparkSession", loc: TableLocation, version: int, keys: Sequence[str],
                choice: ReadChoice) -> ChunkReads:
    """The reads ``choice`` names, for the source ``loc`` at ``version``."""
    if choice.kind == DELTA_LOG_FILES:
        return DeltaLogFileReads(spark, loc, version)
    return KeyRangeReads(spark, loc, version, keys)
