"""An incremental sweep's batch function, and how its outcomes reach the sweep on each runtime.

:class:`SweepBatches` is the function the sweep's ``foreachBatch`` calls: one
:class:`~lakemirror.sinks.merge.delta_merge.DeltaMergeSink` apply per micro-batch under the sweep's
transaction id (app id, batch id). It is a picklable object of plain values, because where it
runs depends on the session:

- with a JVM of its own (local Spark, a Databricks job) it runs in this process, and the outcomes
  it keeps (:attr:`SweepBatches.applied`) are the sweep's;
- over Spark Connect it runs in a Python worker on the server, so its outcomes stay there. The
  sweep reads them back instead (:func:`server_outcomes`): the batches the query reports in its
  progress, each matched with the replica commit tagged with its transaction
  (``userMetadata``, :meth:`~lakemirror.sinks.txn.TxnId.tag`). A batch whose commit is older than
  the sweep was a replay Delta skipped; its counts are those of that earlier commit. The progress
  of a Connect query reports no input rows for a batch that its server-side function reads (those
  reads are queries of their own), so there ``rows_read`` is the MERGE's source rows
  (``numSourceRows``): one winning change per key, not every change row the batch held.

:func:`outcomes_from_log` is that matching, pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from lakemirror import tables
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import BatchStats, MergeOutcome, TxnId, counts_from_metrics, is_txn_tag
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass
class SweepBatches:
    """The sweep's batch function (see the module docstring)."""

    sink: DeltaMergeSink
    app_id: str
    #: (batch id, outcome) of each batch applied IN THIS PROCESS (empty over Spark Connect).
    applied: list[tuple[int, MergeOutcome]] = field(default_factory=list)

    def __call__(self, batch: "DataFrame", batch_id: int) -> None:
        self.applied.append((batch_id, self.sink.apply(batch, TxnId(self.app_id, batch_id))))


@dataclass(frozen=True)
class TaggedCommit:
    """A replica commit that applied one batch of the sweep's transaction."""

    version: int
    counts: ApplyCounts
    source_rows: int = 0  # the MERGE's source rows (one winning change per key)


def outcomes_from_log(batch_ids: Iterable[int], commits: Mapping[int, TaggedCommit],
                      replica_version_before: int) -> list[tuple[int, MergeOutcome]]:
    """(batch id, outcome) of each batch a query reported (``batch_ids``, in order) that has a
    commit in ``commits`` (by batch id): fresh when that commit is newer than
    ``replica_version_before``, else a replay Delta skipped. A reported batch without a commit ran
    no batch function (an idle trigger) and is left out."""
    out: list[tuple[int, MergeOutcome]] = []
    seen: set[int] = set()
    for batch_id in batch_ids:
        commit = commits.get(batch_id)
        if commit is None or batch_id in seen:
            continue
        seen.add(batch_id)
        out.append((batch_id, MergeOutcome(BatchStats(commit.source_rows, None, None, None), commit.counts,
                                           replayed=commit.version <= replica_version_before)))
    return out


def tagged_commits(rows: Iterable[Mapping[str, Any]], app_id: str) -> dict[int, TaggedCommit]:
    """The commits of ``rows`` (``DESCRIBE HISTORY`` rows: version, userMetadata,
    operationMetrics) tagged with a batch of ``app_id``, by batch id (the newest if one repeats)."""
    found: dict[int, TaggedCommit] = {}
    for row in rows:
        meta = row.get("userMetadata")
        if not is_txn_tag(meta):
            continue
        tag = json.loads(str(meta))
        if tag.get("lakemirror_txn") != app_id:
            continue
        batch, version = int(tag["batch"]), int(row["version"])
        if batch not in found or found[batch].version < version:
            metrics = row.get("operationMetrics") or {}
            found[batch] = TaggedCommit(version, counts_from_metrics(metrics), int(metrics.get("numSourceRows") or 0))
    return found


def progress_batches(progress: Sequence[Any]) -> list[int]:
    """The batch ids of a query's progress reports (``recentProgress``), in order."""
    return [int((json.loads(p.json) if hasattr(p, "json") else p)["batchId"]) for p in progress]


def server_outcomes(spark: "SparkSession", replica: TableLocation, app_id: str, progress: Sequence[Any],
                    replica_version_before: int) -> list[tuple[int, MergeOutcome]]:
    """The outcomes of the batches a Spark Connect server applied (see the module docstring).
    ``progress`` holds the query's ``recentProgress`` (Spark keeps the last 100 reports)."""
    from pyspark.sql import functions as F

    rows = (tables.history(spark, replica).where(F.col("userMetadata").contains(F.lit(app_id)))
            .select("version", "userMetadata", "operationMetrics").collect())
    return outcomes_from_log(progress_batches(progress), tagged_commits([r.asDict() for r in rows], app_id),
                             replica_version_before)
