"""What every apply path shares: a batch's transaction id, its statistics and its outcome.

Pure: no pyspark import. The executors (:mod:`lakemirror.sinks.merge.delta_merge`, its rewrite, and
:mod:`lakemirror.sinks.accelerator.driver_apply`) all commit a batch under one :class:`TxnId`, which Delta
records in the replica's log (a ``txn`` action) and in the commit's ``userMetadata`` (its tag).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from lakemirror.sinks.memory import ApplyCounts

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class TxnId:
    app_id: str
    version: int

    def tag(self) -> str:
        return json.dumps({"lakemirror_txn": self.app_id, "batch": self.version}, sort_keys=True)


#: Delta's session confs for an idempotent write: a commit carrying an (app id, version) Delta has
#: already recorded for the table is skipped; the user metadata tags the commit.
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_TXN_CONFS = (TXN_APP_ID, TXN_VERSION, USER_METADATA)


#: For a stable batch (a change-feed batch: immutable files at fixed versions, the same rows at each
#: read): the MERGE reads it in place (no copy before its two passes), and no adaptive execution (on a
#: few partitions it only splits the MERGE into more jobs).
STABLE_SOURCE_CONFS = {"spark.databricks.delta.merge.materializeSource": "none",
                       "spark.sql.adaptive.enabled": "false"}


class scoped_confs:
    """Context manager: set ``confs`` on ``session``; restore each one's earlier value after."""

    def __init__(self, session: "SparkSession", confs: dict[str, str]) -> None:
        self.session = session
        self.confs = confs
        self.saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        conf = self.session.conf
        for key, value in self.confs.items():
            self.saved[key] = conf.get(key, None)
            conf.set(key, value)

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                self.session.conf.unset(key)
            else:
                self.session.conf.set(key, value)


class transaction:
    """Context manager: set Delta's idempotent-write confs for ``txn`` on ``session``; always unset them
    after (over Spark Connect they would otherwise stay in the client's session)."""

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


def is_txn_tag(user_metadata: str | None) -> bool:
    """Whether a replica commit's ``userMetadata`` is a batch's :meth:`TxnId.tag` (any apply path)."""
    return bool(user_metadata) and '"lakemirror_txn"' in str(user_metadata)


def txn_app_id(pipeline_id: str, table_slug: str, epoch: int) -> str:
    return f"lakemirror/{pipeline_id}/{table_slug}/e{epoch}"


@dataclass(frozen=True)
class BatchStats:
    rows_read: int
    first_version: int | None
    last_version: int | None
    max_commit_time: float | None
    #: The commit time of ``first_version`` (None where the path does not read it).
    min_commit_time: float | None = None


#: Which engine read a batch's change rows, and which applied them (``MergeOutcome.read`` / ``.write``).
READ_BY_SPARK, READ_BY_DELTA_RS = "spark", "delta-rs"
WRITE_SPARK_MERGE, WRITE_SPARK_REWRITE, WRITE_DELTA_RS = "spark-merge", "spark-rewrite", "delta-rs-merge"
WRITE_DRIVER_DV = "driver-deletion-vectors"


@dataclass(frozen=True)
class MergeOutcome:
    stats: BatchStats
    counts: ApplyCounts
    replayed: bool  # the write was skipped: this batch had been committed before
    read: str = READ_BY_SPARK           # the engine that read the batch's change rows
    write: str = WRITE_SPARK_MERGE      # the apply path that wrote (or found already written) the batch
    #: How the apply path found a replayed batch already written, in words (None: Delta skipped its
    #: transaction id, or the replica's Delta log recorded it).
    replay_note: str | None = None
    #: What the batch's commit left for after the batch is reported (a checkpoint of the replica, the
    #: clean-up of its expired commit files: :func:`lakemirror.delta_log.commit_hooks.after_commit`),
    #: run by :func:`run_upkeep` once the batch counts as applied; None: nothing.
    upkeep: Callable[[], None] | None = field(default=None, compare=False, repr=False)


def run_upkeep(outcome: MergeOutcome) -> None:
    """Run what ``outcome``'s commit left due (never raises): once the batch counts as applied."""
    if outcome.upkeep is not None:
        outcome.upkeep()


def counts_from_metrics(metrics: dict[str, Any] | None) -> ApplyCounts:
    """A MERGE commit's counts from its ``operationMetrics``: Spark's names or delta-rs's."""
    m = metrics or {}

    def get(spark_name: str, rs_name: str) -> int:
        return int(m.get(spark_name) or m.get(rs_name) or 0)

    return ApplyCounts(get("numTargetRowsInserted", "num_target_rows_inserted"),
                       get("numTargetRowsUpdated", "num_target_rows_updated"),
                       get("numTargetRowsDeleted", "num_target_rows_deleted"))
