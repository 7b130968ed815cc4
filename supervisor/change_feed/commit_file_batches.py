"""A table's batches read from its source's commit files and applied on the driver, between Spark's.

For a table whose replica takes the driver path (:mod:`lakemirror.sinks.merge.apply_choice`) and
whose source delta-rs reads (on the driver's file system, or in S3 through the session's s3a
settings), a turn first asks :meth:`FeedBatches.take` for the table's next batch. It is planned from
the commit files (:mod:`lakemirror.sources.feed_plan`): the source's versions since the last batch
the checkpoint logged, when they are few and plain. Its change rows are read by delta-rs
(:class:`lakemirror.sources.driver_feed.DriverFeed`) and applied as Spark's batch function applies a
batch (:class:`lakemirror.supervisor.change_feed.batch_apply.BatchApply`: the same checks, crash points,
transaction id and checkpoint row), with the query's own log written around it as Spark would
(:mod:`lakemirror.checkpoints.stream_log`): its offsets before the replica's commit, its commit after
the checkpoint row. No Spark job runs for such a batch: ``DeltaSource`` builds no snapshot.

A batch's checkpoint row is handed to the pipeline's row writer
(:class:`~lakemirror.checkpoints.round_rows.RoundRows`), which appends the rows of several tables' batches
in one commit while the apply worker takes the next table's turn; the batch's commit is written to
the query's log once its row is durable, and the table's next turn waits for that. A crash before
it replays the batch: its transaction is on the replica, so nothing is written twice, and its row
is appended unless it is there. A row that cannot be appended fails the table at its next turn,
as a failed append in the turn did.

Anything else (the epoch's first batch, a backlog, a commit that is not plain, a batch the driver does
not take) is answered with the reason, and the turn starts the table's query for Spark to plan it
(:mod:`lakemirror.supervisor.change_feed.turn_taker`), from the same log: a batch logged here and not applied
is re-run by Spark with the same offsets, under the same transaction id.

The source is the one the epoch was bootstrapped from: its table id is read with its log, and the
commit file of the last version a batch applied is read again before the next one, so a table
dropped and recreated under the same location (whose commits reuse the version numbers) is caught
before its versions are taken for the old table's.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from lakemirror.checkpoints.records import CheckpointRow
from lakemirror.checkpoints.round_rows import RoundRows
from lakemirror.checkpoints.stream_log import MIN_BATCHES_TO_RETAIN, StreamLog
from lakemirror.delta_log.commit_files import StoreCommitActions
from lakemirror.delta_log.stream_offsets import VersionRange
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import READ_BY_DELTA_RS, WRITE_DELTA_RS, BatchStats, MergeOutcome, TxnId, run_upkeep
from lakemirror.sources.driver_feed import DriverFeed, FeedTooLarge, FeedUnfit
from lakemirror.sources.feed_plan import plan_feed_batch
from lakemirror.supervisor.apply_workers.worker_pool import ONE_BATCH_VERSIONS
from lakemirror.supervisor.change_feed.batch_apply import BatchApply, HandOver
from lakemirror.supervisor.change_feed.shared_state import TableLive

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from lakemirror.sinks.merge.delta_merge import DeltaMergeSink

log = logging.getLogger(__name__)


@dataclass
class FeedCounts:
    """Batches of a launch: read from the commit files, or left to Spark's plan (and the latest reason)."""

    from_commit_files: int = 0
    by_spark: int = 0
    last_spark_reason: str | None = None
    reasons: dict[str, int] = field(default_factory=dict)


class RowInFlight:
    """A batch applied whose checkpoint row the row writer is appending; once the row is durable the
    batch's commit is written to the query's log (``commit``), and the batch is settled."""

    def __init__(self, txn: TxnId, commit: Callable[[], None]) -> None:
        self.txn = txn
        self._commit = commit
        self._settled = threading.Event()
        self.handed_in = False
        self.error: BaseException | None = None

    def durable(self) -> None:
        try:
            self._commit()
        except Exception as exc:  # noqa: BLE001 (the owner's next turn raises it)
            self.error = exc
        self._settled.set()

    def failed(self, exc: BaseException) -> None:
        self.error = exc
        self._settled.set()

    @property
    def settled(self) -> bool:
        return self._settled.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._settled.wait(timeout)


