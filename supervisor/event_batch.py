"""The batch function's body of an event source: decode, route, fold, one guarded write per replica,
dead letters.

:class:`EventBatchApplier` is what :class:`~lakemirror.supervisor.event_stream.EventStreamRunner` calls for
each micro-batch (and what the operator's skip and replay use, :mod:`lakemirror.supervisor.event_letters`):

1. its raw messages are decoded (:mod:`lakemirror.sources.debezium`); tombstones and transaction markers
   are skipped; poison messages become dead letters;
2. the changes are routed by table and folded per key (:func:`lakemirror.sinks.events.guard_plan.plan_batch`,
   or the history planner);
3. each replica takes one guarded write in a session of its own, under the transaction id
   ``lakemirror/<pipeline>/<source>/<table>/<epoch>`` and the batch id; a write the replica refuses
   because of a value is bisected to its poison changes (:func:`~lakemirror.supervisor.event_letters.apply_isolating`);
4. the dead letters are appended under the batch's own transaction id.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence, TYPE_CHECKING

from lakemirror.sinks.events.dead_letters import DeadLetterRow, DeadLetterStore
from lakemirror.sinks.events.guard_merge import GuardedDeltaSink, GuardOutcome
from lakemirror.sinks.events.guard_plan import TablePlan, plan_batch
from lakemirror.sinks.events.history_merge import HistoryDeltaSink
from lakemirror.sinks.events.history_plan import HISTORY_SCD2, HistoryTablePlan, plan_history_batch
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import TxnId
from lakemirror.sources.change_event import ChangeEvent, Decoded
from lakemirror.sources.debezium import FORMAT_DEBEZIUM
from lakemirror.sources.event_stream import RawEvent, decode_batch
from lakemirror.supervisor.event_letters import apply_isolating
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class ReplicaWriteFailed(RuntimeError):
    """A replica's write failed for a reason no single change causes; the message names the replica."""


@dataclass(frozen=True)
class EventStreamSpec:
    """Everything one event source's query needs (built from the YAML's ``source`` block)."""

    name: str
    kind: str                                   # files | kafka
    format: str = FORMAT_DEBEZIUM               # debezium | simple
    path: str | None = None                     # files: the directory of JSON-lines files
    bootstrap_servers: str | None = None        # kafka
    topics: str | None = None                   # kafka: comma-separated topics
    topic_pattern: str | None = None            # kafka: or a pattern
    tables: tuple[str, ...] | None = None       # event tables replicated; None: every table seen
    key_columns: dict[str, tuple[str, ...]] = field(default_factory=dict)  # for events without a key
    tombstone_horizon_seconds: float = 7 * 86400.0
    purge_interval_seconds: float = 3600.0
    allow_schema_evolution: bool = True
    trigger_interval_seconds: float = 5.0
    max_per_trigger: int | None = None          # files or offsets per micro-batch
    history: str = "current"                    # current | scd2 (one row per key version: sinks.events.history_plan)
    table_workers: int = 2                      # tables of one batch applied at the same time
    driver_apply: bool = True                   # local replicas may take a delta-rs MERGE on the driver


@dataclass
class ReplicaStatus:
    """What one replica of an event source has taken so far (status and tests)."""

    batches: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0
    replays: int = 0
    position_basis: str = ""
    last_ts_ms: int | None = None
    last_event_lag_seconds: float | None = None   # the last batch's oldest change: source commit → replica commit


@dataclass(frozen=True)
class ReplicaBatch:
    """What one batch did to one replica (for metrics): rows by operation, guard drops, event-time lags."""

    inserted: int
    updated: int
    deleted: int
    stale: int
    event_lags_seconds: tuple[float, ...]   # per change with a source ts_ms: replica commit time minus ts_ms


@dataclass(frozen=True)
class TableJob:
    """One table's part of a batch: its plan, its replica's sink, its transaction id, its changes in
    source order (the plan's input, bisected when the replica refuses the write)."""

    table: str
    plan: TablePlan | HistoryTablePlan
    sink: GuardedDeltaSink
    txn: TxnId
    changes: tuple[ChangeEvent, ...]


