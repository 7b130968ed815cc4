"""The Delta MERGE executor: applies one micro-batch of change rows exactly once.

Thin by design: the plan comes from :mod:`lakemirror.sinks.merge.planner`. Exactly-once rests on
Delta transaction identifiers: with ``spark.databricks.delta.write.txnAppId`` and ``txnVersion``
set on the session, Delta records ``(appId, version)`` atomically with the commit and skips a write
whose version is not above the recorded one. ``foreachBatch`` is at-least-once (a crash replays the
same batch id with the same rows), so that skip makes the apply exactly-once:

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

A change-feed micro-batch is *stable*: it reads immutable files at fixed versions, so reading it
twice gives the same rows. For such a batch (``stable_source=True``) the MERGE reads it directly
(Delta does not copy it first), its statistics are observed while the MERGE runs instead of by an
action of their own, and adaptive execution is off for the MERGE (on two partitions it only
splits the MERGE into more jobs). ``make bench ONLY=apply_cost`` times a stable batch against a
materialized one.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable

from lakemirror import tables
from lakemirror.sinks.merge.apply_choice import MERGE, ApplyChoice
from lakemirror.sinks.merge.connect_apply import merge_sql
from lakemirror.sinks.merge.delta_rewrite import ReplicaRewrite
from lakemirror.sinks.accelerator.driver_apply import ChangeReader, DriverApply, DriverUnfit, Target
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.merge.planner import COMMIT_TIMESTAMP, COMMIT_VERSION, LATEST_COLUMN, MergePlan
# The shared batch types, importable from here as before (the executors' callers use them).
from lakemirror.sinks.txn import (STABLE_SOURCE_CONFS, WRITE_SPARK_REWRITE, BatchStats,  # noqa: F401
                                  MergeOutcome, TxnId, counts_from_metrics, is_txn_tag, scoped_confs,
                                  transaction, txn_app_id)
from lakemirror.tables import TableLocation
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

_observation_ids = itertools.count()
#: How long a MERGE that read its batch waits for Spark to report the batch's observed statistics.
OBSERVED_WAIT_SECONDS = 30.0
log = logging.getLogger(__name__)


class DeltaMergeSink:
    """Applies change batches to a Delta replica with one idempotent MERGE per batch, or, for a
    small replica fed by a stable source, one rewrite of the whole replica
    (:mod:`lakemirror.sinks.merge.delta_rewrite`) or one delta-rs MERGE on the driver
    (:mod:`lakemirror.sinks.accelerator.driver_apply`); which one: :mod:`lakemirror.sinks.merge.apply_choice`."""

    def __init__(self, target: TableLocation, plan: MergePlan, *, stable_source: bool = False,
                 choice: ApplyChoice | None = None, replica_rows: int = 0,
                 choose: Callable[[], tuple[ApplyChoice, int]] | None = None,
                 driver_target: Callable[[], Target | None] | None = None,
                 fault: Callable[[str], None] = lambda point: None) -> None:
        self.target = target
        self.plan = plan
        #: How delta-rs reaches the replica (its URI and storage options), asked when the driver path is
        #: chosen; by default the replica's own path (a local replica). None: it does not reach it.
        self._driver_target = driver_target
        self.fault = fault
        #: The path batches take now, with its reason (shown by ``status``), and why the latest batch
        #: took another one, if it did (a batch too large for the driver).
        self.choice: ApplyChoice | None = choice
        self.batch_note: str | None = None
        #: True when every batch reads immutable files at fixed versions (a change-feed batch);
        #: never for a source derived from the replica itself (reconcile's repair, clone's diff).
        self.stable_source = stable_source
        #: Set (stable sources only) while the replica is small: the choice of a path other than
        #: Spark's MERGE (:mod:`lakemirror.sinks.merge.apply_choice`), until the replica outgrows the limit.
        self.small: ApplyChoice | None = None
        self.rewrite: ApplyChoice | None = None  # batches rewrite the small replica whole
        self.driver: DriverApply | None = None   # batches are MERGEd by delta-rs on the driver
        self.replica_rows = 0
        self._use(choice, replica_rows)
        #: Asked once, by the first stable batch, for the choice and the replica's rows.
        self._choose = choose if stable_source else None

    def _use(self, choice: ApplyChoice | None, replica_rows: int) -> None:
        small = choice if choice is not None and choice.path != MERGE and self.stable_source else None
        target: Target | None = None
        if small is not None and small.driver:
            target = self._reach()
            if target is None:  # a table known only by name, or a store delta-rs is not given
                small = small.without_driver(replica_rows)
                choice = small or ApplyChoice(MERGE, "applies by MERGE: the driver's delta-rs does not reach the replica")
        self.small = small
        self.rewrite = small if small is not None and small.rewrite else None
        self.driver = (DriverApply(target, self.plan, small.driver_batch_rows(), deletion_vectors=small.deletion_vectors,
                                   fault=self.fault)
                       if small is not None and small.driver and target is not None else None)
        self.replica_rows = replica_rows
        if choice is not None:
            self.choice = choice

    def _reach(self) -> Target | None:
        if self._driver_target is not None:
            return self._driver_target()
        return (str(self.target.path), {}) if self.target.path is not None else None

    def _track_size(self, rows: int) -> None:
        """Follow the replica's rows; past the small-replica limit, batches apply by MERGE."""
        self.replica_rows = rows
        if self.small is not None and not self.small.still_small(rows):
            log.info("%s: the replica has outgrown rewrite_below_bytes (%d rows, about %.0f bytes each); "
                     "its batches now apply by MERGE", self.target.name, rows, self.small.bytes_per_row)
            self._use(ApplyChoice(MERGE, f"applies by MERGE: the replica has outgrown its limit ({rows} rows)"), rows)

    def latest_changes(self, batch: "DataFrame") -> "DataFrame":
        """One row per key: the winning change, with its operation in ``__lm_op``."""
        from pyspark.sql import functions as F

        return (batch.where(self.plan.change_filter)
                .groupBy(*[F.col(f"`{k.replace('`', '``')}`") for k in self.plan.keys])
                .agg(F.expr(self.plan.latest_expr).alias(LATEST_COLUMN))
                .select(f"{LATEST_COLUMN}.*"))

    @staticmethod
    def _stats_columns() -> list[Any]:
        from pyspark.sql import functions as F

        return [F.count(F.lit(1)).alias("n"), F.min(COMMIT_VERSION).alias("lo"),
                F.max(COMMIT_VERSION).alias("hi"), F.max(COMMIT_TIMESTAMP).alias("ts"),
                F.min(COMMIT_TIMESTAMP).alias("ts0")]

    @classmethod
    def stats(cls, batch: "DataFrame") -> BatchStats:
        return _stats_from(batch.agg(*cls._stats_columns()).collect()[0].asDict())

    def merge_rows(self, session: "SparkSession", batch: "DataFrame") -> list[Any]:
        """MERGE ``batch``'s winning changes, under the session's transaction confs: Delta's answer rows
        (one row of counts; none for a transaction skipped as a replay)."""
        return self._merge(session, batch)

    def _merge(self, session: "SparkSession", batch: "DataFrame") -> list[Any]:
        """MERGE ``batch``'s winning changes into the replica; Delta's answer rows (one row of
        counts, none for a transaction it skipped as a replay).

        SQL text over a temp view of the batch (:func:`~lakemirror.sinks.merge.connect_apply.merge_sql`,
        the plan's own clauses), not Delta's ``DeltaTable`` API: the same statement runs in a
        session with its own JVM and over Spark Connect, where ``DeltaTable`` needs Delta's Connect
        server plugin (``delta-connect-server``, which Maven Central does not serve for Spark 4.2,
        so a server without it fails ``DeltaTable`` actions with
        ``CONNECT_INVALID_PLAN.NO_HANDLER_FOR_EXTENSION``). Both plan the same ``MergeIntoCommand``."""
        view = f"lakemirror_merge_{uuid.uuid4().hex}"
        batch.createOrReplaceTempView(view)
        try:
            return list(run_sql(session, merge_sql(self.plan, self.target.sql, view)).collect())
        finally:
            session.catalog.dropTempView(view)

    def apply(self, batch: "DataFrame", txn: TxnId, read: ChangeReader | None = None) -> MergeOutcome:
        """MERGE ``batch`` (raw change-feed rows) into the replica under transaction ``txn``.

        Delta answers a MERGE it ran with one row of counts, and a MERGE it skipped as a replay
        of a committed transaction with no row at all: that answer alone tells fresh from
        replayed, so the fresh path reads no table history (the replica's log is read again
        only for a replay, to recover the counts of the commit that applied the batch first).
        ``read`` reads the batch's rows without Spark, for the driver path (see its module).
        """
        if self.stable_source:
            return self._apply_stable(batch, txn, read)
        session = batch.sparkSession
        batch = batch.persist()
        try:
            stats = self.stats(batch)
            if stats.rows_read == 0:
                return MergeOutcome(stats, ApplyCounts(), replayed=False)
            with transaction(session, txn):
                answer = self._merge(session, batch)
            return self._outcome(session, txn, stats, answer)
        finally:
            batch.unpersist()

    def _apply_stable(self, batch: "DataFrame", txn: TxnId, read: ChangeReader | None = None) -> MergeOutcome:
        """One MERGE straight from the batch, its statistics observed while the MERGE reads it.

        A MERGE Delta skips as a replay never reads its source, and an empty batch may be
        optimised away: then (only then) the statistics cost an action of their own. An empty
        batch (a source commit without data changes) still commits a no-op MERGE, which records
        the transaction like any other batch.
        """
        from pyspark.sql import Observation

        session = batch.sparkSession
        observation = Observation(f"lakemirror_batch_{next(_observation_ids)}")
        watched = batch.observe(observation, *self._stats_columns())
        self.ensure_chosen()
        if self.driver is not None:
            outcome = self._drive(self.driver, batch, txn, read)
            if outcome is not None:
                return outcome
        if self.rewrite is not None:
            return self._rewrite_stable(batch, watched, observation, txn, self.rewrite)
        with scoped_confs(session, STABLE_SOURCE_CONFS), transaction(session, txn):
            answer = self._merge(session, watched)
        # A MERGE that changed rows has read its source, so Spark will report what it observed there;
        # on a busy driver its listener may take more than a second: wait for it rather than pay a
        # pass over the batch of its own.
        read_source = bool(answer) and counts_from_answer(answer[0].asDict()).total > 0
        observed = observed_metrics(observation, wait_seconds=OBSERVED_WAIT_SECONDS if read_source else 1.0)
        stats = _stats_from(observed) if observed is not None else self.stats(batch)
        return self._outcome(session, txn, stats, answer)

    def ensure_chosen(self) -> None:
        """Choose the apply path now, if no batch has chosen it yet (a stable source only)."""
        if self._choose is not None:
            self._use(*self._choose())
            self._choose = None

    def apply_changes(self, changes: "pa.Table", txn: TxnId, recount: Callable[[], ApplyCounts]) -> MergeOutcome | None:
        """A batch's change rows read by delta-rs (``DriverApply.wanted_columns``, preimages left out),
        applied on the driver under ``txn``; None when the driver does not take it and nothing was
        written (no driver path, a batch too large, or one delta-rs refused): Spark is to apply it."""
        self.ensure_chosen()
        driver = self.driver
        if driver is None:
            return None
        try:
            outcome = driver.apply_changes(changes, txn, recount)
        except DriverUnfit as exc:
            self.refused(exc)
            return None
        return self.driven(driver, outcome, txn)

    def _rewrite_stable(self, batch: "DataFrame", watched: "DataFrame", observation: Any, txn: TxnId,
                        choice: ApplyChoice) -> MergeOutcome:
        """Replace the small replica whole (one pass); counts observed during the write, or recounted
        for a replay Delta skipped (see :mod:`lakemirror.sinks.merge.delta_rewrite`)."""
        session = batch.sparkSession
        rewrite = ReplicaRewrite(self.target, self.plan)
        with scoped_confs(session, STABLE_SOURCE_CONFS), transaction(session, txn):
            classes, upserted = rewrite.write(session, self.latest_changes(batch), self.latest_changes(watched),
                                              choice.files_for(self.replica_rows))
        found, upserts = observed_metrics(classes, key="matched"), observed_metrics(upserted, key="upserts")
        if found is not None and upserts is not None:
            result, replayed = rewrite.counts(found, int(upserts["upserts"])), False
        else:
            result, replayed = rewrite.recount(session, txn.tag(), self.latest_changes(batch)), True
        observed = observed_metrics(observation)
        stats = _stats_from(observed) if observed is not None else self.stats(batch)
        self._track_size(result.rows)
        return MergeOutcome(stats, result.counts, replayed, write=WRITE_SPARK_REWRITE)

    def _drive(self, driver: DriverApply, batch: "DataFrame", txn: TxnId,
               read: ChangeReader | None = None) -> MergeOutcome | None:
        """The batch applied on the driver, or None when Spark is to apply it (too large a batch,
        or one delta-rs refused: then the table stays with Spark)."""
        def recount() -> ApplyCounts:
            return ReplicaRewrite(self.target, self.plan).recount(batch.sparkSession, txn.tag(),
                                                                  self.latest_changes(batch)).counts

        try:
            outcome = driver.apply(batch, txn, recount, read)
        except DriverUnfit as exc:
            self.refused(exc)
            return None
        return self.driven(driver, outcome, txn)

    def refused(self, exc: DriverUnfit) -> None:
        """delta-rs refused a batch without committing it: this table's batches go to Spark from now on."""
        log.warning("%s; its batches are applied by Spark from now on", exc)
        fallback = self.small.without_driver(self.replica_rows) if self.small is not None else None
        self._use(fallback or ApplyChoice(MERGE, f"applies by MERGE: delta-rs refused a batch ({exc})"),
                  self.replica_rows)
        self.batch_note = None

    def driven(self, driver: DriverApply, outcome: MergeOutcome | None, txn: TxnId) -> MergeOutcome | None:
        """Follow a batch the driver applied (or left to Spark: ``outcome`` None, a batch too large)."""
        if outcome is None:
            self.batch_note = (f"batch {txn.version} had more change rows than the driver takes ({driver.max_rows}): "
                               "Spark applied it")
            return None
        self.batch_note = None
        if not outcome.replayed:
            self._track_size(self.replica_rows + outcome.counts.inserted - outcome.counts.deleted)
        return outcome

    def _outcome(self, session: "SparkSession", txn: TxnId, stats: BatchStats, answer: list[Any]) -> MergeOutcome:
        if answer:
            return MergeOutcome(stats, counts_from_answer(answer[0].asDict()), replayed=False)
        return MergeOutcome(stats, self._replayed_counts(session, txn), replayed=True)

    def _replayed_counts(self, session: "SparkSession", txn: TxnId) -> ApplyCounts:
        """The counts of the earlier commit that applied transaction ``txn`` (found by its tag)."""
        earlier = tables.tagged_commits(session, self.target, txn.tag(), "operationMetrics")
        return counts_from_metrics(earlier[0]["operationMetrics"]) if earlier else ApplyCounts()


