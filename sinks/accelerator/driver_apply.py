"""The driver executor: applies one change batch to a replica with a delta-rs MERGE on the driver.

The replica is at a path on the driver's file system, or on S3 through the session's s3a settings
(:func:`lakemirror.object_store.delta_rs_target`), where each commit is a conditional put: a
commit of a version another writer took first is refused by the store, never written over it.

Chosen per table by :mod:`lakemirror.sinks.merge.apply_choice`; the MERGE executor dispatches here. The
batch's rows come to the driver as Arrow: read by delta-rs when the stream's offsets show whole
source versions (:mod:`lakemirror.sinks.accelerator.batch_feed`), otherwise by one Spark action (no
join). The winning change per key is picked there (:mod:`lakemirror.sinks.accelerator.arrow_changes`), and
one delta-rs MERGE writes them; into a replica with deletion vectors on, which delta-rs does not
write, :mod:`lakemirror.sinks.accelerator.dv_merge` marks the changed rows deleted and appends the new ones.
Spark's Delta writer
has a fixed cost per commit (planning, jobs, the log) whatever the batch; this path runs no Spark
job for the write (``make bench ONLY=apply_cost`` times both).

Exactly-once rests on the same Delta transaction id as Spark's paths: the commit carries a ``txn``
action (app id, batch id) and the batch's tag as ``userMetadata``, so Spark's MERGE (when the
table later switches to it) and this path recognise each other's commits. A batch whose
transaction the replica already holds is a replay: nothing is written, and its counts are those
of the commit that carries its tag. A batch that changes nothing still commits its transaction
(an empty commit), so its replay is recognised like any other.

A batch with more applicable rows (preimages aside) than the driver's share
(:meth:`ApplyChoice.driver_batch_rows`) is left to Spark: :meth:`DriverApply.apply` answers None
before anything is written. A batch delta-rs refuses without committing (a type it cannot write,
say) raises :class:`DriverUnfit`, and the table is applied by Spark from then on: the driver path
may make a table faster, never stuck.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypedDict

from lakemirror.delta_log.commit_hooks import after_commit, deferred_hooks
from lakemirror.sinks.accelerator.arrow_changes import batch_stats, winning_changes
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.merge.planner import CDF_COLUMNS, DELETE, OP_COLUMN, SOURCE_ALIAS, TARGET_ALIAS, MergePlan
from lakemirror.sinks.txn import (READ_BY_DELTA_RS, READ_BY_SPARK, WRITE_DELTA_RS, WRITE_DRIVER_DV, BatchStats,
                                  MergeOutcome, TxnId, counts_from_metrics)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: A batch's change rows read without Spark (``columns``, preimages left out, at most ``max_rows``),
#: or None when Spark is to read them (:class:`lakemirror.sinks.accelerator.batch_feed.BatchFeed`).
ChangeReader = Callable[[Sequence[str], int], "pa.Table | None"]

#: The memory delta-rs's MERGE may hold before it spills to disk (DataFusion's pool; its default has no
#: bound, so one large batch could take the driver's memory).
DRIVER_MERGE_MEMORY_BYTES = 1024 * 1024 * 1024

#: How many of the replica's newest commits are searched for a replayed batch's tag before all.
RECENT_COMMITS = 100

#: How delta-rs reaches a table: its URI and storage options (credentials: never logged), as
#: :func:`lakemirror.object_store.delta_rs_target` answers.
Target = tuple[str, dict[str, str]]

#: The crash point right after the driver's commit of a batch is durable, before its checkpoint row
#: (``supervisor/change_feed/table_runner.py``, ``FAULT_POINTS``).
AFTER_DRIVER_COMMIT = "after_driver_commit"


def sql_name(name: str) -> str:
    """A column name as DataFusion SQL reads it: double-quoted, case kept."""
    return '"' + name.replace('"', '""') + '"'


def commit_properties(txn: TxnId) -> Any:
    """A delta-rs commit's Delta transaction id (app id, batch id) and the batch's tag as ``userMetadata``:
    what Spark's ``txnAppId``/``txnVersion`` confs and commit tag record, so either engine finds the other's."""
    from deltalake import CommitProperties, Transaction

    return CommitProperties(app_transactions=[Transaction(txn.app_id, txn.version)],
                            custom_metadata={"userMetadata": txn.tag()})


class Paths(TypedDict):
    """Which engine read a batch and which wrote it (``MergeOutcome.read`` / ``.write``)."""

    read: str
    write: str


class DriverUnfit(Exception):
    """delta-rs refused a batch and committed nothing: the table goes back to Spark's apply."""


