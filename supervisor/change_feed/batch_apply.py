"""One micro-batch of one table, applied exactly once and recorded after it is durable.

:class:`BatchApply` is what every way of running a table's query calls from its batch function
(always on, gated turns, started turns). Per batch, under the table's batch lock:

1. refuse the batch (:class:`Drained`) when a drain was requested: nothing is applied;
2. refuse a batch read from a different table than the replica mirrors (a source dropped and
   recreated under its name while streaming: :class:`~lakemirror.errors.SourceReplaced`);
3. apply it through the replica's batch sink under its transaction id, or skip it unread when
   the replica's own log already holds it (:mod:`lakemirror.supervisor.offline.replica_transactions`);
4. move the table's applied version (what its lag is priced from) as soon as the replica holds it;
5. append its checkpoint row, after the write and before Spark's commit log (or hand it to a writer
   of its own, ``defer``, whose caller writes the commit log once the row is durable);
6. report it (:class:`~lakemirror.supervisor.change_feed.shared_state.BatchReport`);
7. then run what the replica's commit left due (a checkpoint: ``MergeOutcome.upkeep``), so that
   it does not hold back the moment the batch counts as applied.

A failure is translated once (:func:`~lakemirror.supervisor.control.classify_errors.classify`), recorded as a
degraded checkpoint row and raised, so Spark fails the query and the supervisor sees it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from lakemirror.checkpoints.records import CheckpointRow, CheckpointStore, commit_time
from lakemirror.checkpoints.state import TableProgress
from lakemirror.errors import SourceReplaced
from lakemirror.sinks.contract import BatchSink
from lakemirror.sinks.txn import MergeOutcome, TxnId, run_upkeep
from lakemirror.supervisor.change_feed.shared_state import TableLive
from lakemirror.supervisor.control.classify_errors import classify
from lakemirror.supervisor.offline import replica_transactions

log = logging.getLogger(__name__)

#: Pauses between re-reads of an unreadable source's table id (7.5 s in all).
SOURCE_ID_RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0)


def replay_note(outcome: MergeOutcome) -> str:
    """How a replayed batch was found already written, by the apply path that found it."""
    if outcome.replay_note is not None:
        return outcome.replay_note
    if outcome.write == replica_transactions.WRITE_NOTHING:
        return "the replica's Delta log records it, so it was skipped unread"
    return "Delta skipped the write (its transaction id was committed)"


class Drained(Exception):
    """Raised inside a batch that begins after a drain was requested: nothing was applied."""


class HandOver(Exception):
    """Raised by a batch's apply that wrote nothing and leaves the batch to Spark (the message says why)."""


@dataclass(frozen=True)
class RowWriter:
    """Builds and appends one table's checkpoint rows (batches, failures, resyncs)."""

    pipeline_id: str
    source: str
    destination: str
    checkpoints: CheckpointStore
    clock: Callable[[], float]
    #: The runner's own Spark session (None for in-memory stores), for the store's reads.
    session: Callable[[], Any] = lambda: None

    def batch_row(self, txn: TxnId, epoch: int, outcome: MergeOutcome, started: float,
                  lag_seconds: float | None, ended: float | None = None) -> CheckpointRow:
        return CheckpointRow(
            pipeline_id=self.pipeline_id, source_fqn=self.source, dest_fqn=self.destination,
            epoch=epoch, batch_id=txn.version, txn_app_id=txn.app_id,
            first_version=outcome.stats.first_version, last_version=outcome.stats.last_version,
            last_committed_version=outcome.stats.last_version, rows_read=outcome.stats.rows_read,
            rows_merged=outcome.counts.total, rows_inserted=outcome.counts.inserted,
            rows_updated=outcome.counts.updated, rows_deleted=outcome.counts.deleted,
            lag_seconds=lag_seconds, error=None, degraded=False,
            started_at=datetime.fromtimestamp(started, tz=timezone.utc),
            ended_at=datetime.fromtimestamp(self.clock() if ended is None else ended, tz=timezone.utc),
            first_version_at=commit_time(outcome.stats.min_commit_time),
            last_version_at=commit_time(outcome.stats.max_commit_time))

    def record_event(self, error: str, progress: TableProgress, *, degraded: bool, applied_through: int | None,
                     lag_seconds: float | None, batch_id: int = -1, txn_app_id: str = "") -> None:
        """A checkpoint row that records a failure or a resync (best effort: never masks the cause)."""
        now = datetime.fromtimestamp(self.clock(), tz=timezone.utc)
        row = CheckpointRow(
            pipeline_id=self.pipeline_id, source_fqn=self.source, dest_fqn=self.destination,
            epoch=progress.epoch, batch_id=batch_id, txn_app_id=txn_app_id, first_version=None,
            last_version=None, last_committed_version=applied_through if degraded else progress.bootstrap_version,
            rows_read=0, rows_merged=0, rows_inserted=0, rows_updated=0, rows_deleted=0,
            lag_seconds=lag_seconds, error=error[:4000], degraded=degraded, started_at=now, ended_at=now)
        try:
            self.checkpoints.append(row, self.session())
        except Exception as exc:
            log.warning("table %s: could not record %r in the checkpoint table: %s", self.source, error[:80], exc)


