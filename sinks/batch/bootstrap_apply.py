"""The end of a chunked bootstrap: the captured changes each chunk still needs, applied to the
replica with one MERGE that reads and rewrites only the chunks those changes fall in.

Which change rows are still needed is the plan's to say (:func:`~lakemirror.sinks.batch.bootstrap_plan.change_filter_sql`):
for each key, the captured changes after the version its chunk was read at, through the bootstrap's
final version. A change to a key whose chunk was copied after it is already in the replica, and
costs nothing here.

With key-range chunks the MERGE's condition also names the key ranges of the chunks its changes
fall in (:func:`~lakemirror.sinks.batch.bootstrap_plan.target_predicate`): Delta's data skipping then
leaves every other chunk's files unread, and a copy-on-write MERGE rewrites only files that hold a
changed key. Every change row's key lies in one of those ranges (they are computed from the same
rows), so the narrower condition matches exactly the rows the plain one would. A replica with
deletion vectors (``replica_properties``) writes only the changed rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from lakemirror import tables
from lakemirror.sinks.batch.bootstrap_plan import BootstrapPlan, change_filter_sql, chunk_of_sql, target_predicate
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.merge.planner import TARGET_ALIAS, MergePlan
from lakemirror.sinks.txn import MergeOutcome, TxnId
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class AppliedChanges:
    outcome: MergeOutcome | None  # None: no captured change was still needed (nothing written)
    chunks: tuple[int, ...] = ()  # the key-range chunks the applied changes fell in


def apply_captured(spark: "SparkSession", *, replica: TableLocation, changes: TableLocation, merge_plan: MergePlan,
                   plan: BootstrapPlan, through: int, txn: TxnId) -> AppliedChanges:
    """MERGE the change rows of ``changes`` (the change log) that ``plan``'s chunks still need, up
    to source version ``through``, into ``replica`` under the transaction ``txn``."""
    if not plan.captures or not tables.exists(spark, changes):
        return AppliedChanges(None)
    rows = tables.read(spark, changes).where(change_filter_sql(plan, through))
    chunk_of = chunk_of_sql(plan)
    narrowed = merge_plan
    hit: tuple[int, ...] = ()
    if chunk_of is None:
        if not rows.limit(1).collect():
            return AppliedChanges(None)
    else:
        hit = tuple(sorted(int(r["chunk"]) for r in rows.selectExpr(f"{chunk_of} AS chunk").distinct().collect()))
        if not hit:
            return AppliedChanges(None)
        only = target_predicate(plan, set(hit), TARGET_ALIAS)
        if only is not None:
            narrowed = replace(merge_plan, match_condition=f"{merge_plan.match_condition} AND ({only})")
    outcome = DeltaMergeSink(replica, narrowed, stable_source=True).apply(rows, txn)
    return AppliedChanges(outcome, hit)
