"""Checkpoint rows in a Delta table (default ``<audit catalog>.continuous_sync.checkpoints``).

A batch's row is written once per (txn_app_id, batch_id). The runner writes it only after the
batch's MERGE, so when that MERGE was fresh (Delta did not skip it as a replay) no earlier attempt
can have written the row, and it is a plain blind append: one small commit, no read. Only a
replayed batch (a restart after a crash) asks the table whether its row is already there. This
replaced Delta writer transaction ids on every append, which made each append reconstruct the
table's transaction state, a Spark job of its own (``make bench ONLY=apply_cost`` times both kinds
of append).

Rows handed in at the same time by several tables' streams are written together, in one Delta
commit (group commit, :mod:`lakemirror.checkpoints.group_commit`), on the store's own session: a
session no batch ever sets Delta transaction confs on. A checkpoint table on the driver's own file
system (embedded mode), or on S3 (``s3a://``, as ``s3://`` with the storage options of the
session's s3a settings), is appended to by delta-rs instead, with no Spark job: a Spark commit
plans and runs jobs whatever its size, in every table's turn, and on object storage it also reads
the table's log through the store, where delta-rs writes the one commit file
(``scripts/measure-s3-costs.py append`` times both on an S3 server). Reads stay with Spark either
way. The delta-rs appender also compacts the table's one-row files and vacuums what they replaced
(:mod:`lakemirror.checkpoints.table_upkeep`), so that an append costs the same after a week as after
a minute.

A table written before a column was added to :class:`~lakemirror.checkpoints.records.CheckpointRow`
gains it with the first append (schema merge); its older rows read the column as NULL.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Mapping

from lakemirror import tables
from lakemirror.checkpoints.group_commit import GroupCommit
from lakemirror.checkpoints.records import CHECKPOINT_DDL, CheckpointRow
from lakemirror.checkpoints.table_upkeep import Upkeep, UpkeepSchedule, missing_retention
from lakemirror.delta_log.commit_hooks import log_cleanup_enabled
from lakemirror.delta_log.layout import LOG_DIR, has_commits
from lakemirror.delta_log.protocol import delta_rs_can_write
from lakemirror.object_store import delta_rs_storage_options, delta_rs_target, delta_rs_uri, is_s3a
from lakemirror.tables import TableLocation, has_own_jvm, is_local_path, own_session

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def arrow_rows(rows: list[CheckpointRow]) -> "pa.Table":
    """Checkpoint rows as an Arrow table of the checkpoint table's schema."""
    import pyarrow as pa

    # The Arrow type of each Spark type in CHECKPOINT_DDL, as Delta stores them.
    arrow_type = {"STRING": pa.string(), "INT": pa.int32(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(),
                  "BOOLEAN": pa.bool_(), "TIMESTAMP": pa.timestamp("us", tz="UTC")}
    schema = pa.schema([(col, arrow_type[kind]) for col, kind in (c.split() for c in CHECKPOINT_DDL.split(", "))])
    return pa.Table.from_pylist([r.as_dict() for r in rows], schema=schema)


class DeltaCheckpointStore:
    def __init__(self, spark: "SparkSession", location: TableLocation,
                 hadoop_conf: "Mapping[str, str] | None" = None) -> None:
        """``hadoop_conf``: ``fs.s3a.*`` settings for a session without a JVM of its own (Spark
        Connect), with which the daemon reaches an ``s3a://`` table by delta-rs."""
        self.spark = spark
        self.location = location
        self.hadoop_conf = dict(hadoop_conf or {})
        self._writer_session: "SparkSession | None" = None
        self._by_delta_rs: bool | None = None  # decided by the first write, once the table exists
        self._delta_rs: tuple[str, dict[str, str]] | None = None  # delta-rs's URI and storage options
        self._delta_rs_table: Any = None  # delta-rs's handle of the table, kept between appends
        self._group: GroupCommit[CheckpointRow] = GroupCommit(self._write)
        self.upkeep_schedule = UpkeepSchedule()

    def ensure(self) -> None:
        """Create the table if it does not exist (idempotent).

        A table on the driver's own file system is looked for in its log folder and created by
        delta-rs, with no Spark job: a daemon's start waits for this before any table launches, and
        through the JVM it was the first Delta command of the process (8.4 s of a restart's 63 s to
        the first table's launch, 69.6 s of a first start's 132 s, on the loaded 2-core machine;
        ``make bench ONLY=startup``)."""
        if self._ensure_on_driver():
            return
        if tables.exists(self.spark, self.location):
            return
        empty = self.spark.createDataFrame([], CHECKPOINT_DDL)
        try:
            tables.write(empty, self.location, "append")
        except Exception:  # a concurrent creator won the race: fine if the table now exists
            if not tables.exists(self.spark, self.location):
                raise

    def _ensure_on_driver(self) -> bool:
        """Whether the table is on the driver's file system and now exists (found, or created by
        delta-rs); False: Spark is to look (another file system, Spark Connect, no delta-rs)."""
        import importlib.util

        path = self.location.path
        if path is None or not has_own_jvm(self.spark) or not tables.is_local_path(path):
            return False
        folder = tables.local_dir(path)
        assert folder is not None  # a local path
        if has_commits(folder):
            return True
        if (folder / LOG_DIR).exists() or importlib.util.find_spec("deltalake") is None:
            return False  # a log without its first commit or a checkpoint: Spark reads what it holds
        from deltalake import write_deltalake

        try:
            write_deltalake(str(folder), arrow_rows([]), mode="append", configuration=missing_retention({}))
        except Exception:  # a concurrent creator won the race: fine if the table now exists
            if not has_commits(folder):
                raise
        return True

    def append(self, row: CheckpointRow, spark: "SparkSession | None" = None, *, known_new: bool = False) -> None:
        """Append ``row``; idempotent per (txn_app_id, batch_id) for batch rows.

        ``known_new``: the caller knows no earlier attempt wrote this batch's row (its MERGE was
        fresh), so the existence check is skipped. Failure and resync rows are events, recorded
        each time they happen."""
        if row.is_batch and not known_new and self._has_batch(spark or self.spark, row):
            return
        self._group.submit(row)

    def append_rows(self, rows: list[CheckpointRow]) -> None:
        """Append batch rows no earlier attempt wrote, in one commit (with rows other threads hand in
        meanwhile)."""
        if rows:
            self._group.submit_all(rows)

    def last_batch(self, txn_app_id: str) -> int | None:
        if not tables.exists(self.spark, self.location):
            return None
        from pyspark.sql import functions as F

        row = (tables.read(self.spark, self.location)
               .where((F.col("txn_app_id") == F.lit(txn_app_id)) & F.col("error").isNull() & (F.col("batch_id") >= 0))
               .agg(F.max("batch_id").alias("b")).collect()[0])
        return None if row["b"] is None else int(row["b"])

    def _write(self, rows: list[CheckpointRow]) -> None:
        if self._by_delta_rs is None:
            target = self._delta_rs_target()
            self._by_delta_rs = target is not None and delta_rs_can_write(*target)
            self._delta_rs = target if self._by_delta_rs else None
        if self._by_delta_rs:
            from deltalake import PostCommitHookProperties, write_deltalake

            assert self._delta_rs is not None
            uri, storage_options = self._delta_rs  # credentials: never logged
            try:
                write_deltalake(self._appended_table(uri, storage_options), arrow_rows(rows), mode="append",
                                schema_mode="merge",
                                post_commithook_properties=PostCommitHookProperties(cleanup_expired_logs=False))
            except Exception:
                self._delta_rs_table = None  # whatever the handle holds now, the next append loads the table
                raise
            step = self.upkeep_schedule.appended()
            if step is not Upkeep.NONE:
                self._upkeep(uri, storage_options, vacuum=step is Upkeep.COMPACT_AND_VACUUM)
            return
        if self._writer_session is None:
            self._writer_session = own_session(self.spark)
        df = self._writer_session.createDataFrame([tuple(r.as_dict().values()) for r in rows], CHECKPOINT_DDL)
        tables.write(df, self.location, "append", mergeSchema="true")

    def _appended_table(self, uri: str, storage_options: dict[str, str]) -> Any:
        """The table the rows are appended to, loaded once and brought up to date before each append.

        Loading a Delta table reads every commit file since its last checkpoint (up to a hundred
        between delta-rs's checkpoints), on object storage one request each; an append that loaded
        the table afresh each time made the checkpoint table's log most of the daemon's requests to
        the store. Kept, it reads only the commits made since (a listing, and none when it wrote the
        last one itself); delta-rs commits the append after the newest version it finds, so another
        writer's commit meanwhile is retried past, never overwritten."""
        from deltalake import DeltaTable

        table = self._delta_rs_table
        if table is not None:
            try:
                table.update_incremental()
                return table
            except Exception:  # noqa: BLE001 (its log was cleaned up past the kept version: load it afresh)
                pass
        table = self._delta_rs_table = DeltaTable(uri, storage_options=storage_options or None)
        return table

    def _upkeep(self, uri: str, storage_options: dict[str, str], *, vacuum: bool) -> None:
        """Compact the table's small files, delete its expired commit files (and, with ``vacuum``,
        the data files no version within the retention reads). A failure is logged and tried again
        an interval later: the rows are written whatever happens here."""
        from deltalake import DeltaTable

        started = time.monotonic()
        try:
            table = DeltaTable(uri, storage_options=storage_options or None)
            configuration = dict(table.metadata().configuration)
            missing = missing_retention(configuration)
            if missing:
                table.alter.set_table_properties(missing)
            compacted = table.optimize.compact()
            if log_cleanup_enabled(configuration):
                table.cleanup_metadata()
            deleted = table.vacuum(dry_run=False, full=True) if vacuum else []
        except Exception as exc:  # noqa: BLE001 (upkeep only: the appends go on)
            log.warning("checkpoint table %s: compaction failed (tried again after %d more appends): %s",
                        self.location.name, self.upkeep_schedule.compact_every, exc)
            return
        log.debug("checkpoint table %s: %s files compacted into %s, %d deleted, in %.2fs", self.location.name,
                  compacted.get("numFilesRemoved"), compacted.get("numFilesAdded"), len(deleted),
                  time.monotonic() - started)

    def _delta_rs_target(self) -> tuple[str, dict[str, str]] | None:
        """How delta-rs reaches the table, or None (Spark appends). Over Spark Connect the daemon is
        still the table's only writer (batch functions on the server write outcome files, not rows),
        so delta-rs appends where the daemon reaches the files: a path on the volume it shares with
        the server, or S3 with the s3a settings it was given."""
        path = self.location.path
        if path is None:
            return None
        if has_own_jvm(self.spark):
            return delta_rs_target(self.spark, path)
        if is_local_path(path):
            return path, {}
        if is_s3a(path) and self.hadoop_conf:
            return delta_rs_uri(path), delta_rs_storage_options(self.hadoop_conf)
        return None

    def _has_batch(self, session: "SparkSession", row: CheckpointRow) -> bool:
        from pyspark.sql import functions as F

        df = tables.read(session, self.location)
        found = (df.where((F.col("txn_app_id") == F.lit(row.txn_app_id)) & (F.col("batch_id") == F.lit(row.batch_id))
                          & F.col("error").isNull())
                 .limit(1).collect())
        return bool(found)

    def latest(self, pipeline_id: str) -> dict[str, CheckpointRow]:
        if not tables.exists(self.spark, self.location):
            return {}
        from pyspark.sql import functions as F

        df = tables.read(self.spark, self.location)
        picked = (df.where(F.col("pipeline_id") == F.lit(pipeline_id))
                  .groupBy("source_fqn")
                  .agg(F.max_by(F.struct(*df.columns), F.struct("ended_at", "batch_id")).alias("r"))
                  .select("r.*").collect())
        return {r["source_fqn"]: CheckpointRow(**r.asDict()) for r in picked}