class FeedBatches:
    """The batches of one table's epoch that the daemon plans and applies (see the module docstring)."""

    def __init__(self, *, label: str, checkpoint: str, source: tuple[str, dict[str, str]], sink: "DeltaMergeSink",
                 apply_batch: BatchApply, app_id: str, epoch: int, after_version: int, source_table_id: str | None,
                 live: TableLive, read_range: Callable[[VersionRange], "DataFrame"], session: Any = None,
                 window: int = ONE_BATCH_VERSIONS, rows: RoundRows | None = None) -> None:
        """``rows``: the pipeline's row writer (None: each batch appends its row on the worker's thread)."""
        self.label = label
        self.log = StreamLog(checkpoint)
        self.feed = DriverFeed(*source)
        self.commits = StoreCommitActions(*source)
        self.sink = sink
        self.apply_batch = apply_batch
        self.app_id = app_id
        self.epoch = epoch
        self.after_version = after_version
        self.source_table_id = source_table_id
        self.live = live
        #: The batch's change rows read by Spark, for the counts of a replay a Spark rewrite applied first.
        self.read_range = read_range
        self.session = session
        self.window = window
        self.counts = FeedCounts()
        #: The last version a batch applied and its commit file's digest (a recreated source differs).
        self._last_applied: tuple[int, str] | None = None
        self.rows = rows
        #: The last batch's checkpoint row while the row writer has it (None: settled and seen).
        self._row_in_flight: RowInFlight | None = None

    @property
    def settled(self) -> bool:
        """Whether the last batch's row is written (or failed): a turn would not wait for it."""
        row = self._row_in_flight
        return row is None or row.settled

    def wait_settled(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) for the last batch's row. False: still being appended then."""
        row = self._row_in_flight
        return row is None or row.wait(max(0.0, timeout))

    def _settle(self) -> None:
        """Wait for the last batch's row and its commit in the query's log; raise what failed them
        (recorded as the batch's failure: the table fails, and its relaunch replays the batch)."""
        row = self._row_in_flight
        if row is None:
            return
        row.wait()
        self._row_in_flight = None
        if row.error is not None:
            self.apply_batch.record_failure(row.error, row.txn)
            raise row.error

    def take(self) -> str | None:
        """Apply the table's next batch from the commit files: None when done (a batch applied, or the
        source has nothing new), else why Spark is to plan the turn's batch."""
        self._settle()
        self.sink.ensure_chosen()
        if self.sink.driver is None:  # delta-rs refused a batch, or the replica outgrew the driver's limit
            return self._to_spark("the replica is no longer applied on the driver")
        latest, table_id = self._source()
        plan = plan_feed_batch(latest_offsets=self.log.latest_offsets(), latest_commit=self.log.latest_commit(),
                               offset_of=self.log.source_offset, latest_version=latest,
                               after_version=self.after_version, table_id=table_id, shape=self.commits.shape,
                               window=self.window)
        if plan.spark is not None:
            return self._to_spark(plan.spark)
        if plan.batch is None:
            return None
        batch, txn = plan.batch, TxnId(self.app_id, plan.batch.batch_id)
        record = self.apply_batch.record
        changes: "pa.Table | None" = None
        if not batch.versions.empty and (record is None or not record.holds(batch.batch_id)):
            try:
                changes = self.feed.read(batch.versions, self.sink_columns(), self.max_rows(), table_id, update=False)
            except FeedTooLarge:
                return self._to_spark(f"versions {batch.versions.first}-{batch.versions.last} hold more change rows "
                                      f"than the driver takes ({self.max_rows()})")
            except FeedUnfit as exc:
                return self._to_spark(str(exc))
            except Exception as exc:  # noqa: BLE001 (any failure of the fast read: Spark's plan is exact)
                log.warning("table %s: delta-rs could not read versions %d-%d: %s", self.label,
                            batch.versions.first, batch.versions.last, exc)
                return self._to_spark(f"delta-rs could not read versions {batch.versions.first}-"
                                      f"{batch.versions.last}")
        if batch.end_offset is not None:
            metadata = self.log.batch_metadata(batch.batch_id - 1)
            if metadata is None:
                return self._to_spark(f"the batch metadata of batch {batch.batch_id - 1} cannot be read")
            self.log.write_offsets(batch.batch_id, batch.end_offset, metadata)
        expected = self.source_table_id
        batch_id = batch.batch_id

        def commit() -> None:
            self.log.write_commit(batch_id)
            self.log.purge(batch_id - MIN_BATCHES_TO_RETAIN + 1)

        def commit_after_row() -> None:
            self.apply_batch.fault("before_commit_log")
            commit()

        in_flight = RowInFlight(txn, commit_after_row)
        try:
            outcome = self.apply_batch.run(
                txn, self.epoch, lambda: self._apply(changes, txn, batch.versions),
                lambda: self.apply_batch.check_same_source(expected, None, lambda: table_id), self.session,
                defer=(lambda row: self._hand_in(row, in_flight)) if self.rows is not None else None)
        except HandOver as exc:
            # Its offsets are logged: the query Spark starts now re-runs it with them, under the same txn.
            return self._to_spark(f"batch {batch.batch_id}: {exc}")
        if in_flight.handed_in:
            self._row_in_flight = in_flight  # its commit is written once its row is durable
        else:
            commit()
        if not batch.versions.empty:
            self.live.advance(batch.versions.last)
            fingerprint = self.commits.fingerprint(batch.versions.last)
            self._last_applied = (batch.versions.last, fingerprint) if fingerprint is not None else None
        self.counts.from_commit_files += 1
        run_upkeep(outcome)  # the replica's checkpoint, if due, once the batch counts as applied
        return None

    def _hand_in(self, row: CheckpointRow, in_flight: RowInFlight) -> None:
        assert self.rows is not None
        self.rows.submit(row, in_flight.durable, in_flight.failed)
        in_flight.handed_in = True

    def sink_columns(self) -> list[str]:
        driver = self.sink.driver
        assert driver is not None  # the wiring takes this path only for a driver sink
        return driver.wanted_columns

    def max_rows(self) -> int:
        driver = self.sink.driver
        return driver.max_rows if driver is not None else 0

    def _source(self) -> tuple[int, str]:
        """The source's newest version and table id, read since the last look; loaded afresh when the
        commit file of the last version applied is not what it was (the table was recreated)."""
        if self._last_applied is not None:
            version, digest = self._last_applied
            if self.commits.fingerprint(version, fresh=True) != digest:
                log.warning("table %s: the commit file of version %d changed: reading the source afresh",
                            self.label, version)
                self.feed.reload()
                self.commits = StoreCommitActions(self.commits.uri, self.feed.options)
                self._last_applied = None
        return self.feed.latest()

    def _apply(self, changes: "pa.Table | None", txn: TxnId, versions: VersionRange) -> MergeOutcome:
        if changes is None:  # whole versions without a change row to read
            return MergeOutcome(BatchStats(0, None, None, None), ApplyCounts(), replayed=False,
                                read=READ_BY_DELTA_RS, write=WRITE_DELTA_RS)
        sink = self.sink

        def recount() -> ApplyCounts:
            from lakemirror.sinks.merge.delta_rewrite import ReplicaRewrite

            batch = self.read_range(versions)
            return ReplicaRewrite(sink.target, sink.plan).recount(batch.sparkSession, txn.tag(),
                                                                  sink.latest_changes(batch)).counts

        outcome = sink.apply_changes(changes, txn, recount)
        if outcome is None:
            raise HandOver(sink.batch_note or "the driver does not apply it")
        return outcome

    def _to_spark(self, reason: str) -> str:
        self.counts.by_spark += 1
        self.counts.last_spark_reason = reason
        key = reason.split(":")[0][:80]
        self.counts.reasons[key] = self.counts.reasons.get(key, 0) + 1
        log.debug("table %s: Spark plans this batch: %s", self.label, reason)
        return reason
