"""The SQL-only apply path, for Spark Connect servers without Delta's Connect plugin.

Maven Central does not serve ``delta-connect-server``, so over such a server Delta's Python API
(``DeltaTable``) fails (``NO_HANDLER_FOR_EXTENSION``). Everything here is SQL text and plain
DataFrame calls, which the server plans with Delta's SQL extension:

- the winning change per key is the same rule as :mod:`lakemirror.sinks.merge.planner` (``max_by`` over
  commit version and change rank), as a ``SELECT`` over a temp view of the batch;
- one ``MERGE INTO <replica> USING (<that SELECT>)`` per batch, under Delta's ``txnAppId`` /
  ``txnVersion`` confs (a replayed batch is skipped by Delta and answers with no row) and a
  ``userMetadata`` tag naming the transaction (how a replay recovers its first commit's counts);
  the confs are unset in ``finally``: they live in the table's Connect session, which the
  client shares; the batch is read in place, without adaptive execution
  (:data:`~lakemirror.sinks.txn.STABLE_SOURCE_CONFS`, restored after);
- a batch the replica refuses because of one row's value (a ``CHECK`` constraint, a ``NOT NULL``
  column, a value out of range) is applied without that row, found by bisecting the batch's keys, and
  the row is dead-lettered in ``_lakemirror_dead_letters`` beside the replica: the one isolation of
  the local path (:func:`~lakemirror.sinks.merge.row_isolation.isolate_batch`, every attempt under a
  transaction id of its own, the letters under the batch's letters id), run here on the server;
- the batch's outcome (statistics, counts, times, the letters it recorded) is written to a file beside the query's
  checkpoint (:mod:`lakemirror.sinks.merge.connect_outcomes`), no Spark write: the daemon reads it
  and appends the batch's checkpoint row, a round of tables' rows in one commit.

:func:`apply_batch` runs in a Python worker ON THE SERVER (Spark Connect's ``foreachBatch``), so
it is a top-level function of an importable module, bound to a picklable :class:`ConnectBatchJob`
with :func:`functools.partial`, and imports only lakemirror and pyspark (the server's Python is the
project's environment: scripts/connect-server.sh).
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable

from lakemirror.identifiers import quote
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.merge.connect_gate import ServerGate
from lakemirror.sinks.merge.connect_outcomes import BatchOutcome, write_outcome
from lakemirror.sinks.merge.planner import (COMMIT_TIMESTAMP, COMMIT_VERSION, LATEST_COLUMN, SOURCE_ALIAS, TARGET_ALIAS,
                                      MergePlan)
from lakemirror.sinks.txn import (STABLE_SOURCE_CONFS, BatchStats, MergeOutcome, TxnId, counts_from_metrics,
                                  scoped_confs, transaction)
from lakemirror.sql_exec import run_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakemirror.sinks.merge.feed_letters import FeedDeadLetters, FeedLetter
    from lakemirror.tables import TableLocation


def latest_changes_sql(plan: MergePlan, view: str) -> str:
    """One row per key of the batch in temp view ``view``: the winning change, its op in ``__lm_op``."""
    keys = ", ".join(quote(k) for k in plan.keys)
    return (f"SELECT {quote(LATEST_COLUMN)}.* FROM (SELECT {plan.latest_expr} AS {quote(LATEST_COLUMN)} "
            f"FROM {quote(view)} WHERE {plan.change_filter} GROUP BY {keys})")


def merge_sql(plan: MergePlan, target_sql: str, view: str) -> str:
    """The batch's ``MERGE INTO``: the statement every Spark apply of a plan runs, here and in
    :class:`~lakemirror.sinks.merge.delta_merge.DeltaMergeSink` (not Delta's ``DeltaTable`` API)."""
    names = list(plan.assignments)
    sets = ", ".join(f"{TARGET_ALIAS}.{c} = {plan.assignments[c]}" for c in names)
    return (f"MERGE INTO {target_sql} AS {TARGET_ALIAS} USING ({latest_changes_sql(plan, view)}) AS {SOURCE_ALIAS} "
            f"ON {plan.match_condition} "
            f"WHEN MATCHED AND {plan.delete_condition} THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {sets} "
            f"WHEN NOT MATCHED AND {plan.upsert_condition} THEN INSERT ({', '.join(names)}) "
            f"VALUES ({', '.join(plan.assignments[c] for c in names)})")


@dataclass(frozen=True)
class ConnectBatchJob:
    """Everything the server-side batch function needs: plain values only (it is pickled)."""

    target_sql: str
    plan: MergePlan
    app_id: str
    #: Where the batch function writes each batch's outcome (the query's checkpoint's outcome folder).
    outcome_dir: str
    #: The query's turn gate (:mod:`lakemirror.sinks.merge.connect_gate`) and the daemon run that owns
    #: it; None: no turns, every batch is applied as Spark plans it.
    gate_dir: str | None = None
    gate_generation: str = ""
    #: Where a batch records the changes the replica refuses (None: a refused batch fails the query),
    #: the replica's location, and the source table its letters name.
    letters: "FeedDeadLetters | None" = None
    target: "TableLocation | None" = None
    label: str = ""

    @property
    def view(self) -> str:
        return "lakemirror_batch_" + "".join(c if c.isalnum() else "_" for c in self.app_id)

    def bound(self) -> Callable[["DataFrame", int], None]:
        """The function to hand ``foreachBatch``: :func:`apply_batch` bound to this job."""
        return functools.partial(apply_batch, self)


def apply_batch(job: ConnectBatchJob, batch: "DataFrame", batch_id: int) -> None:
    """Apply one micro-batch in the table's turn and write its outcome for the daemon (runs on the
    Connect server); then hold the query until the table's next turn.

    A batch with no change rows writes nothing: it has no checkpoint row (as on every path)."""
    gate = ServerGate(job.gate_dir, job.gate_generation) if job.gate_dir else None
    turn = gate.enter(batch_id) if gate is not None else None
    try:
        started = time.time()
        outcome = merge_batch(job, batch, TxnId(job.app_id, batch_id))
        if outcome.stats.rows_read:
            stats, counts = outcome.stats, outcome.counts
            write_outcome(job.outcome_dir, BatchOutcome(
                batch_id=batch_id, txn_app_id=job.app_id, rows_read=stats.rows_read,
                first_version=stats.first_version, last_version=stats.last_version, inserted=counts.inserted,
                updated=counts.updated, deleted=counts.deleted, replayed=outcome.replayed, started_at=started,
                ended_at=time.time(), min_commit_time=stats.min_commit_time, max_commit_time=stats.max_commit_time,
                dead_letters=[asdict(x) for x in outcome.letters] if isinstance(outcome, ServerOutcome) else []))
    finally:
        if gate is not None and turn is not None:
            gate.leave(turn)
    if gate is not None and turn is not None:
        gate.hold(batch_id, turn)


@dataclass(frozen=True)
class ServerOutcome(MergeOutcome):
    """A batch applied without the changes the replica refused, which it dead-lettered (``letters``)."""

    letters: tuple["FeedLetter", ...] = ()


def merge_batch(job: ConnectBatchJob, batch: "DataFrame", txn: TxnId) -> MergeOutcome:
    """MERGE the batch's winning changes into the replica under ``txn``, in SQL only; refused because
    of a row's value, without the rows refused, which are dead-lettered (see the module docstring)."""
    session = batch.sparkSession
    batch.createOrReplaceTempView(job.view)
    try:
        stats = batch_stats(session, job.view)
        if stats.rows_read == 0:
            return MergeOutcome(stats, ApplyCounts(), replayed=False)
        # A change-feed batch is stable: the MERGE reads it in place, as the classic path's does.
        with scoped_confs(session, STABLE_SOURCE_CONFS):
            try:
                with transaction(session, txn):
                    answer = run_sql(session, merge_sql(job.plan, job.target_sql, job.view)).collect()
            except Exception as exc:
                # Imported here: row isolation MERGEs through delta_merge, which takes this module's SQL.
                from lakemirror.sinks.merge.row_isolation import isolate_batch, refusal_reason

                reason = refusal_reason(exc)
                if reason is None or job.letters is None or job.target is None:
                    raise
                outcome, letters = isolate_batch(batch, txn, reason, job.target, job.plan, job.letters,
                                                 job.label or job.target_sql, time.time)
                return ServerOutcome(outcome.stats, outcome.counts, replayed=outcome.replayed, letters=tuple(letters))
    finally:
        session.catalog.dropTempView(job.view)
    if answer:
        row = answer[0].asDict()
        counts = ApplyCounts(int(row.get("num_inserted_rows") or 0), int(row.get("num_updated_rows") or 0),
                             int(row.get("num_deleted_rows") or 0))
        return MergeOutcome(stats, counts, replayed=False)
    return MergeOutcome(stats, replayed_counts(session, job.target_sql, txn), replayed=True)


def batch_stats(session: "SparkSession", view: str) -> BatchStats:
    row = run_sql(session, f"SELECT count(*) AS n, min({quote(COMMIT_VERSION)}) AS lo, max({quote(COMMIT_VERSION)}) AS hi, "
                           f"max({quote(COMMIT_TIMESTAMP)}) AS ts, min({quote(COMMIT_TIMESTAMP)}) AS ts0 FROM {quote(view)}").collect()[0]
    ts = row["ts"].timestamp() if row["ts"] is not None else None
    ts0 = row["ts0"].timestamp() if row["ts0"] is not None else None
    return BatchStats(int(row["n"] or 0), row["lo"], row["hi"], ts, ts0)


def replayed_counts(session: "SparkSession", target_sql: str, txn: TxnId) -> ApplyCounts:
    """The counts of the earlier commit that applied ``txn`` (found by its ``userMetadata`` tag)."""
    tag = txn.tag().replace("'", "''")
    rows = (run_sql(session, f"DESCRIBE HISTORY {target_sql}").where(f"userMetadata = '{tag}'")
            .select("operationMetrics").limit(1).collect())
    return counts_from_metrics(rows[0]["operationMetrics"]) if rows else ApplyCounts()
