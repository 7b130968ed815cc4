"""Sources written by Spark, as production sources are: the production workload's writer mode ``spark``.

The same changes as the delta-rs writer (:class:`bench.workload.SourceTable` draws them), committed
by Delta's own writer in a Spark session of the benchmark's process: the table created by a
DataFrame write with the change feed on, each change a ``DeltaTable.merge``. Such a table carries
what Spark's and Databricks' writers leave in its log and delta-rs does not: a ``.crc`` file beside
each commit (the table's size, file count, protocol and metadata, read back by Delta's readers
instead of replaying the log), a checkpoint every 10 commits (Delta's default
``delta.checkpointInterval``: no table property needed), Spark's ``commitInfo``. Deletion vectors
stay off, Delta's default outside Databricks.

The writer's session is tuned for the writer's own speed (2 shuffle partitions, Delta's snapshots in
2 partitions, the UI off): it sets the workload's commit rate and is not what is measured. A Spark
MERGE takes far longer than delta-rs's, so the writer commits less often than once a second per
table; each run reports the commits it made.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from bench.workload import CDF, SourceTable

WRITERS = ("delta-rs", "spark")


def spark_writer_session(spark_conf: dict[str, str]) -> Any:
    """The writer's session (``local[2]``, Delta and the store's s3a settings)."""
    from lakemirror.daemon.settings import RuntimeSettings
    from lakemirror.daemon.spark import local_session

    warehouse = tempfile.mkdtemp(prefix="bench-writer-")
    return local_session(RuntimeSettings(master="local[2]", shuffle_partitions=2, driver_memory="1g",
                                         warehouse=warehouse, spark_conf=spark_conf),
                         app_name="lakemirror-bench-writer", s3a=True)


@dataclass
class SparkSourceTable(SourceTable):
    """A source table written by Delta's Spark writer; delta-rs still reads its version and rows.

    ``spark_path``: the table's location as Spark names it (``s3a://…``); ``path`` stays the one
    delta-rs reads (``s3://…``)."""

    spark: Any = None
    spark_path: str = ""

    def create(self) -> None:
        view = f"bench_initial_{abs(hash(self.spark_path))}"
        self.spark.createDataFrame(self.initial_rows()).createOrReplaceTempView(view)
        properties = ", ".join(f"'{k}' = '{v}'" for k, v in {**CDF, **self.properties}.items())
        self.spark.sql(f"CREATE TABLE delta.`{self.spark_path}` USING delta TBLPROPERTIES ({properties}) "
                       f"AS SELECT * FROM {view}")
        self.spark.catalog.dropTempView(view)
        self.next_id = self.rows
        self.live = list(range(self.rows))

    def merge(self, source: pa.Table) -> None:
        from delta.tables import DeltaTable

        changes = self.spark.createDataFrame(source)
        (DeltaTable.forPath(self.spark, self.spark_path).alias("t").merge(changes.alias("s"), "t.id = s.id")
         .whenMatchedDelete(condition="s.op = 'd'")
         .whenMatchedUpdate(condition="s.op = 'u'", set={"v": "s.v", "payload": "s.payload"})
         .whenNotMatchedInsert(condition="s.op = 'i'", values={"id": "s.id", "v": "s.v", "payload": "s.payload"})
         .execute())
