"""The guarded event sink: an event source's decoded batches into one replica per table, each write
under the sequence guard and a transaction id, with the dead letters beside them.

:class:`EventBatchApplier` is the :class:`~lakemirror.sinks.event_contract.EventSink` of Delta replicas
(each table's writer a :class:`~lakemirror.sinks.events.guard_merge.GuardedDeltaSink`, or its history
twin, and the letters a :class:`~lakemirror.sinks.events.dead_letters.DeadLetterTable`) and of their
in-memory twins (:class:`~lakemirror.sinks.events.memory_sink.MemoryEventStore`): the
:class:`~lakemirror.supervisor.events.stream_runner.EventStreamRunner` hands it each decoded micro-batch, and
the operator's skip and replay go through it (:mod:`lakemirror.sinks.events.letter_resolution`):

1. the changes are routed by table and folded per key (:func:`lakemirror.sinks.events.guard_plan.plan_batch`,
   or the history planner); changes the planner refuses become dead letters;
2. each replica takes one guarded write in a session of its own, under the transaction id
   ``lakemirror/<pipeline>/<source>/<table>/<epoch>`` and the batch id; a write the replica refuses
   because of a value is bisected to its poison changes (:func:`~.letter_resolution.apply_isolating`);
3. the dead letters are appended under the batch's own transaction id.

Which replicas it writes is the caller's choice (``replica_for``): Delta tables
(:mod:`lakemirror.sinks.events.delta_sink`) or the in-memory twins
(:func:`lakemirror.sinks.events.memory_sink.memory_event_sink`).
"""


from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence

from lakemirror.sinks.event_contract import EventBatchResult, EventTxn, ExecutorWrites, ReplicaBatch
from lakemirror.sinks.events.dead_letters import DeadLetterRow, DeadLetterStore, LetterReport, StoredLetter
from lakemirror.sinks.events.guard_merge import GuardOutcome
from lakemirror.sinks.events.guard_plan import TablePlan, plan_batch
from lakemirror.sinks.events.history_plan import HISTORY_SCD2, HistoryTablePlan, plan_history_batch
from lakemirror.sinks.events.letter_resolution import apply_isolating, resolve_letters
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import TxnId
from lakemirror.sinks.waits import ServerWait
from lakemirror.sources.change_event import ChangeEvent, Decoded
from lakemirror.sources.event_stream import DecodedBatch, RawEvent

log = logging.getLogger(__name__)


class GuardedSinkSpec(Protocol):
    """What the guarded event sink reads of its event source's spec
    (:class:`lakemirror.supervisor.events.stream_spec.EventStreamSpec`)."""

    @property
    def name(self) -> str: ...
    @property
    def tables(self) -> Sequence[str] | None: ...
    @property
    def history(self) -> str: ...
    @property
    def allow_schema_evolution(self) -> bool: ...
    @property
    def driver_apply(self) -> bool: ...
    @property
    def table_workers(self) -> int: ...
    @property
    def purge_interval_seconds(self) -> float: ...
    @property
    def tombstone_horizon_seconds(self) -> float: ...


class ReplicaWriteFailed(RuntimeError):
    """A replica's write failed for a reason no single change causes; the message names the replica."""


def replica_batch(winners: Iterable[ChangeEvent], inserted: int, updated: int, deleted: int, stale: int,
                  lags: tuple[float, ...], replayed: bool = False) -> ReplicaBatch:
    """One replica's part of a batch, with the basis and newest event time of the ``winners`` it wrote."""
    basis, newest = "", None
    for w in winners:
        if w.basis:
            basis = w.basis
        if w.ts_ms is not None:
            newest = max(newest or 0, w.ts_ms)
    return ReplicaBatch(inserted, updated, deleted, stale, lags, replayed, basis, newest)


class GuardedTableWriter(Protocol):
    """One replica's guarded writes (:class:`~lakemirror.sinks.events.guard_merge.GuardedDeltaSink`,
    :class:`~lakemirror.sinks.events.history_merge.HistoryDeltaSink`, the twin
    :class:`~lakemirror.sinks.events.memory_sink.MemoryGuardedSink`)."""

    def apply(self, session: Any, plan: Any, txn: TxnId) -> GuardOutcome: ...

    def purge(self, session: Any, horizon_seconds: float) -> int: ...


@dataclass(frozen=True)
class TableJob:
    """One table's part of a batch: its plan, its replica's sink, its transaction id, its changes in
    source order (the plan's input, bisected when the replica refuses the write)."""

    table: str
    plan: TablePlan | HistoryTablePlan
    sink: GuardedTableWriter
    txn: TxnId
    changes: tuple[ChangeEvent, ...]