@dataclass(frozen=True)
class EventBatchResult:
    events: int
    skipped: int
    dead_letters: int
    outcomes: dict[str, GuardOutcome]
    replicas: dict[str, ReplicaBatch] = field(default_factory=dict)
    letters: tuple[DeadLetterRow, ...] = ()

    @property
    def counts(self) -> ApplyCounts:
        return ApplyCounts(sum(o.counts.inserted for o in self.outcomes.values()),
                           sum(o.counts.updated for o in self.outcomes.values()),
                           sum(o.counts.deleted for o in self.outcomes.values()))


class EventBatchApplier:
    """The batch function's body: decode, route, fold, one guarded MERGE per replica, dead letters."""

    def __init__(self, spec: EventStreamSpec, decoder: Callable[[RawEvent], Decoded], pipeline_id: str,
                 locate: Callable[[str], TableLocation], dead_letters: DeadLetterStore,
                 session_for: Callable[[str], "SparkSession"], clock: Callable[[], float] = time.time,
                 fault: Callable[[str], None] = lambda point: None) -> None:
        self.spec = spec
        self.decoder = decoder
        self.pipeline_id = pipeline_id
        self.locate = locate
        self.dead_letters = dead_letters
        self.session_for = session_for
        self.clock = clock
        #: The crash-test hook (EVENT_FAULT_POINTS); a no-op unless the torture harness arms it.
        self.fault = fault
        self.sinks: dict[str, GuardedDeltaSink] = {}
        self.replicas: dict[str, ReplicaStatus] = {}
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

    def sink_for(self, table: str) -> GuardedDeltaSink | None:
        """The sink of ``table``'s replica (made on first use); None when the destination cannot hold a
        table of that name (:meth:`locate` refuses it)."""
        sink = self.sinks.get(table)
        if sink is None:
            try:
                location = self.locate(table)
            except ValueError as exc:
                log.warning("%s: no replica for table %r: %s", self.spec.name, table, exc)
                return None
            sink = self.sinks[table] = (HistoryDeltaSink if self.spec.history == HISTORY_SCD2 else GuardedDeltaSink)(
                location, self.spec.allow_schema_evolution, clock=self.clock, fault=self.fault,
                driver_apply=self.spec.driver_apply)
        return sink

    def apply(self, raws: Iterable[RawEvent], batch_id: int, epoch: str) -> EventBatchResult:
        decoded = decode_batch(raws, self.decoder, self.spec.tables)
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
            replicas[table] = ReplicaBatch(outcome.counts.inserted, outcome.counts.updated, outcome.counts.deleted,
                                           outcome.stale, lags)
            self._record(table, job.plan.winners, outcome, lags)
        self.fault("events_before_dead_letters")
        self.dead_letters.append(self.session_for("__dead_letters"), letters,
                                 TxnId(f"{self.app_prefix}/dead-letters/{epoch}", batch_id), self.clock())
        self.fault("events_after_dead_letters")
        self._purge_when_due()
        return EventBatchResult(decoded.events, decoded.skipped, len(letters), outcomes, replicas,
                                tuple(letters))

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
                return job.sink.apply(session, plan, txn)  # type: ignore[arg-type]

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
        """Stop the threads that apply tables side by side (the runner's halt)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _record(self, table: str, winners: Iterable[ChangeEvent], outcome: GuardOutcome,
                lags: tuple[float, ...] = ()) -> None:
        status = self.replicas.setdefault(table, ReplicaStatus())
        if lags:
            status.last_event_lag_seconds = max(lags)
        status.batches += 1
        status.inserted += outcome.counts.inserted
        status.updated += outcome.counts.updated
        status.deleted += outcome.counts.deleted
        status.stale += outcome.stale
        status.replays += outcome.replayed
        for w in winners:
            if w.basis and w.basis != status.position_basis:
                if "last resort" in w.basis:
                    log.warning("%s: events carry no log position; ordered by %s", table, w.basis)
                status.position_basis = w.basis
            if w.ts_ms is not None:
                status.last_ts_ms = max(status.last_ts_ms or 0, w.ts_ms)

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