def _stats_from(row: dict[str, Any]) -> BatchStats:
    ts = row["ts"].timestamp() if row.get("ts") is not None else None
    ts0 = row["ts0"].timestamp() if row.get("ts0") is not None else None
    return BatchStats(int(row.get("n") or 0), row.get("lo"), row.get("hi"), ts, ts0)


def observed_metrics(observation: Any, wait_seconds: float = 1.0, key: str = "n") -> dict[str, Any] | None:
    """The metrics an action observed, or None when no action reported them (yet).

    ``Observation.get`` blocks until an action reports, forever if none does (a MERGE skipped as
    a replay never reads its source), so readiness is polled first, for at most ``wait_seconds``.
    """
    handle = getattr(observation, "_jo", None)  # the JVM Observation, attached by DataFrame.observe
    if handle is None:
        return None
    deadline = time.monotonic() + wait_seconds
    while not handle.future().isCompleted():
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)
    try:
        metrics: dict[str, Any] = observation.get
    except Exception:  # noqa: BLE001 (an empty metrics row: the batch was optimised away)
        return None
    return metrics if key in metrics else None


def counts_from_answer(row: dict[str, Any]) -> ApplyCounts:
    """Counts from the row a Delta MERGE returns (``num_inserted_rows`` …)."""
    return ApplyCounts(int(row.get("num_inserted_rows") or 0), int(row.get("num_updated_rows") or 0),
                       int(row.get("num_deleted_rows") or 0))
