"""A table's batches under Spark Connect: started on the server, reported from the checkpoint table.

Over Spark Connect the batch function runs in a Python worker on the server
(:func:`lakemirror.sinks.merge.connect_apply.apply_batch`), so it cannot hand its outcome to the runner
in this process. It appends the batch's checkpoint row instead, and the runner reads the rows of
its transaction app id that it has not seen yet (:class:`ConnectBatches`) after each turn, or
whenever an always-on query reports a new trigger: each becomes the same outcome a local batch
reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakemirror.sinks.merge.connect_apply import ConnectBatchJob
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import BatchStats, MergeOutcome
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakemirror.sinks.merge.planner import MergePlan
    from lakemirror.tables import TableLocation


def batch_job(*, target: "TableLocation", plan: "MergePlan", app_id: str, epoch: int, pipeline_id: str,
              source_fqn: str, dest_fqn: str, checkpoint_table: "TableLocation | None") -> ConnectBatchJob:
    """The server-side batch function's job; the checkpoint table must be a Delta table of the store."""
    if checkpoint_table is None:
        raise ValueError("runtime.mode connect needs the Delta checkpoint table (its batch function writes the rows)")
    return ConnectBatchJob(target_sql=target.sql, plan=plan, app_id=app_id, epoch=epoch, pipeline_id=pipeline_id,
                           source_fqn=source_fqn, dest_fqn=dest_fqn, checkpoint_sql=checkpoint_table.sql,
                           checkpoint_path=checkpoint_table.path)


class ConnectBatches:
    """The batches of one transaction app id, read back from the checkpoint table in batch order."""

    def __init__(self, job: ConnectBatchJob) -> None:
        self.job = job
        self.seen = -1  # the highest batch id reported

    def skip_recorded(self, spark: "SparkSession") -> None:
        """Report only batches applied from now on (a restarted daemon has reported the others)."""
        app = self.job.app_id.replace("'", "''")
        row = run_sql(spark, f"SELECT max(batch_id) AS b FROM {self.job.checkpoint_sql} "
                             f"WHERE txn_app_id = '{app}' AND error IS NULL").collect()[0]
        self.seen = -1 if row["b"] is None else int(row["b"])

    def new_outcomes(self, spark: "SparkSession") -> list[tuple[int, MergeOutcome, float, float]]:
        """(batch id, outcome, started, ended) of each batch applied since the last call."""
        app = self.job.app_id.replace("'", "''")
        rows = run_sql(spark, 
            f"SELECT batch_id, rows_read, first_version, last_version, rows_inserted, rows_updated, rows_deleted, "
            f"started_at, ended_at FROM {self.job.checkpoint_sql} WHERE txn_app_id = '{app}' "
            f"AND batch_id > {int(self.seen)} AND error IS NULL ORDER BY batch_id").collect()
        out = [(int(r["batch_id"]), outcome_of(r), r["started_at"].timestamp(), r["ended_at"].timestamp())
               for r in rows]
        if out:
            self.seen = out[-1][0]
        return out


def outcome_of(row: Any) -> MergeOutcome:
    stats = BatchStats(int(row["rows_read"] or 0), row["first_version"], row["last_version"], None)
    counts = ApplyCounts(int(row["rows_inserted"] or 0), int(row["rows_updated"] or 0), int(row["rows_deleted"] or 0))
    return MergeOutcome(stats, counts, replayed=False)


#: How Spark Connect wraps an error raised by a foreachBatch function that ran on the server.
SERVER_BATCH_ERROR = "Found error inside foreachBatch Python process"


def server_batch_cause(exc: BaseException) -> BaseException:
    """The error a server-side batch function raised, from the query error that wraps it.

    The query's message starts with the wrapper and a Python traceback; its cause (e.g. Delta's
    ``DELTA_VIOLATE_CONSTRAINT_WITH_VALUES``) is the traceback's last exception line, which is what
    the table's status must show and what the error classifier must read."""
    text = str(exc)
    if SERVER_BATCH_ERROR not in text:
        return exc
    import re

    causes = [line.strip() for line in text.splitlines()
              if re.match(r"^\s*[\w.]+(Error|Exception|Exit|Interrupt)\b:", line)
              and "StreamingQueryException" not in line]
    return RuntimeError(causes[-1]) if causes else exc
