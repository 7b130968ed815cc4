"""The Delta MERGE executor: applies one micro-batch of change rows exactly once.

Thin by design: the plan comes from :mod:`lakemirror.sinks.planner`. Exactly-once rests on
Delta transaction identifiers (CDC_SEMANTICS.md §2):

- ``txnAppId`` names pipeline, table AND bootstrap epoch, so a reset checkpoint (batch ids from
  0 again) gets a new app id instead of being skipped as a replay;
- ``txnVersion`` is the micro-batch id; a replayed batch is skipped by Delta itself;
- the confs are set on the batch's own session and always unset in ``finally``, so no later,
  unrelated write in that session is skipped;
- one MERGE per target per batch; source rows are deduplicated per key first.

A MERGE Delta skipped as a replay answers with no row (a MERGE it ran answers with one row of
counts): that is how a replay is told apart without reading the replica's history. Each MERGE
commit carries ``userMetadata`` naming its transaction, which is how a replayed batch recovers the
counts of the commit that already applied it, and how audits find duplicates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakemirror import tables
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.planner import COMMIT_TIMESTAMP, COMMIT_VERSION, LATEST_COLUMN, MergePlan, SOURCE_ALIAS, TARGET_ALIAS
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_TXN_CONFS = (TXN_APP_ID, TXN_VERSION, USER_METADATA)


@dataclass(frozen=True)
class TxnId:
    app_id: str
    version: int

    def tag(self) -> str:
        return json.dumps({"lakemirror_txn": self.app_id, "batch": self.version}, sort_keys=True)


def txn_app_id(pipeline_id: str, table_slug: str, epoch: int) -> str:
    return f"lakemirror/{pipeline_id}/{table_slug}/e{epoch}"


@dataclass(frozen=True)
class BatchStats:
    rows_read: int
    first_version: int | None
    last_version: int | None
    max_commit_time: float | None


@dataclass(frozen=True)
class MergeOutcome:
    stats: BatchStats
    counts: ApplyCounts
    replayed: bool  # Delta skipped the write: this batch had been committed before


def _counts_from_metrics(metrics: dict[str, Any] | None) -> ApplyCounts:
    m = metrics or {}
    return ApplyCounts(int(m.get("numTargetRowsInserted", 0) or 0),
                       int(m.get("numTargetRowsUpdated", 0) or 0),
                       int(m.get("numTargetRowsDeleted", 0) or 0))


class DeltaMergeSink:
    """Applies change batches to a Delta replica with one idempotent MERGE per batch."""

    def __init__(self, target: TableLocation, plan: MergePlan) -> None:
        self.target = target
        self.plan = plan

    def latest_changes(self, batch: "DataFrame") -> "DataFrame":
        """One row per key: the winning change, with its operation in ``__lm_op``."""
        from pyspark.sql import functions as F

        return (batch.where(self.plan.change_filter)
                .groupBy(*[F.col(f"`{k.replace('`', '``')}`") for k in self.plan.keys])
                .agg(F.expr(self.plan.latest_expr).alias(LATEST_COLUMN))
                .select(f"{LATEST_COLUMN}.*"))

    @staticmethod
    def stats(batch: "DataFrame") -> BatchStats:
        from pyspark.sql import functions as F

        row = batch.agg(F.count(F.lit(1)).alias("n"), F.min(COMMIT_VERSION).alias("lo"),
                        F.max(COMMIT_VERSION).alias("hi"), F.max(COMMIT_TIMESTAMP).alias("ts")).collect()[0]
        ts = row["ts"].timestamp() if row["ts"] is not None else None
        return BatchStats(int(row["n"]), row["lo"], row["hi"], ts)

    def apply(self, batch: "DataFrame", txn: TxnId) -> MergeOutcome:
        """MERGE ``batch`` (raw change-feed rows) into the replica under transaction ``txn``.

        Delta answers a MERGE it ran with one row of counts, and a MERGE it skipped as a replay
        of a committed transaction with no row at all: that answer alone tells fresh from
        replayed, so the fresh path reads no table history (the replica's log is read again
        only for a replay, to recover the counts of the commit that applied the batch first).
        """
        session = batch.sparkSession
        batch = batch.persist()
        try:
            stats = self.stats(batch)
            if stats.rows_read == 0:
                return MergeOutcome(stats, ApplyCounts(), replayed=False)
            source = self.latest_changes(batch)
            target = tables.delta_table(session, self.target)
            builder = (target.alias(TARGET_ALIAS)
                       .merge(source.alias(SOURCE_ALIAS), self.plan.match_condition)
                       .whenMatchedDelete(condition=self.plan.delete_condition)
                       .whenMatchedUpdate(set=self.plan.assignments)
                       .whenNotMatchedInsert(condition=self.plan.upsert_condition, values=self.plan.assignments))
            with transaction(session, txn):
                answer = builder.execute().collect()
            if answer:
                return MergeOutcome(stats, counts_from_answer(answer[0].asDict()), replayed=False)
            return MergeOutcome(stats, self._replayed_counts(session, txn), replayed=True)
        finally:
            batch.unpersist()

    def _replayed_counts(self, session: "SparkSession", txn: TxnId) -> ApplyCounts:
        """The counts of the earlier commit that applied transaction ``txn`` (found by its tag)."""
        tag = txn.tag().replace("'", "''")
        earlier = (tables.delta_table(session, self.target).history()
                   .where(f"userMetadata = '{tag}'").select("operationMetrics").collect())
        return _counts_from_metrics(earlier[0]["operationMetrics"]) if earlier else ApplyCounts()


def counts_from_answer(row: dict[str, Any]) -> ApplyCounts:
    """Counts from the row a Delta MERGE returns (``num_inserted_rows`` …)."""
    return ApplyCounts(int(row.get("num_inserted_rows") or 0), int(row.get("num_updated_rows") or 0),
                       int(row.get("num_deleted_rows") or 0))


class transaction:
    """Context manager: set Delta's idempotent-write confs on ``session``; always unset them."""

    def __init__(self, session: "SparkSession", txn: TxnId) -> None:
        self.session = session
        self.txn = txn

    def __enter__(self) -> None:
        conf = self.session.conf
        conf.set(TXN_APP_ID, self.txn.app_id)
        conf.set(TXN_VERSION, str(self.txn.version))
        conf.set(USER_METADATA, self.txn.tag())

    def __exit__(self, *exc: object) -> None:
        for key in _TXN_CONFS:
            self.session.conf.unset(key)