class DriverApply:
    """Change batches applied on the driver to the replica at ``target`` (a local path, or an S3
    URI and its storage options): by delta-rs MERGEs, or by deletion vectors (``deletion_vectors``,
    local replicas only). ``fault`` is the crash-test hook, called at :data:`AFTER_DRIVER_COMMIT`."""

    def __init__(self, target: "Target | str", plan: MergePlan, max_rows: int, deletion_vectors: bool = False,
                 fault: Callable[[str], None] = lambda point: None) -> None:
        self.path, self.options = (target, {}) if isinstance(target, str) else target
        self.plan = plan
        self.max_rows = max_rows
        self.fault = fault
        #: Set when the replica has deletion vectors on: batches mark changed rows deleted instead.
        self.dv: Any = None
        if deletion_vectors:
            from lakemirror.sinks.accelerator.dv_merge import DeletionVectorMerge

            if self.options:
                raise ValueError(f"{self.path}: deletion vectors are written on the driver only for local replicas")
            self.dv = DeletionVectorMerge(self.path, plan.keys, plan.column_names)
        #: The replica's delta-rs table, brought up to date before each batch (it reads only the
        #: commits since; a sink lives for one launch of the table's stream, as does this).
        self._table: Any = None
        #: What the last commit left due (:func:`~lakemirror.delta_log.commit_hooks.after_commit`) until
        #: its batch's outcome runs it, else the next batch does.
        self._upkeep: Callable[[], None] | None = None
        by_name = {c.name: c for c in plan.columns}
        # Each comparison in parentheses: delta-rs's parser binds AND tighter than IS NOT DISTINCT FROM.
        self.predicate = " AND ".join(
            f"({TARGET_ALIAS}.{sql_name(k)} {'IS NOT DISTINCT FROM' if by_name[k].nullable else '='} "
            f"{SOURCE_ALIAS}.{sql_name(k)})" for k in plan.keys)

    @property
    def wanted_columns(self) -> list[str]:
        """The columns of a batch's change rows the driver needs: the replicated ones and the feed's own."""
        return [*self.plan.column_names, *CDF_COLUMNS]

    def apply(self, batch: "DataFrame", txn: TxnId, recount: Callable[[], ApplyCounts],
              read: ChangeReader | None = None) -> MergeOutcome | None:
        """Apply ``batch`` (raw change-feed rows) under ``txn``; None if it is too large for the
        driver (nothing was written: apply it with Spark). ``recount`` gives a replayed batch's
        counts when the commit that applied it first records none (a Spark rewrite's). ``read``,
        when given, reads the batch's rows without Spark (or answers None: Spark reads them)."""
        wanted = self.wanted_columns
        changes = read(wanted, self.max_rows) if read is not None else None
        read_by = READ_BY_SPARK if changes is None else READ_BY_DELTA_RS
        if changes is None:
            # Preimages are never applied: the plan's change filter (the Spark paths' own) leaves them
            # in Spark, saving their conversion to Arrow and their trip to the driver (a third of a
            # catch-up batch's read; batch_stats still counts them).
            changes = (batch.select(*[f"`{c.replace('`', '``')}`" for c in wanted])
                       .where(self.plan.change_filter)
                       .limit(self.max_rows + 1).toArrow())
        return self.apply_changes(changes, txn, recount, read_by)

    def apply_changes(self, changes: "pa.Table", txn: TxnId, recount: Callable[[], ApplyCounts],
                      read_by: str = READ_BY_DELTA_RS) -> MergeOutcome | None:
        """Apply a batch's change rows already on the driver (``wanted_columns``, preimages left out)
        under ``txn``; None if there are more than the driver takes (nothing was written)."""
        how = Paths(read=read_by, write=WRITE_DELTA_RS if self.dv is None else WRITE_DRIVER_DV)
        self.upkeep()  # left by the last batch if its caller did not run it
        if changes.num_rows > self.max_rows:
            log.info("%s: a batch of more than %d change rows is applied by Spark, not on the driver",
                     self.path, self.max_rows)
            return None
        stats = batch_stats(changes, preimages_dropped=True)
        if stats.rows_read == 0:
            return MergeOutcome(stats, ApplyCounts(), replayed=False, **how)
        if self.dv is not None:  # it finds a replay in the replica's log itself
            return self._apply_dv(winning_changes(changes, self.plan.keys, self.plan.column_names), txn, stats,
                                  how, recount)
        replica = self._replica()
        read_version = replica.version()
        committed = replica.transaction_version(txn.app_id)
        if committed is not None and committed >= txn.version:
            counts = self._replayed_counts(replica, txn)
            return MergeOutcome(stats, counts if counts is not None else recount(), replayed=True, **how)
        winners = winning_changes(changes, self.plan.keys, self.plan.column_names)
        try:
            metrics = self._merge(replica, winners, txn)
        except Exception as exc:
            self._table = None  # whatever delta-rs holds now, the next batch loads the replica afresh
            if self._committed(txn):
                raise  # it landed after all: the retry finds it as a replay
            raise DriverUnfit(f"{self.path}: delta-rs could not apply batch {txn.version}: {exc}") from exc
        if replica.version() == read_version:
            self._commit_empty(replica, txn)  # the MERGE changed no file, so delta-rs committed nothing
        self._upkeep = after_commit(replica, replica.version(), self.path)
        self.fault(AFTER_DRIVER_COMMIT)
        return MergeOutcome(stats, counts_from_metrics(metrics), replayed=False, upkeep=self.upkeep, **how)

    def upkeep(self) -> None:
        """Run what the last commit left due (a checkpoint, the log's clean-up), once; never raises.
        A batch's commit runs no hook itself, so that the batch counts as applied once it is visible."""
        due, self._upkeep = self._upkeep, None
        if due is not None:
            due()

    def _apply_dv(self, winners: "pa.Table", txn: TxnId, stats: BatchStats, how: "Paths",
                  recount: Callable[[], ApplyCounts]) -> MergeOutcome:
        """``winners`` marked in the replica by deletion vectors (:mod:`lakemirror.sinks.accelerator.dv_merge`),
        or found applied already (a replay: the counts of the commit that applied them)."""
        from lakemirror.sinks.accelerator.dv_merge import DvUnfit

        try:
            counts = self.dv.merge(winners, txn)
        except DvUnfit as exc:
            raise DriverUnfit(f"{self.path}: batch {txn.version} cannot be applied by deletion vectors: {exc}") from exc
        except Exception as exc:
            self._table = None
            if self._committed(txn):
                raise
            raise DriverUnfit(f"{self.path}: the deletion-vector apply of batch {txn.version} failed: {exc}") from exc
        if counts is None:  # the replica holds the batch's transaction already
            replayed = self._replayed_counts(self._replica(), txn)
            return MergeOutcome(stats, replayed if replayed is not None else recount(), replayed=True, **how)
        self.fault(AFTER_DRIVER_COMMIT)
        return MergeOutcome(stats, counts, replayed=False, **how)

    def _replica(self) -> Any:
        from deltalake import DeltaTable

        if self._table is not None:
            try:
                self._table.update_incremental()
                return self._table
            except Exception:  # noqa: BLE001 (load it afresh)
                self._table = None
        self._table = DeltaTable(self.path, storage_options=self.options or None)
        return self._table

    def _committed(self, txn: TxnId) -> bool:
        from deltalake import DeltaTable

        return DeltaTable(self.path, storage_options=self.options or None).transaction_version(txn.app_id) == txn.version

    def _merge(self, replica: Any, winners: Any, txn: TxnId) -> dict[str, Any]:
        op = f"{SOURCE_ALIAS}.{sql_name(OP_COLUMN)}"
        merger = (replica.merge(winners, self.predicate, source_alias=SOURCE_ALIAS, target_alias=TARGET_ALIAS,
                                max_spill_size=DRIVER_MERGE_MEMORY_BYTES, commit_properties=commit_properties(txn),
                                post_commithook_properties=deferred_hooks())
                  .when_matched_delete(f"{op} = '{DELETE}'")
                  .when_matched_update_all(f"{op} <> '{DELETE}'", except_cols=[OP_COLUMN])
                  .when_not_matched_insert_all(f"{op} <> '{DELETE}'", except_cols=[OP_COLUMN]))
        return dict(merger.execute())

    def _commit_empty(self, replica: Any, txn: TxnId) -> None:
        replica.create_write_transaction([], "append", replica.schema(), commit_properties=commit_properties(txn),
                                         post_commithook_properties=deferred_hooks())

    @staticmethod
    def _replayed_counts(replica: Any, txn: TxnId) -> ApplyCounts | None:
        """The counts of the earlier MERGE that applied ``txn`` (found by its tag; either engine's);
        None when that commit was not a MERGE; none (as Spark's MERGE path) if no commit carries it."""
        tag = txn.tag()
        for limit in (RECENT_COMMITS, None):
            for commit in replica.history(limit):
                if commit.get("userMetadata") == tag:
                    return counts_from_metrics(commit.get("operationMetrics")) if commit.get("operation") == "MERGE" \
                        else None
        return ApplyCounts()