class EventBatchApplier:
    """The guarded event sink (an :class:`~lakemirror.sinks.event_contract.EventSink`): decoded batches
    routed, folded, one guarded write per replica, dead letters (see the module docstring).

    ``replica_for(table)`` makes the writer of ``table``'s replica on its first batch (ValueError:
    the destination cannot hold a table of that name; its changes become dead letters);
    ``session_for(name)`` the session each replica (and ``"__dead_letters"``) is written in;
    ``on_prepare`` runs before each start of the source's query (e.g. the destination schema made)."""

    #: Batches are applied by :meth:`apply` on the driver.
    executor_writes: ExecutorWrites | None = None
    #: The letters are rows this sink reads and updates: the operator's skip and replay are offered.
    resolves_letters = True
    letters_elsewhere = ""

    def __init__(self, spec: GuardedSinkSpec, decoder: Callable[[RawEvent], Decoded], pipeline_id: str,
                 replica_for: Callable[[str], GuardedTableWriter], dead_letters: DeadLetterStore,
                 session_for: Callable[[str], Any], clock: Callable[[], float] = time.time,
                 fault: Callable[[str], None] = lambda point: None,
                 on_prepare: Callable[[], None] = lambda: None) -> None:
        self.spec = spec
        self.decoder = decoder
        self.pipeline_id = pipeline_id
        self.replica_for = replica_for
        self.dead_letters = dead_letters
        self.session_for = session_for
        self.clock = clock
        #: The crash-test hook (EVENT_FAULT_POINTS); a no-op unless the torture harness arms it.
        self.fault = fault
        self.on_prepare = on_prepare
        self.sinks: dict[str, GuardedTableWriter] = {}
        self._last_purge = clock()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def app_prefix(self) -> str:
        """The start of every transaction id this source's writes carry."""
        return f"lakemirror/{self.pipeline_id}/{self.spec.name}"

    def plan(self, changes: Iterable[ChangeEvent]) -> tuple[dict[str, TablePlan | HistoryTablePlan],
                                                            list[tuple[ChangeEvent, str]]]:
        """The per-table plans of ``changes`` (history or current rows, as the source keeps them)."""
        if self.spec.history == HISTORY_SCD2:
            return plan_history_batch(changes)  # type: ignore[return-value]
        return plan_batch(changes)  # type: ignore[return-value]

    def sink_for(self, table: str) -> GuardedTableWriter | None:
        """The writer of ``table``'s replica (made on first use); None when the destination cannot hold
        a table of that name (:attr:`replica_for` refuses it)."""
        sink = self.sinks.get(table)
        if sink is None:
            try:
                sink = self.sinks[table] = self.replica_for(table)
            except ValueError as exc:
                log.warning("%s: no replica for table %r: %s", self.spec.name, table, exc)
                return None
        return sink

    # -- the EventSink contract -------------------------------------------------------------------

    def prepare(self) -> None:
        self.on_prepare()

    def letters(self, ids: Iterable[str] | None = None, messages: bool = True) -> list[StoredLetter]:
        return self.dead_letters.letters(self.session_for("__dead_letters"), ids, messages=messages)

    def resolve_letters(self, verb: str, ids: Sequence[str] | None, table: str | None = None) -> LetterReport:
        return resolve_letters(self, verb, ids, table)

    def wait(self) -> ServerWait | None:
        return None  # the replicas are written by Spark or delta-rs: no server to wait on

    def apply(self, batch: DecodedBatch, txn: EventTxn) -> EventBatchResult:
        """``batch`` into the replicas and the dead letters, exactly once under ``txn``."""
        decoded, batch_id, epoch = batch, txn.batch_id, txn.epoch
        changes, raw_of = decoded.changes, decoded.raw_of
        letters = [DeadLetterRow(raw, letter.reason, letter.table) for raw, letter in decoded.dead_letters]
        plans, refused = self.plan(changes)
        letters += [DeadLetterRow(raw_of(e), reason, e.table, e) for e, reason in refused]
        refused_ids = {id(e) for e, _ in refused}
        self.fault("events_before_merge")
        by_table: dict[str, list[ChangeEvent]] = {}
        for e in changes:
            if id(e) not in refused_ids:
                by_table.setdefault(e.table, []).append(e)
        jobs: list[TableJob] = []
        for table, plan in sorted(plans.items()):
            sink = self.sink_for(table)
            if sink is None:  # a table name the destination cannot hold
                letters += [DeadLetterRow(raw_of(e), f"no replica for table {table!r}: the destination cannot "
                                                     f"hold a table of that name", table, e)
                            for e in by_table.get(table, ())]
                continue
            jobs.append(TableJob(table, plan, sink, TxnId(f"{self.app_prefix}/{table}/{epoch}", batch_id),
                                 tuple(by_table.get(table, ()))))
        outcomes: dict[str, GuardOutcome] = {}
        replicas: dict[str, ReplicaBatch] = {}
        for job, (outcome, committed) in zip(jobs, self._apply_tables(jobs)):
            table = job.table
            outcomes[table] = outcome
            letters += [DeadLetterRow(raw_of(e), reason, table, e) for e, reason in outcome.rejected]
            lags = event_lags(by_table.get(table, ()), committed)
            replicas[table] = replica_batch(job.plan.winners, outcome.counts.inserted, outcome.counts.updated,
                                            outcome.counts.deleted, outcome.stale, lags, outcome.replayed)
        self.fault("events_before_dead_letters")
        self.dead_letters.append(self.session_for("__dead_letters"), letters,
                                 TxnId(f"{self.app_prefix}/dead-letters/{epoch}", batch_id), self.clock())
        self.fault("events_after_dead_letters")
        self._purge_when_due()
        counts = ApplyCounts(sum(o.counts.inserted for o in outcomes.values()),
                             sum(o.counts.updated for o in outcomes.values()),
                             sum(o.counts.deleted for o in outcomes.values()))
        return EventBatchResult(decoded.events, decoded.skipped, len(letters), outcomes, replicas, tuple(letters),
                                counts, replayed=any(o.replayed for o in outcomes.values()))

    def _apply_tables(self, jobs: Sequence[TableJob]) -> list[tuple[GuardOutcome, float]]:
        """Each table's plan applied to its replica (a MERGE under the table's own transaction id, on the
        table's own Spark session), up to ``spec.table_workers`` tables at a time; (outcome, commit time)
        per job, in order. Every table's apply runs to its end before the first error is raised, so a
        replayed batch finds each committed table's transaction id and skips it. A table whose write is
        refused because of a value has its poison changes isolated (:func:`apply_isolating`)."""
        sessions = [self.session_for(job.table) for job in jobs]  # made here: session_for is not thread-safe

        def one(i: int) -> tuple[GuardOutcome, float]:
            job, session = jobs[i], sessions[i]

            def write(part: Sequence[ChangeEvent], txn: TxnId) -> GuardOutcome:
                plan = job.plan if part is job.changes else self.plan(part)[0][job.table]
                return job.sink.apply(session, plan, txn)

            try:
                outcome = apply_isolating(write, job.changes, job.txn, f"{self.spec.name}/{job.table}")
            except Exception as exc:  # not a value's refusal: the batch fails, saying which replica
                first = (str(exc).strip().splitlines() or [""])[0][:500]
                raise ReplicaWriteFailed(f"replica {job.table!r}, batch {job.txn.version}: {type(exc).__name__}: "
                                         f"{first}") from exc
            return outcome, self.clock()

        if self.spec.table_workers <= 1 or len(jobs) <= 1:
            return [one(i) for i in range(len(jobs))]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.spec.table_workers, thread_name_prefix=f"events:{self.spec.name}")
        futures = [self._pool.submit(one, i) for i in range(len(jobs))]
        wait(futures)
        return [f.result() for f in futures]

    def close(self) -> None:
        """Stop the threads that apply tables side by side (the runner's halt; made again on the next batch)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _purge_when_due(self) -> None:
        now = self.clock()
        if now - self._last_purge < self.spec.purge_interval_seconds:
            return
        self._last_purge = now
        for table, sink in self.sinks.items():
            purged = sink.purge(self.session_for(table), self.spec.tombstone_horizon_seconds)
            if purged:
                log.info("%s: purged %d tombstones older than %.0f s", table, purged,
                         self.spec.tombstone_horizon_seconds)


def event_lags(changes: Iterable[ChangeEvent], committed_at: float) -> tuple[float, ...]:
    """Event-time lag of each change that carries its source commit time (``ts_ms``): how long after
    its commit at the source it was committed to the replica (never negative: clocks may differ)."""
    return tuple(max(0.0, committed_at - e.ts_ms / 1000.0) for e in changes if e.ts_ms is not None)