class BatchApply:
    """The batch function's body for one table (see the module docstring)."""

    def __init__(self, live: TableLive, identity: Callable[[Any], str | None], rows: RowWriter, *,
                 load_progress: Callable[[], TableProgress], lag_seconds: Callable[[], float | None],
                 clock: Callable[[], float], sleep: Callable[[float], None], fault: Callable[[str], None]) -> None:
        self.live = live
        #: The source's table id as read for a batch (:meth:`~lakemirror.sources.contract.ChangeSource.identity`).
        self.identity = identity
        self.rows = rows
        self.load_progress = load_progress
        self.lag_seconds = lag_seconds
        self.clock = clock
        self.sleep = sleep
        self.fault = fault
        self.lock = threading.Lock()
        #: What the replica's own log records of the epoch at launch (None: unread or unreadable): a
        #: replay of a batch it holds is skipped unread (:mod:`lakemirror.supervisor.offline.replica_transactions`).
        self.record: replica_transactions.ReplicaRecord | None = None

    def wait_idle(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) for the batch in flight; the lock is not kept. False: still running then."""
        if self.lock.acquire(timeout=max(0.0, timeout)):
            self.lock.release()
            return True
        return False

    def __call__(self, sink: BatchSink[Any], txn: TxnId, batch: Any, epoch: int,
                 source_table_id: str | None = None, read: Any = None) -> None:
        outcome = self.run(txn, epoch, lambda: sink.apply(batch, txn, read),
                           lambda: self.check_same_source(source_table_id, batch), getattr(batch, "sparkSession", None))
        run_upkeep(outcome)

    def run(self, txn: TxnId, epoch: int, apply: Callable[[], MergeOutcome], check_source: Callable[[], None],
            spark: Any = None, defer: Callable[[CheckpointRow], None] | None = None) -> MergeOutcome:
        """Apply one batch (``apply``, after ``check_source``) under ``txn`` and record it (see the module
        docstring); a :class:`HandOver` raised by ``apply`` (nothing written) passes through unrecorded.
        ``defer``: takes the checkpoint row of a fresh batch instead of this thread appending it (a
        replayed batch's row is looked for and appended here either way)."""
        label = self.rows.source
        with self.lock:
            if self.live.draining:
                raise Drained(f"{label}: draining; batch {txn.version} left for the next run")
            started = self.clock()
            try:
                check_source()
                self.fault("before_merge")
                record = self.record
                if record is not None and record.holds(txn.version):
                    # The replica's log holds this batch: nothing to read (its change files may be gone).
                    outcome = replica_transactions.replayed_outcome(record.through_after(txn.version))
                else:
                    outcome = apply()
                # The replica holds the batch from here on: its lag counts from the next version now,
                # not once the checkpoint row below is also written (on an object store, a commit of
                # its own that would otherwise show the replica a batch behind for its whole length).
                self.live.advance(outcome.stats.last_version)
                if outcome.replayed:
                    log.info("table %s: batch %d of %s was already committed to the replica (a restart "
                             "replays it); %s", label, txn.version, txn.app_id, replay_note(outcome))
                if outcome.stats.rows_read:
                    self.fault("after_merge")
                    row = self.rows.batch_row(txn, epoch, outcome, started, self.lag_seconds())
                    if defer is not None and not outcome.replayed:
                        defer(row)
                    else:
                        # After a fresh MERGE no earlier attempt can have written this batch's row.
                        self.rows.checkpoints.append(row, spark, known_new=not outcome.replayed)
                        self.fault("before_commit_log")
                elif outcome.replayed and outcome.stats.last_version is not None:
                    # The replica's last batch, skipped unread: the crash that replays it may have come
                    # before its checkpoint row was appended; the row is appended unless it is there.
                    self.rows.checkpoints.append(self.rows.batch_row(txn, epoch, outcome, started, self.lag_seconds()),
                                                 spark, known_new=False)
            except HandOver:
                raise
            except Exception as exc:
                self.record_failure(exc, txn)
                raise
            self.live.batch_done(txn.version, outcome, started, self.clock())
            return outcome

    def record_failure(self, exc: BaseException, txn: TxnId) -> None:
        """Keep the failure of batch ``txn`` for the table's report and record it as a degraded row."""
        self.live.batch_error = classify(exc, table=self.rows.source)
        self.rows.record_event(str(self.live.batch_error), self.load_progress(), degraded=True,
                               applied_through=self.live.applied_through, lag_seconds=self.lag_seconds(),
                               batch_id=txn.version, txn_app_id=txn.app_id)

    def check_same_source(self, expected: str | None, batch: Any,
                          current: Callable[[], str | None] | None = None) -> None:
        """Refuse a batch read from a different table than the replica mirrors.

        A source dropped and recreated under its name while the stream runs has new version
        numbers that the stream would silently continue from (skipping the new table's first
        versions). Spark planned this batch's files before calling us, so a table id still equal
        to the one bootstrapped from proves the batch came from that table.
        """
        if expected is None:
            return
        found = current() if current is not None else self.settled_identity(batch)
        if found != expected:
            label = self.rows.source
            raise SourceReplaced(
                f"{label}: the source was dropped and recreated while streaming (table id {expected} "
                f"is now {found}); the batch was refused and the replica no longer follows it. "
                f"Resync the table.", table=label)

    def settled_identity(self, batch: Any) -> str | None:
        """The source's table id, read again while the table cannot be described.

        A table being dropped and recreated under its name cannot be described for a moment
        (its log files vanish while Delta reads them). Taking that for an expired change window
        would misname the cause; once the new table is there its new id names it. An error that
        outlasts the retries is raised as it is (and still ends in a resync or a failed table).
        """
        for delay in SOURCE_ID_RETRY_DELAYS:
            try:
                return self.identity(batch)
            except Exception as exc:  # noqa: BLE001 (re-raised below if it persists)
                log.info("table %s: cannot describe the source (%s); reading its id again in %.1f s",
                         self.rows.source, str(exc).splitlines()[0][:200], delay)
                self.sleep(delay)
        return self.identity(batch)
