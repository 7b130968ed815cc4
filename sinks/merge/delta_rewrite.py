"""The rewrite executor: applies one change batch by replacing a small replica whole, in one pass.

Chosen per table by :mod:`lakemirror.sinks.merge.apply_choice`; the MERGE executor dispatches here. The
replica is read once, and each of its rows is joined against the batch's winning changes (a
broadcast hash join on the keys, null-safe where a key is nullable). A row whose key the batch
changes is dropped, and the batch's upserts are added. The result replaces the replica in one
Delta commit (an overwrite that keeps the table's schema, properties and partitioning).

Exactly-once rests on the same Delta transaction id as a MERGE's (:func:`transaction`): Delta
skips an overwrite whose (app id, batch) it has committed before. A skipped write runs no job,
so its observed metrics never arrive: that is how a replay is told apart. Its counts are then
recounted against the replica as it was before the commit that carries the batch's tag. If no
commit carries it, the batch fails and is retried: a missing report never counts as applied.

The counts come from the same pass, observed while the write runs: replica rows whose key the
batch deletes (deleted) or upserts (updated), and upserts of keys the replica lacked (inserted).
These are the counts a MERGE of the same batch reports.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any

from lakemirror import tables
from lakemirror.errors import TransientError
from lakemirror.identifiers import quote
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.merge.planner import DELETE, OP_COLUMN, MergePlan
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

HIT = "__lm_hit"
CHANGE_OP = "__lm_change_op"
_observation_ids = itertools.count()


@dataclass(frozen=True)
class Rewritten:
    counts: ApplyCounts
    rows: int  # the replica's rows after the batch


class RewriteUnconfirmed(TransientError):
    """The rewrite reported nothing, and no replica commit carries the batch: retry the batch."""

    code = "rewrite_unconfirmed"


def _key_alias(i: int) -> str:
    return f"__lm_k{i}"


class ReplicaRewrite:
    """Builds and runs the one-pass rewrite of ``target`` for a batch's winning changes."""

    def __init__(self, target: TableLocation, plan: MergePlan) -> None:
        self.target = target
        self.plan = plan
        self._nullable = {c.name: c.nullable for c in plan.columns}

    def _joined(self, replica: "DataFrame", latest: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        changes = F.broadcast(latest.select(*[F.col(quote(k)).alias(_key_alias(i)) for i, k in enumerate(self.plan.keys)],
                                            F.col(quote(OP_COLUMN)).alias(CHANGE_OP), F.lit(True).alias(HIT)))
        pairs: list["SparkColumn"] = []
        for i, k in enumerate(self.plan.keys):
            mine, theirs = replica[quote(k)], changes[_key_alias(i)]
            pairs.append(mine.eqNullSafe(theirs) if self._nullable.get(k, True) else mine == theirs)
        return replica.join(changes, reduce(lambda a, b: a & b, pairs), "left_outer")

    @staticmethod
    def _class_columns() -> list["SparkColumn"]:
        from pyspark.sql import functions as F

        deleted = F.when(F.col(CHANGE_OP) == F.lit(DELETE), 1).otherwise(0)
        return [F.count(F.lit(1)).alias("replica_rows"), F.count(F.col(HIT)).alias("matched"),
                F.sum(deleted).alias("deleted")]

    def _upserts(self, latest: "DataFrame") -> "DataFrame":
        from pyspark.sql import functions as F

        return latest.where(F.col(quote(OP_COLUMN)) != F.lit(DELETE)).select(*[quote(c) for c in self.plan.column_names])

    def write(self, session: "SparkSession", latest_for_keys: "DataFrame", latest_for_rows: "DataFrame",
              files: int) -> tuple[Any, Any]:
        """Replace the replica; returns the two observations (replica classes, upserts) to read.

        ``latest_for_keys`` and ``latest_for_rows`` are the same winning changes, built twice so
        that an observation on the batch (its statistics) sits in one branch only."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        replica = tables.read(session, self.target)
        classes = Observation(f"lakemirror_rewrite_{next(_observation_ids)}")
        upserted = Observation(f"lakemirror_upserts_{next(_observation_ids)}")
        joined = self._joined(replica, latest_for_keys).observe(classes, *self._class_columns())
        kept = joined.where(F.col(HIT).isNull()).select(*[F.col(quote(c)) for c in replica.columns])
        upserts = self._upserts(latest_for_rows).observe(upserted, F.count(F.lit(1)).alias("upserts"))
        tables.write(kept.unionByName(upserts).coalesce(max(1, files)), self.target, "overwrite")
        return classes, upserted

    @staticmethod
    def counts(classes: dict[str, Any], upserts: int) -> Rewritten:
        matched, deleted = int(classes.get("matched") or 0), int(classes.get("deleted") or 0)
        updated = matched - deleted
        rows = int(classes.get("replica_rows") or 0) - matched + upserts
        return Rewritten(ApplyCounts(upserts - updated, updated, deleted), rows)

    def recount(self, session: "SparkSession", tag: str, latest: "DataFrame") -> Rewritten:
        """The counts of the earlier commit that carries ``tag``, recounted against the replica as
        it was before that commit; :class:`RewriteUnconfirmed` if no commit carries it."""
        earlier = tables.tagged_commits(session, self.target, tag, "version")
        if not earlier:
            raise RewriteUnconfirmed(
                f"{self.target.name}: the rewrite of this batch reported no metrics and no replica commit carries "
                f"its transaction {tag}; the batch is retried (Delta skips it if it was committed after all)",
                table=str(self.target.name))
        before = tables.read(session, self.target, versionAsOf=int(earlier[0]["version"]) - 1)
        row = self._joined(before, latest).agg(*self._class_columns()).collect()[0].asDict()
        upserts = self._upserts(latest).count()
        return self.counts(row, upserts)
