"""Checkpoint rows in a Delta table (default ``<audit catalog>.continuous_sync.checkpoints``).

Each append is a blind append carrying the batch's transaction id (``txnAppId`` /
``txnVersion`` writer options), so a replayed micro-batch never writes its row twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakemirror import tables
from lakemirror.checkpoints.records import CHECKPOINT_DDL, CheckpointRow
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class DeltaCheckpointStore:
    def __init__(self, spark: "SparkSession", location: TableLocation) -> None:
        self.spark = spark
        self.location = location

    def ensure(self) -> None:
        """Create the table if it does not exist (idempotent)."""
        if tables.exists(self.spark, self.location):
            return
        empty = self.spark.createDataFrame([], CHECKPOINT_DDL)
        try:
            tables.write(empty, self.location, "append")
        except Exception:  # a concurrent creator won the race: fine if the table now exists
            if not tables.exists(self.spark, self.location):
                raise

    def append(self, row: CheckpointRow, spark: "SparkSession | None" = None) -> None:
        session = spark or self.spark
        df = session.createDataFrame([tuple(row.as_dict().values())], CHECKPOINT_DDL)
        if row.is_batch:
            # A replayed batch must not add its row twice: the append is idempotent per batch.
            tables.write(df, self.location, "append",
                         txnAppId=f"{row.txn_app_id}/checkpoints", txnVersion=row.batch_id)
        else:  # failures and resyncs are events, recorded each time they happen
            tables.write(df, self.location, "append")

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
