"""One Structured Streaming query per event source, fanned out to one guarded MERGE per replica.

An event source (JSON-lines files or Kafka topics carrying Debezium or the seed's simple events)
holds the changes of many tables in one stream. The runner reads it only through its
:class:`~lakemirror.sources.event_source.EventSource` (the stream, a batch's rows as raw events, the
decoder, the broker's offsets), which :func:`~lakemirror.sources.event_source.event_source_for`
picks from the spec. Each micro-batch:

1. its raw messages are decoded (:mod:`lakemirror.sources.debezium`) on the driver; tombstones and
   transaction markers are skipped; poison messages become dead letters;
2. the changes are routed by table (``source.table`` / the topic for Debezium, ``table_name`` for
   the simple form) and folded per key (:func:`lakemirror.sinks.events.guard_plan.plan_batch`);
3. each replica takes one guarded MERGE (:class:`lakemirror.sinks.events.guard_merge.GuardedDeltaSink`)
   in a session of its own, under the transaction id ``lakemirror/<pipeline>/<source>/<table>/<epoch>``
   and the batch id, so a replayed batch is skipped by Delta and a redelivered event by the guard;
4. the dead letters are appended under the batch's own transaction id.

The epoch is a random id kept beside the query's checkpoint and renewed whenever the checkpoint
starts empty: a reset checkpoint (batch ids from 0 again) gets new transaction ids instead of
having every write skipped as a replay (CDC_SEMANTICS.md §2).

:class:`EventStreamRunner` runs the query under the supervisor like a table runner (one entry per
source, named ``events:<name>``); the per-replica counts are in :attr:`EventStreamRunner.replicas`.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Sequence

from lakemirror.checkpoints import stream_dir
from lakemirror.checkpoints.state import InMemoryStateStore, StateStore
from lakemirror.identifiers import TableName
from lakemirror.sinks.events.dead_letters import DeadLetterRow, DeadLetterTable
from lakemirror.sinks.events.guard_merge import GuardedDeltaSink, GuardOutcome
from lakemirror.sinks.events.guard_plan import TablePlan, plan_batch
from lakemirror.sinks.events.history_merge import HistoryDeltaSink
from lakemirror.sinks.events.history_plan import HISTORY_SCD2, HistoryTablePlan, plan_history_batch
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import BatchStats, MergeOutcome, TxnId
from lakemirror.sources.change_event import ChangeEvent, Decoded
from lakemirror.sources.debezium import FORMAT_DEBEZIUM
from lakemirror.sources.event_source import EventSource, event_source_for
from lakemirror.sources.event_stream import RawEvent, decode_batch
from lakemirror.sources.kafka_offsets import Offsets, offsets_behind, parse_end_offsets, progress_end_offsets
from lakemirror.supervisor import state as sm
from lakemirror.supervisor.event_record import (
    CAUGHT_UP_WRITE_SECONDS, backlog_since, load_record, save_record, state_slug,
)
from lakemirror.supervisor.lag import LagReading
from lakemirror.supervisor.runner import BatchReport
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

RUNNER_PREFIX = "events:"

#: Where the torture harness may kill the daemon on an event source's batch path (tests/torture,
#: ``LAKEMIRROR_TEST_KILL_AT``): each is a moment at which a crash must lose nothing and apply
#: nothing twice. Spark's commit log is written only after the batch function returns.
EVENT_FAULT_POINTS = (
    "events_before_merge",          # the batch is read and planned (offsets logged), nothing written
    "events_after_closes",          # history (scd2): a replica's closes are remembered, its MERGE is not
    "events_after_replica_merge",   # a replica's MERGE is committed, its tombstones and the other replicas not
    "events_before_dead_letters",   # every replica is committed, the batch's dead letters are not
    "events_after_dead_letters",    # the dead letters are committed, Spark's commit log is not
)


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
class EventBatchResult:
    events: int
    skipped: int
    dead_letters: int
    outcomes: dict[str, GuardOutcome]
    replicas: dict[str, ReplicaBatch] = field(default_factory=dict)

    @property
    def counts(self) -> ApplyCounts:
        return ApplyCounts(sum(o.counts.inserted for o in self.outcomes.values()),
                           sum(o.counts.updated for o in self.outcomes.values()),
                           sum(o.counts.deleted for o in self.outcomes.values()))


class EventBatchApplier:
    """The batch function's body: decode, route, fold, one guarded MERGE per replica, dead letters."""

    def __init__(self, spec: EventStreamSpec, decoder: Callable[[RawEvent], Decoded], pipeline_id: str,
                 locate: Callable[[str], TableLocation], dead_letters: DeadLetterTable,
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

    def apply(self, raws: Iterable[RawEvent], batch_id: int, epoch: str) -> EventBatchResult:
        decoded = decode_batch(raws, self.decoder, self.spec.tables)
        changes, raw_of = decoded.changes, decoded.raw_of
        letters = [DeadLetterRow(raw, letter.reason, letter.table) for raw, letter in decoded.dead_letters]
        scd2 = self.spec.history == HISTORY_SCD2
        plans: dict[str, TablePlan | HistoryTablePlan]
        plans, refused = plan_history_batch(changes) if scd2 else plan_batch(changes)  # type: ignore[assignment]
        letters += [DeadLetterRow(raw_of(e), reason, e.table) for e, reason in refused]
        self.fault("events_before_merge")
        jobs: list[tuple[str, TablePlan | HistoryTablePlan, GuardedDeltaSink, TxnId]] = []
        for table, plan in sorted(plans.items()):
            sink = self.sinks.get(table)
            if sink is None:
                try:
                    location = self.locate(table)
                except ValueError as exc:  # a table name the destination cannot hold
                    letters += [DeadLetterRow(raw_of(e), f"no replica for table {table!r}: {exc}", table)
                                for e in changes if e.table == table]
                    continue
                sink = self.sinks[table] = (HistoryDeltaSink if scd2 else GuardedDeltaSink)(
                    location, self.spec.allow_schema_evolution, clock=self.clock, fault=self.fault,
                    driver_apply=self.spec.driver_apply)
            jobs.append((table, plan, sink, TxnId(f"lakemirror/{self.pipeline_id}/{self.spec.name}/{table}/{epoch}",
                                                  batch_id)))
        by_table: dict[str, list[ChangeEvent]] = {}
        for e in changes:
            by_table.setdefault(e.table, []).append(e)
        outcomes: dict[str, GuardOutcome] = {}
        replicas: dict[str, ReplicaBatch] = {}
        for (table, plan, _, _), (outcome, committed) in zip(jobs, self._apply_tables(jobs)):
            outcomes[table] = outcome
            letters += [DeadLetterRow(raw_of(e), reason, table) for e, reason in outcome.rejected]
            lags = event_lags(by_table.get(table, ()), committed)
            replicas[table] = ReplicaBatch(outcome.counts.inserted, outcome.counts.updated, outcome.counts.deleted,
                                           outcome.stale, lags)
            self._record(table, plan.winners, outcome, lags)
        self.fault("events_before_dead_letters")
        self.dead_letters.append(self.session_for("__dead_letters"), letters,
                                 TxnId(f"lakemirror/{self.pipeline_id}/{self.spec.name}/dead-letters/{epoch}", batch_id),
                                 self.clock())
        self.fault("events_after_dead_letters")
        self._purge_when_due()
        return EventBatchResult(decoded.events, decoded.skipped, len(letters), outcomes, replicas)

    def _apply_tables(self, jobs: Sequence[tuple[str, TablePlan | HistoryTablePlan, GuardedDeltaSink, TxnId]]
                      ) -> list[tuple[GuardOutcome, float]]:
        """Each table's plan applied to its replica (a MERGE under the table's own transaction id, on the
        table's own Spark session), up to ``spec.table_workers`` tables at a time; (outcome, commit time)
        per job, in order. Every table's apply runs to its end before the first error is raised, so a
        replayed batch finds each committed table's transaction id and skips it."""
        sessions = [self.session_for(table) for table, _, _, _ in jobs]  # made here: session_for is not thread-safe

        def one(i: int) -> tuple[GuardOutcome, float]:
            _, plan, sink, txn = jobs[i]
            outcome = sink.apply(sessions[i], plan, txn)  # type: ignore[arg-type]
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


@dataclass(frozen=True)
class EventBatchReport(BatchReport):
    """A batch report of an event source, with what each replica took (the metrics' per-table view)."""

    source: str = ""
    replicas: dict[str, ReplicaBatch] = field(default_factory=dict)
    dead_letters: int = 0


@dataclass(frozen=True)
class EventLagReading(LagReading):
    """Lag of an event source: ``versions_behind`` counts Kafka messages not yet applied (all partitions),
    ``offsets_behind`` has them per topic-partition; ``lag_seconds`` is 0 when nothing is behind,
    else at least how long the backlog has been seen (the unread events' own times are unknown until
    read) and at least the last batch's event-time lag."""

    offsets_behind: dict[tuple[str, int], int] = field(default_factory=dict)
    #: The runner's applied batch id is not an offset: a batch reprices nothing (the lag still grows).
    versioned: ClassVar[bool] = False


def checkpoint_end_offsets(checkpoint: Path) -> Offsets:
    """The Kafka end offsets of the last batch the query's checkpoint records as committed."""
    commits, offsets = checkpoint / "commits", checkpoint / "offsets"
    try:
        done = [int(p.name) for p in commits.iterdir() if p.name.isdigit()]
    except OSError:
        return {}
    if not done:
        return {}
    try:
        lines = (offsets / str(max(done))).read_text().splitlines()
    except OSError:
        return {}
    out: Offsets = {}
    for line in lines[2:]:  # "v1", the batch's metadata, then one line per source
        try:
            out.update(parse_end_offsets(line))
        except (ValueError, TypeError):
            continue
    return out


def resync_refusal(source: str, applied: Offsets, beginning: Offsets, checkpoint: Path) -> str | None:
    """Why a resync of ``source`` (a replay from the earliest retained offsets) would not leave its
    replicas exact, or None when it would: a partition whose first retained offset lies beyond the
    end offset the replicas applied has lost, to retention, events they never took."""
    lost = {tp: (applied[tp], first) for tp, first in sorted(beginning.items())
            if tp in applied and first > applied[tp]}
    if not lost:
        return None
    where = ", ".join(f"{t}-{p} starts at offset {first} but the replicas applied up to {end} "
                      f"({first - end} events lost)" for (t, p), (end, first) in lost.items())
    return (f"{source}: resync refused: {where}; the topic's retention removed events the replicas never took, so "
            f"a replay cannot make them exact. Put the source's current state back into the topic (a new Debezium "
            f"snapshot, e.g. an incremental snapshot signal), then remove {checkpoint} and resume {source}: it "
            f"starts again from the earliest offsets under a new epoch")


def event_lags(changes: Iterable[ChangeEvent], committed_at: float) -> tuple[float, ...]:
    """Event-time lag of each change that carries its source commit time (``ts_ms``): how long after
    its commit at the source it was committed to the replica (never negative: clocks may differ)."""
    return tuple(max(0.0, committed_at - e.ts_ms / 1000.0) for e in changes if e.ts_ms is not None)


def checkpoint_epoch(folder: Path) -> str:
    """The transaction-id epoch of the query checkpointed in ``folder / 'checkpoint'``: kept while the
    checkpoint has offsets, renewed when it starts empty (a new or reset checkpoint)."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "epoch"
    offsets = folder / "checkpoint" / "offsets"
    if marker.is_file() and offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir()):
        return marker.read_text().strip()
    epoch = uuid.uuid4().hex[:12]
    tmp = folder / "epoch.tmp"
    tmp.write_text(epoch)
    tmp.replace(marker)
    return epoch


class EventStreamRunner:
    """Runs one event source's query; the supervisor drives it like a table runner."""

    def __init__(self, spec: EventStreamSpec, spark: "SparkSession", pipeline_id: str, folder: Path,
                 locate: Callable[[str], TableLocation], dead_letters: TableLocation,
                 clock: Callable[[], float] = time.time, source: EventSource["DataFrame"] | None = None,
                 fault: Callable[[str], None] = lambda point: None, states: StateStore | None = None) -> None:
        self.table = RUNNER_PREFIX + spec.name
        self.spec = spec
        #: The stream of raw messages, their decoder and the offsets for lag (by default the one ``spec`` names).
        self.source: EventSource["DataFrame"] = source if source is not None else event_source_for(spec)
        self.spark = spark
        self.folder = folder
        self.clock = clock
        #: Where the source's pause is kept across restarts (the pipeline's state store), under ``state_slug``.
        self.states: StateStore = states if states is not None else InMemoryStateStore()
        self.state_slug = state_slug(spec.name)
        self._sessions: dict[str, "SparkSession"] = {}
        self.applier = EventBatchApplier(spec, self.source.decoder, pipeline_id, locate, DeadLetterTable(dead_letters),
                                         self._session, clock, fault)
        self.dead_letter_count = 0
        self.applied_through: int | None = None
        self.last_batch_at: float | None = None
        self.last_lag: LagReading | None = None
        self._events: list[sm.Event | BatchReport] = []
        self._lock = threading.Lock()
        self._batch_lock = threading.Lock()
        self._query: "StreamingQuery | None" = None
        self._thread: threading.Thread | None = None
        self._draining = False
        self._resync_refused: str | None = None
        self._epoch = ""
        self._batch_error: str | None = None
        self._applied_offsets: Offsets = {}
        self._behind: Offsets = {}
        #: What the source recorded about itself (:mod:`.event_record`): its replicas' counts and its
        #: backlog's start carry over a restart.
        self.record = load_record(folder)
        self._behind_since: float | None = self.record.behind_since
        self.applier.replicas.update({t: ReplicaStatus(**{k: v for k, v in r.items()
                                                          if k in ReplicaStatus.__dataclass_fields__})
                                      for t, r in self.record.replicas.items()})
        self.applied_through, self.last_batch_at = self.record.batch_id, self.record.last_batch_at

    @property
    def replicas(self) -> dict[str, ReplicaStatus]:
        return self.applier.replicas

    def _session(self, name: str) -> "SparkSession":
        if name not in self._sessions:
            self._sessions[name] = self.spark.newSession()
        return self._sessions[name]

    def _emit(self, item: "sm.Event | BatchReport") -> None:
        with self._lock:
            self._events.append(item)

    # -- lifecycle ------------------------------------------------------------------------------

    def launch(self) -> None:
        if self._resync_refused is not None:  # the operator's resync could not be done safely: say so
            refusal, self._resync_refused = self._resync_refused, None
            self._emit(sm.Failed(error=refusal, code="resync_refused", fatal=True))
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._draining = False
        self._thread = threading.Thread(target=self._launch, name=f"launch:{self.table}", daemon=True)
        self._thread.start()

    def _checkpoint(self) -> str:
        """The query's checkpoint, cleared of the partial offset and commit writes of a query stopped
        or killed while writing them (a leftover in ``offsets`` makes Spark refuse to start at batch 0)."""
        checkpoint = str(self.folder / "checkpoint")
        for path in stream_dir.remove_interrupted_writes(self.spark, checkpoint):
            log.info("%s: removed an interrupted checkpoint write: %s", self.table, path)
        return checkpoint

    def _launch(self) -> None:
        try:
            checkpoint = self._checkpoint()
            self._epoch = checkpoint_epoch(self.folder)
            query = (self.source.stream(self.spark).writeStream.foreachBatch(self._batch)
                     .option("checkpointLocation", checkpoint)
                     .trigger(processingTime=f"{self.spec.trigger_interval_seconds} seconds")
                     .start())
            self._query = query
            self._emit(sm.StreamStarted())
        except Exception as exc:  # a failure to start is a visible state, never a dead thread
            log.warning("%s failed to start: %s", self.table, exc)
            self._emit(sm.Failed(error=f"{self.table}: {exc}".splitlines()[0]))

    def _batch(self, batch: "DataFrame", batch_id: int) -> None:
        with self._batch_lock:
            if self._draining:
                raise RuntimeError("draining: the batch is left for the next start")
            started = self.clock()
            try:
                rows = batch.collect()
                raws = self.source.raw_events(rows)
                result = self.applier.apply(raws, batch_id, self._epoch)
            except Exception as exc:
                # Spark reports a batch function's error as a Python traceback inside a JVM one; keep ours.
                self._batch_error = f"{self.table}: batch {batch_id} failed: {type(exc).__name__}: " + \
                    (str(exc).strip().splitlines() or [""])[0]
                raise
            self.dead_letter_count += result.dead_letters
            ended = self.clock()
            self.applied_through, self.last_batch_at = batch_id, ended
            self._save_record(batch_id=batch_id, last_batch_at=ended)
            stats = BatchStats(result.events, batch_id, batch_id, None)
            outcome = MergeOutcome(stats, result.counts, replayed=any(o.replayed for o in result.outcomes.values()))
            self._emit(EventBatchReport(self.table, batch_id, outcome, ended - started, ended, source=self.spec.name,
                                        replicas=result.replicas, dead_letters=result.dead_letters))
            self._emit(sm.BatchApplied())

    def halt(self, timeout: float = 60.0) -> None:
        self._draining = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        query = self._query
        if query is not None:
            if self._batch_lock.acquire(timeout=timeout):
                self._batch_lock.release()
            try:
                query.stop()
            except Exception as exc:  # an already dead query cannot be stopped
                log.debug("stopping %s: %s", self.table, exc)
            finally:
                self._query = None
        self.source.close()
        self.applier.close()

    def poll(self) -> list["sm.Event | BatchReport"]:
        query = self._query
        if query is not None and not query.isActive and not self._draining:
            self._query = None
            exc = query.exception()
            self._emit(sm.Failed(error=self._batch_error or f"{self.table}: {exc or 'the stream stopped'}".splitlines()[0]))
            self._batch_error = None
        with self._lock:
            out, self._events = self._events, []
        return out

    def _applied(self) -> Offsets:
        """End offsets of the last completed batch: Spark's progress, else the checkpoint's last commit."""
        query = self._query
        applied: Offsets = {}
        if query is not None:
            try:
                applied = progress_end_offsets(query.lastProgress)
            except Exception as exc:  # a stopping query: keep what is known
                log.debug("%s: reading progress: %s", self.table, exc)
        if not applied and not self._applied_offsets:
            applied = checkpoint_end_offsets(self.folder / "checkpoint")
        if applied:
            self._applied_offsets = {**self._applied_offsets, **applied}
        return self._applied_offsets

    def probe_lag(self, now: float) -> LagReading | None:
        """Offsets behind per topic-partition (the last batch's end offsets against the broker's latest)
        and the event-time lag; None for a source without offsets (Spark's file source has no backlog to ask)."""
        broker = self.source.offsets
        if broker is None:
            return None
        latest, beginning = broker.latest()
        applied = self._applied()
        behind = offsets_behind(applied, latest, beginning)
        total = sum(behind.values())
        if total == 0:
            self._behind_since, lag = None, 0.0
            if self.record.behind_since is not None or now - (self.record.caught_up_at or 0.0) >= CAUGHT_UP_WRITE_SECONDS:
                self._save_record(behind_since=None, caught_up_at=now)
        else:
            if self._behind_since is None:  # first seen: it began when the replicas were last caught up, at the earliest
                self._behind_since = backlog_since(self.record, now)
                self._save_record(behind_since=self._behind_since)
            last = max((r.last_event_lag_seconds or 0.0 for r in self.replicas.values()), default=0.0)
            lag = max(now - self._behind_since, last)
        self._behind = behind
        reading = EventLagReading(lag, total, sum(latest.values()), sum(applied.get(tp, 0) for tp in latest),
                                  offsets_behind=behind,
                                  oldest_unapplied_at=self._behind_since if total else None)
        self.last_lag = reading
        return reading

    def _save_record(self, **changes: Any) -> None:
        """Keep what the source knows about itself across restarts (:mod:`.event_record`)."""
        events = [r.last_ts_ms for r in self.replicas.values() if r.last_ts_ms is not None]
        self.record = replace(self.record, **changes, dead_letters=self.dead_letter_count,
                              last_event_at=max(events) / 1000.0 if events else self.record.last_event_at,
                              replicas={t: asdict(r) for t, r in self.replicas.items()})
        try:
            save_record(self.folder, self.record)
        except OSError as exc:  # status only: replication goes on
            log.warning("%s: cannot write the source's record: %s", self.table, exc)

    def describe(self) -> dict[str, Any]:
        """The source's own status (``/status`` and ``lakemirror status``): replicas, offsets, dead letters."""
        return {
            "source": self.spec.name, "kind": self.spec.kind, "dead_letters": self.dead_letter_count,
            "offsets_behind": [{"topic": t, "partition": p, "behind": n} for (t, p), n in sorted(self._behind.items())],
            "replicas": {table: {"inserted": r.inserted, "updated": r.updated, "deleted": r.deleted, "stale": r.stale,
                                 "batches": r.batches, "event_lag_seconds": r.last_event_lag_seconds,
                                 "position_basis": r.position_basis}
                         for table, r in sorted(self.replicas.items())},
        }

    def persisted_pause(self) -> bool:
        return self.states.load(self.state_slug).paused

    def pause_persisted(self, paused: bool) -> None:
        """Keep the pause in the pipeline's state store: a restarted daemon starts the source paused."""
        self.states.save(self.state_slug, replace(self.states.load(self.state_slug), paused=paused))

    def source_exists(self) -> bool:
        """Always: an event source has no table that could appear later (the supervisor asks
        only of tables that failed as missing)."""
        return True

    def resync(self, reason: str) -> None:
        """Replay the source from its earliest retained events under a fresh checkpoint and a new epoch.

        Called by the supervisor with the query halted. The replicas, their tombstones and the dead
        letters are kept: every event they already hold is a no-op under the sequence guard (and a
        dead letter is keyed by where its message came from), every event they miss is applied. The
        old checkpoint is renamed away in one step, so a crash anywhere in here leaves either the old
        checkpoint or none (a fresh start, hence a new epoch).

        Refused, when a Kafka topic no longer holds events the replicas never took (retention
        removed them): a replay could not make the replicas exact. The next launch then puts the
        source in ``failed`` with :func:`resync_refusal`'s message instead of starting."""
        checkpoint = self.folder / "checkpoint"
        refusal = self._resync_refusal(checkpoint)
        if refusal is not None:
            log.warning("%s", refusal)
            self._resync_refused = refusal
            return
        if checkpoint.exists():
            retired = self.folder / f"checkpoint.retired-{uuid.uuid4().hex[:8]}"
            checkpoint.rename(retired)
        for old in self.folder.glob("checkpoint.retired-*"):
            shutil.rmtree(old, ignore_errors=True)
        self.applied_through = None
        self.last_lag = None
        self._applied_offsets, self._behind, self._behind_since = {}, {}, None
        self._save_record(batch_id=None, behind_since=None)
        log.warning("%s: resync (%s): replaying the source from its earliest retained events under a new "
                    "checkpoint and epoch; the sequence guard skips what the replicas already hold", self.table, reason)

    def _resync_refusal(self, checkpoint: Path) -> str | None:
        broker = self.source.offsets
        if broker is None:
            return None  # a directory of event files: every file still there is read again
        applied = checkpoint_end_offsets(checkpoint)
        if not applied:
            return None  # nothing applied yet: a fresh start is what the query would do anyway
        try:
            _, beginning = broker.latest()
        except Exception as exc:  # noqa: BLE001 (any broker failure: refuse, never guess)
            return (f"{self.table}: resync refused: the broker did not say which offsets it still holds "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); resync again once "
                    f"it answers")
        return resync_refusal(self.table, applied, beginning, checkpoint)

    # -- turns (never: an event source keeps its own always-on query) -----------------------------

    def ready_for_turn(self) -> bool:
        return False

    def has_pending(self) -> bool | None:
        return None

    def take_turn(self) -> None:
        return None


def replica_locator(locate: Callable[[TableName], TableLocation], catalog: str, schema: str) -> Callable[[str], TableLocation]:
    """Event tables land as ``<catalog>.<schema>.<table>`` in the destination."""
    return lambda table: locate(TableName(catalog, schema, table))

