"""The reconciliation executor: runs a :class:`ReconcilePlan` on Spark, optionally repairs.

Thin by design; every expression comes from :mod:`lakemirror.sinks.batch.reconcile_plan`.
The source is read at one pinned version for the whole check, so a source being written to
meanwhile is compared at a consistent cut (the replica may legitimately lag behind it: reconcile
a live mirror once it has caught up to ``source_version``, or expect the keys changed since).

Repair re-applies the source rows of the mismatched keys through the normal MERGE path
(:class:`~lakemirror.sinks.merge.delta_merge.DeltaMergeSink`): synthesised change rows, inserts for
missing and different keys, deletes for extra ones, under a transaction id of its own
(``lakemirror-reconcile/<run id>/<nonce>/<table>``), never the stream's. Keys the replica holds more
than once are deleted in a first MERGE and re-inserted from the source in a second.

Only DataFrame calls and SQL (the MERGE included), so the check and the repair run the same over
Spark Connect as in a session with its own JVM.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Sequence

from lakemirror import tables
from lakemirror.identifiers import quote
from lakemirror.schema import Column, columns_from_struct
from lakemirror.sinks.merge.delta_merge import DeltaMergeSink
from lakemirror.sinks.merge.planner import CHANGE_TYPE, COMMIT_TIMESTAMP, COMMIT_VERSION, DELETE, INSERT, plan_merge
from lakemirror.sinks.batch.reconcile_plan import (
    BUCKET_COLUMN, DEFAULT_BUCKETS, DIFFERENT, EXTRA, KEY_COLUMN, LANE1_COLUMN, LANE2_COLUMN, MISSING,
    RECONCILIATION_DDL, ROWS_COLUMN, ReconcilePlan, ReconcileResult, classify_sql, differing_buckets,
    plan_reconcile,
)
from lakemirror.sinks.txn import TxnId
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn, DataFrame, GroupedData, SparkSession

KIND_COLUMN = "__lm_kind"


@dataclass(frozen=True)
class ReconcileOptions:
    buckets: int = DEFAULT_BUCKETS
    exclude_columns: tuple[str, ...] = ()
    max_keys_reported: int = 1000
    repair: bool = False


class Reconciler:
    """Compares a replica with its source; see the module docstring."""

    def __init__(self, spark: "SparkSession") -> None:
        self.spark = spark

    def reconcile(self, source: TableLocation, replica: TableLocation, keys: Sequence[str],
                  options: ReconcileOptions = ReconcileOptions(), *, source_version: int | None = None,
                  run_id: str | None = None) -> ReconcileResult:
        version = tables.latest_version(self.spark, source) if source_version is None else source_version
        src = tables.read(self.spark, source, versionAsOf=version)
        rep = tables.read(self.spark, replica)
        src_cols, rep_cols = columns_from_struct(src.schema), columns_from_struct(rep.schema)
        plan = plan_reconcile(src_cols, rep_cols, keys, buckets=options.buckets,
                              exclude=options.exclude_columns)
        src_p, rep_p = src.selectExpr("*", *plan.projection()), rep.selectExpr("*", *plan.projection())
        src_b, rep_b = self._buckets(src_p, plan), self._buckets(rep_p, plan)
        bad = differing_buckets(src_b, rep_b)
        counts = {MISSING: 0, EXTRA: 0, DIFFERENT: 0}
        samples: dict[str, tuple[str, ...]] = {}
        truncated = repaired = False
        if bad:
            diff = self._key_diff(src_p, rep_p, plan, bad).persist()
            try:
                for row in diff.groupBy(KIND_COLUMN).count().collect():
                    counts[row[KIND_COLUMN]] = int(row["count"])
                for kind, n in counts.items():
                    if n:
                        keys_of = (diff.where(diff[KIND_COLUMN] == kind).select(KEY_COLUMN)
                                   .orderBy(KEY_COLUMN).limit(options.max_keys_reported).collect())
                        samples[kind] = tuple(r[KEY_COLUMN] for r in keys_of)
                        truncated = truncated or n > options.max_keys_reported
                if options.repair and any(counts.values()):
                    self._repair(src_p, rep_p, diff, replica, plan, src_cols, rep_cols, version,
                                 run_id or uuid.uuid4().hex)
                    repaired = True
            finally:
                diff.unpersist()
        return ReconcileResult(
            source=str(source), replica=str(replica), source_version=version,
            source_rows=sum(v[0] for v in src_b.values()), replica_rows=sum(v[0] for v in rep_b.values()),
            schema=plan.schema, buckets=plan.buckets, buckets_differing=len(bad),
            missing=counts[MISSING], extra=counts[EXTRA], different=counts[DIFFERENT],
            sample_keys=samples, keys_truncated=truncated, repaired=repaired,
            compared_columns=plan.compared)

    @staticmethod
    def _buckets(projected: "DataFrame", plan: ReconcilePlan) -> dict[int, tuple[int, int, int]]:
        rows = _agg(projected.groupBy(BUCKET_COLUMN), plan.bucket_aggregates()).collect()
        return {int(r[BUCKET_COLUMN]): (int(r[ROWS_COLUMN]), int(r[LANE1_COLUMN]), int(r[LANE2_COLUMN]))
                for r in rows}

    @staticmethod
    def _key_diff(src_p: "DataFrame", rep_p: "DataFrame", plan: ReconcilePlan,
                  bad: list[int]) -> "DataFrame":
        where = plan.in_buckets_sql(bad)
        s = _agg(src_p.where(where).groupBy(KEY_COLUMN), plan.key_aggregates()).alias("s")
        r = _agg(rep_p.where(where).groupBy(KEY_COLUMN), plan.key_aggregates()).alias("r")
        from pyspark.sql import functions as F

        joined = s.join(r, s[KEY_COLUMN] == r[KEY_COLUMN], "full_outer")
        out = joined.select(F.coalesce(s[KEY_COLUMN], r[KEY_COLUMN]).alias(KEY_COLUMN),
                            F.expr(classify_sql("s", "r")).alias(KIND_COLUMN),
                            F.coalesce(r[ROWS_COLUMN], F.lit(0)).alias(ROWS_COLUMN))
        filtered: DataFrame = out.where(F.col(KIND_COLUMN).isNotNull())
        return filtered

    def _repair(self, src_p: "DataFrame", rep_p: "DataFrame", diff: "DataFrame", replica: TableLocation,
                plan: ReconcilePlan, src_cols: Sequence[Column], rep_cols: Sequence[Column],
                version: int, run_id: str) -> None:
        from pyspark.sql import functions as F

        rep_names = {c.name.lower() for c in rep_cols}
        columns = [c for c in src_cols if c.name.lower() in rep_names]
        merge = DeltaMergeSink(replica, plan_merge(columns, plan.keys))
        # A fresh app id per repair: a retried attempt of the same run must not be skipped by
        # Delta as a replay of the first attempt's transaction versions.
        app_id = f"lakemirror-reconcile/{run_id}/{uuid.uuid4().hex[:12]}/{replica.name.slug}"
        now = F.lit(datetime.now(timezone.utc))

        def change_rows(rows: "DataFrame", op: str, data: bool) -> "DataFrame":
            cols = [F.col(quote(c.name)) if (data or c.name in plan.keys) else F.lit(None).cast(c.type).alias(c.name)
                    for c in columns]
            return rows.select(*cols, F.lit(op).alias(CHANGE_TYPE), F.lit(version).cast("bigint").alias(COMMIT_VERSION),
                               now.alias(COMMIT_TIMESTAMP))

        # 1: delete extra keys and keys the replica holds more than once (duplicates).
        drop = diff.where((F.col(KIND_COLUMN) == EXTRA) | (F.col(ROWS_COLUMN) > 1)).select(KEY_COLUMN)
        gone = rep_p.join(drop, KEY_COLUMN, "left_semi").dropDuplicates([KEY_COLUMN])
        merge.apply(change_rows(gone, DELETE, data=False), TxnId(app_id, 1))
        # 2: upsert the source rows of missing and different keys.
        fix = diff.where(F.col(KIND_COLUMN).isin(MISSING, DIFFERENT)).select(KEY_COLUMN)
        merge.apply(change_rows(src_p.join(fix, KEY_COLUMN, "left_semi"), INSERT, data=True), TxnId(app_id, 2))


def _expr(text: str) -> "SparkColumn":
    from pyspark.sql import functions as F

    return F.expr(text)


def _agg(grouped: "GroupedData", aggregates: Sequence[str]) -> "DataFrame":
    first, *rest = [_expr(a) for a in aggregates]
    return grouped.agg(first, *rest)


class DeltaReconciliationStore:
    """Reconciliation results in a Delta table (one row per table per run)."""

    def __init__(self, spark: "SparkSession", location: TableLocation) -> None:
        self.spark = spark
        self.location = location

    def append(self, run_id: str, result: ReconcileResult, checked_at: datetime | None = None) -> None:
        df = self.spark.createDataFrame([result_row(run_id, result, checked_at)], RECONCILIATION_DDL)
        tables.write(df, self.location, "append")


def result_row(run_id: str, r: ReconcileResult, checked_at: datetime | None = None) -> tuple[object, ...]:
    """One reconciliation-table row, in :data:`RECONCILIATION_DDL` order."""
    return (run_id, checked_at or datetime.now(timezone.utc), r.source, r.replica, r.source_version, r.status,
            r.source_rows, r.replica_rows, r.missing, r.extra, r.different, r.schema.is_additive,
            r.schema.describe(), r.buckets, r.buckets_differing, list(r.sample_keys.get(MISSING, ())),
            list(r.sample_keys.get(EXTRA, ())), list(r.sample_keys.get(DIFFERENT, ())), r.keys_truncated,
            r.repaired, list(r.compared_columns))


class InMemoryReconciliationStore:
    """The twin of :class:`DeltaReconciliationStore`."""

    def __init__(self) -> None:
        self.rows: list[tuple[object, ...]] = []

    def append(self, run_id: str, result: ReconcileResult, checked_at: datetime | None = None) -> None:
        self.rows.append(result_row(run_id, result, checked_at))
