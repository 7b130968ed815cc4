"""One Structured Streaming query per event source, its batches applied by the source's event sink.

An event source (JSON-lines files or Kafka topics carrying Debezium envelopes or simple CDC events)
holds the changes of many tables in one stream. The runner reads it only through its
:class:`~lakemirror.sources.event_source.EventSource` (the stream, a batch's rows as raw events, the
decoder, the broker's offsets) and writes only through its
:class:`~lakemirror.sinks.event_contract.EventSink` (Delta replicas, PostgreSQL replicas or their
in-memory twins: the composition root picks one by the destination's kind). Each micro-batch:

1. its raw messages are decoded (:mod:`lakemirror.sources.debezium`) on the driver; tombstones and
   transaction markers are skipped; poison messages become dead letters;
2. the sink applies the decoded batch under its :class:`~lakemirror.sinks.event_contract.EventTxn`
   (the query's epoch and the batch id): the guarded event sink
   (:class:`~lakemirror.sinks.events.guarded_sink.EventBatchApplier`) routes the changes by table, folds
   them per key and gives each replica one guarded write under the transaction id
   ``lakemirror/<pipeline>/<source>/<table>/<epoch>`` and the batch id, so a replayed batch is skipped
   by Delta and a redelivered event by the guard; the dead letters are recorded beside them.

A sink whose writers run on the executors (PostgreSQL's Real-Time Mode) wires the query itself
(:attr:`~lakemirror.sinks.event_contract.EventSink.executor_writes`): no batch function runs on the
driver, and each finished batch is reported from the query's progress instead.

The epoch is a random id kept beside the query's checkpoint and renewed whenever the checkpoint
starts empty: a reset checkpoint (batch ids from 0 again) gets new transaction ids instead of
having every write skipped as a replay (Delta skips a write whose version is not above the one
recorded for its app id, and batch ids starting again from 0 would be below it: silent loss).

:class:`EventStreamRunner` runs the query under the supervisor like a table runner (one entry per
source, named ``events:<name>``); the per-replica counts are in :attr:`EventStreamRunner.replicas`.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

from lakemirror.bounded import call_within
from lakemirror.checkpoints import layout
from lakemirror.checkpoints import stream_dir
from lakemirror.checkpoints.state import InMemoryStateStore, StateStore
from lakemirror.sinks.event_contract import EventBatchResult, EventSink, EventTxn, ExecutorBatch
from lakemirror.sinks.event_contract import ReplicaBatch as ReplicaBatch
from lakemirror.sinks.events.dead_letters import LetterReport
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import READ_BY_SPARK, WRITE_SPARK_MERGE, BatchStats, MergeOutcome
from lakemirror.sinks.waits import LockWait, ServerWait
from lakemirror.sources.event_source import EventSource, event_source_for
from lakemirror.sources.change_event import ChangeEvent
from lakemirror.sources.event_stream import RawEvent, decode_batch
from lakemirror.sources.kafka_offsets import (
    BrokerOffsets, Offsets, TopicPartition, offsets_behind, parse_end_offsets, progress_end_offsets,
)
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.control.classify_errors import stream_error
from lakemirror.supervisor.control.destination_waits import WaitReport
from lakemirror.supervisor.events.status_record import (
    CAUGHT_UP_WRITE_SECONDS, backlog_since, load_record, save_record, state_slug,
)
# Importable from here as before (the runners' callers use them).
from lakemirror.supervisor.change_feed.shared_state import BatchReport, StreamLatency
from lakemirror.supervisor.control.lag import LagReading
from lakemirror.supervisor.events.status_record import ReplicaStatus as ReplicaStatus
from lakemirror.supervisor.events.stream_spec import EventStreamSpec as EventStreamSpec
from lakemirror.supervisor.events.dead_letters import LetterIndex

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
class EventBatchReport(BatchReport):
    """A batch report of an event source, with what each replica took (the metrics' per-table view),
    the dead letters it added and those pending per table."""

    source: str = ""
    replicas: dict[str, ReplicaBatch] = field(default_factory=dict)
    dead_letters: int = 0                                   # new letters of this batch
    pending: dict[str, int] = field(default_factory=dict)   # pending letters per table, after the batch
    total: int = 0                                          # letters the table holds


@dataclass(frozen=True)
class DeadLetterTally(EventBatchReport):
    """Not a batch: the source's dead-letter counts, reported when they change outside a batch (read
    from the table at launch, after an operator's skip or replay) so that the metrics carry them over
    restarts. Its ``batch_id`` is -1 and it applied nothing."""


@dataclass(frozen=True)
class EventLagReading(LagReading):
    """Lag of an event source: ``versions_behind`` counts Kafka messages not yet applied (all partitions),
    ``offsets_behind`` has them per topic-partition; ``lag_seconds`` is 0 when nothing is behind, else
    the age of the oldest message not applied: its source commit time (Debezium's ``source.ts_ms``),
    or the broker's time of the message where it has none, read from the broker at each partition's
    applied offset. Where the broker does not return that message in time, the lag is at least how
    long the backlog has been seen and at least the last batch's event-time lag."""

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


def checkpoint_epoch(folder: Path) -> str:
    """The transaction-id epoch of the query checkpointed in ``folder / 'checkpoint'``: kept while the
    checkpoint has offsets, renewed when it starts empty (a new or reset checkpoint)."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = layout.event_epoch_file(folder)
    offsets = layout.event_checkpoint(folder) / "offsets"
    if marker.is_file() and offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir()):
        return marker.read_text().strip()
    epoch = uuid.uuid4().hex[:12]
    tmp = folder / "epoch.tmp"
    tmp.write_text(epoch)
    tmp.replace(marker)
    return epoch


class _SinkWaits:
    """The sink's waits, as :class:`~..control.destination_waits.WaitReport` asks for them."""

    def __init__(self, sink: EventSink) -> None:
        self.sink = sink

    def wait(self, look_up: Callable[[int], LockWait | None] | None = None) -> ServerWait | None:
        return self.sink.wait()


class EventStreamRunner:
    """Runs one event source's query into its event sink; the supervisor drives it like a table runner.

    ``sink``: where the batches go (:class:`~lakemirror.sinks.event_contract.EventSink`, made by the
    destination's factory); ``source``: where they come from (by default the one ``spec`` names)."""

    def __init__(self, spec: EventStreamSpec, spark: "SparkSession", folder: Path, sink: EventSink,
                 clock: Callable[[], float] = time.time, source: EventSource["DataFrame"] | None = None,
                 states: StateStore | None = None) -> None:
        self.table = RUNNER_PREFIX + spec.name
        self.spec = spec
        #: The stream of raw messages, their decoder and the offsets for lag (by default the one ``spec`` names).
        self.source: EventSource["DataFrame"] = source if source is not None else event_source_for(spec)
        self.spark = spark
        self.folder = folder
        self.clock = clock
        self.sink = sink
        #: Whether the operator lists, skips and replays the letters through the daemon's dead-letter
        #: routes (a sink that does not offer it keeps them where its destination says).
        self.keeps_dead_letters_in_delta = sink.resolves_letters
        #: Where they are kept otherwise, in words (the dead-letter routes' answer).
        self.letters_elsewhere = sink.letters_elsewhere
        #: Where the source's pause is kept across restarts (the pipeline's state store), under ``state_slug``.
        self.states: StateStore = states if states is not None else InMemoryStateStore()
        self.state_slug = state_slug(spec.name)
        #: The sink's waits on its server, shown as the source's state (a PostgreSQL destination's).
        self.waits = WaitReport(_SinkWaits(sink), self._emit)
        #: The source's dead letters by id and status (seeded from the sink at launch: counts carry over restarts).
        self.letters = LetterIndex()
        self._letter_worker: ThreadPoolExecutor | None = None
        #: What each replica has taken so far (carried over restarts by the source's record).
        self.replicas: dict[str, ReplicaStatus] = {}
        self.applied_through: int | None = None
        self.last_batch_at: float | None = None
        self.last_lag: LagReading | None = None
        self._events: list[sm.Event | BatchReport] = []
        self._lock = threading.Lock()
        self._batch_lock = threading.Lock()
        self._query: "StreamingQuery | None" = None
        self._thread: threading.Thread | None = None
        self._draining = False
        #: What a halt in progress waits for; after a halt, what it left unfinished at its deadline (None:
        #: nothing). A drain names it for a source it abandons.
        self.halting: str | None = None
        self._resync_refused: str | None = None
        self._epoch = ""
        self._batch_error: str | None = None
        self._reported_batch = -1
        self._applied_offsets: Offsets = {}
        self._behind: Offsets = {}
        #: When each partition's oldest unapplied message was written, by (partition, offset): read from
        #: the broker once per position, and forgotten when the position moves.
        self._message_times: dict[tuple[TopicPartition, int], float | None] = {}
        #: What the source recorded about itself (:mod:`.status_record`): its replicas' counts and its
        #: backlog's start carry over a restart.
        self.record = load_record(folder)
        self._behind_since: float | None = self.record.behind_since
        self.replicas.update({t: ReplicaStatus(**{k: v for k, v in r.items() if k in ReplicaStatus.__dataclass_fields__})
                              for t, r in self.record.replicas.items()})
        self.applied_through, self.last_batch_at = self.record.batch_id, self.record.last_batch_at

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
        checkpoint = str(layout.event_checkpoint(self.folder))
        for path in stream_dir.remove_interrupted_writes(self.spark, checkpoint):
            log.info("%s: removed an interrupted checkpoint write: %s", self.table, path)
        return checkpoint

    @property
    def dead_letter_count(self) -> int:
        """Dead letters the sink holds (pending and resolved)."""
        return self.letters.total

    def _seed_letters(self) -> None:
        """Read the sink's letter ids and statuses once (a restarted daemon counts what it holds)."""
        if self.letters.seeded:
            return
        try:
            self.letters.seed(self.sink.letters(messages=False))
        except Exception as exc:  # noqa: BLE001 (the counts start from this process's letters)
            log.warning("%s: could not read the dead letters to count them: %s", self.table,
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return
        self._emit(self._tally())

    def _tally(self) -> "DeadLetterTally":
        return DeadLetterTally(self.table, -1, MergeOutcome(BatchStats(0, None, None, None), ApplyCounts(), replayed=False), 0.0,
                               self.clock(), source=self.spec.name, pending=self.letters.pending(),
                               total=self.letters.total)

    def _launch(self) -> None:
        try:
            self.sink.prepare()
            self._seed_letters()
            checkpoint = self._checkpoint()
            self._epoch = checkpoint_epoch(self.folder)
            on_executors = self.sink.executor_writes
            if on_executors is not None:
                on_executors.check(self.source)
            writer = self.source.stream(self.spark).writeStream.option("checkpointLocation", checkpoint)
            if on_executors is not None:  # the executors' writers apply the batches (Real-Time Mode)
                writer = on_executors.start(self.spark, writer, self.source)
            else:
                writer = writer.foreachBatch(self._batch).trigger(
                    processingTime=f"{self.spec.trigger_interval_seconds} seconds")
            self._query = writer.start()
            if on_executors is not None:
                on_executors.started()
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
                decoded = decode_batch(self.source.raw_events(rows), self.source.decoder, self.spec.tables)
                result = self.sink.apply(decoded, EventTxn(self._epoch, batch_id))
            except Exception as exc:
                # Spark reports a batch function's error as a Python traceback inside a JVM one; keep ours.
                self._batch_error = f"{self.table}: batch {batch_id} failed: {type(exc).__name__}: " + \
                    (str(exc).strip().splitlines() or [""])[0]
                raise
            self._applied(batch_id, started, result)

    def _applied(self, batch_id: int, started: float, result: EventBatchResult) -> None:
        """Count, record and report a batch the sink applied."""
        new_letters = self.letters.add(result.letters)
        if new_letters:
            log.warning("%s: batch %d: %d new dead letter(s) (%s); `lakemirror dead-letters` lists, skips and "
                        "replays them", self.table, batch_id, new_letters,
                        "; ".join(f"{d.table}: {d.reason}"[:300] for d in result.letters[:3]))
        for table, done in result.replicas.items():
            self.replicas.setdefault(table, ReplicaStatus()).add(table, done)
        ended = self.clock()
        self.applied_through, self.last_batch_at = batch_id, ended
        self._save_record(batch_id=batch_id, last_batch_at=ended)
        stats = BatchStats(result.events, batch_id, batch_id, None)
        outcome = MergeOutcome(stats, result.counts, replayed=result.replayed,
                               read=result.read if result.read is not None else READ_BY_SPARK,
                               write=result.write if result.write is not None else WRITE_SPARK_MERGE)
        latency = StreamLatency(flush_seconds=result.flush_seconds) if result.flush_seconds else None
        self._emit(EventBatchReport(self.table, batch_id, outcome, ended - started, ended, latency,
                                    source=self.spec.name, replicas=result.replicas, dead_letters=new_letters,
                                    pending=self.letters.pending(), total=self.letters.total))
        self._emit(sm.BatchApplied())

    def _report_finished(self, query: "StreamingQuery") -> None:
        """A batch the executors' writers finished (:attr:`EventSink.executor_writes`), from the query's progress."""
        on_executors = self.sink.executor_writes
        if on_executors is None:
            return
        try:
            progress = query.lastProgress
        except Exception:  # noqa: BLE001 (a query stopping under us: poll() reports it)
            return
        done: ExecutorBatch | None = on_executors.finished(progress)
        if done is None or done.batch_id <= self._reported_batch:
            return
        self._reported_batch = done.batch_id
        now = self.clock()
        self.applied_through, self.last_batch_at = done.batch_id, now
        outcome = MergeOutcome(BatchStats(done.rows, done.batch_id, done.batch_id, None), ApplyCounts(),
                               replayed=False, read=done.read, write=done.write)
        latency = StreamLatency(processing_ms=done.processing_ms, source_queuing_ms=done.source_queuing_ms,
                                e2e_ms=done.e2e_ms, flush_seconds=done.flush_seconds)
        self._emit(EventBatchReport(self.table, done.batch_id, outcome, done.duration_seconds, now, latency,
                                    source=self.spec.name, pending=self.letters.pending(), total=self.letters.total))
        self._emit(sm.BatchApplied())

    def halt(self, timeout: float = 60.0) -> None:
        """Stop the query after the batch in flight; its waits share one deadline, the query's
        ``stop()`` included (left to finish on a thread of its own when it does not return in time).
        :attr:`halting` says what the halt waits for, and once it has returned, what it left
        unfinished at its deadline (None: nothing)."""
        deadline = time.monotonic() + timeout
        left: list[str] = []
        self._draining = True
        on_executors = self.sink.executor_writes
        if on_executors is not None:
            on_executors.stopped()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self.halting = "waiting for its launch"
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                left.append(self.halting)
        query = self._query
        if query is not None:
            self.halting = "waiting for its batch in flight"
            if self._batch_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                self._batch_lock.release()
            elif not left:
                left.append(self.halting)
            self.halting = "stopping its query"
            try:
                if not call_within(query.stop, deadline - time.monotonic(), f"stop:{self.table}"):
                    left.append(self.halting)
                    log.warning("%s: its query did not stop within %.0fs; it is left stopping (a batch it did not "
                                "commit is replayed when it starts again)", self.table, timeout)
            except Exception as exc:  # an already dead query cannot be stopped
                log.debug("stopping %s: %s", self.table, exc)
            finally:
                self._query = None
        self.halting = "closing its source and replicas"
        self.source.close()
        self.sink.close()
        if self._letter_worker is not None:
            self._letter_worker.shutdown(wait=True)
            self._letter_worker = None
        self.halting = left[0] if left else None

    def poll(self) -> list["sm.Event | BatchReport"]:
        query = self._query
        if query is not None:
            self._report_finished(query)
            self.waits.check()
        if query is not None and not query.isActive and not self._draining:
            self._query = None
            exc = query.exception()
            self._emit(sm.Failed(error=self._batch_error or stream_error(self.table, exc)))
            self._batch_error = None
        with self._lock:
            out, self._events = self._events, []
        return out

    def _applied_end_offsets(self) -> Offsets:
        """End offsets of the last completed batch: Spark's progress, else the checkpoint's last commit."""
        query = self._query
        applied: Offsets = {}
        if query is not None:
            try:
                applied = progress_end_offsets(query.lastProgress)
            except Exception as exc:  # a stopping query: keep what is known
                log.debug("%s: reading progress: %s", self.table, exc)
        if not applied and not self._applied_offsets:
            applied = checkpoint_end_offsets(layout.event_checkpoint(self.folder))
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
        applied = self._applied_end_offsets()
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
            oldest = self._oldest_unapplied_at(broker, {tp: applied.get(tp, (beginning or {}).get(tp, 0))
                                                        for tp, n in behind.items() if n > 0}, now)
            if oldest is not None:
                since, lag = oldest, now - oldest
            else:  # the broker did not return every oldest message in time: what is known bounds it below
                last = max((r.last_event_lag_seconds or 0.0 for r in self.replicas.values()), default=0.0)
                since, lag = self._behind_since, max(now - self._behind_since, last)
        self._behind = behind
        reading = EventLagReading(lag, total, sum(latest.values()), sum(applied.get(tp, 0) for tp in latest),
                                  offsets_behind=behind,
                                  oldest_unapplied_at=since if total else None)
        self.last_lag = reading
        return reading

    def _oldest_unapplied_at(self, broker: BrokerOffsets, positions: dict[TopicPartition, int],
                             now: float) -> float | None:
        """When the oldest message not yet applied was committed at its source, over the partitions
        behind (``positions``: each one's first unapplied offset); None unless every one is known."""
        known = {key: t for key, t in self._message_times.items() if key in positions.items()}
        missing = {tp: offset for tp, offset in positions.items() if (tp, offset) not in known}
        if missing:
            try:
                records = broker.first_records(missing)
            except Exception as exc:  # noqa: BLE001 (lag only: the estimate stands in, the next probe asks again)
                log.debug("%s: reading the oldest unapplied messages: %s", self.table, exc)
                records = {}
            for tp, offset in missing.items():
                record = records.get(tp)
                if record is not None:
                    known[(tp, offset)] = self._written_at(tp, record.offset, record.key, record.value,
                                                           record.timestamp_ms)
        self._message_times = known
        times = [known.get((tp, offset)) for tp, offset in positions.items()]
        if not times or any(t is None for t in times):
            return None
        return min(min(t for t in times if t is not None), now)

    def _written_at(self, tp: TopicPartition, offset: int, key: str | None, value: str | None,
                    broker_ms: int | None) -> float | None:
        """A message's source commit time if it is a change that carries one, else the broker's time."""
        try:
            decoded = self.source.decoder(RawEvent(value, key, tp[0], tp[1], offset))
        except Exception:  # noqa: BLE001 (an undecodable message is the batch's dead letter, not the probe's)
            decoded = None
        if isinstance(decoded, ChangeEvent) and decoded.ts_ms is not None:
            return decoded.ts_ms / 1000.0
        return broker_ms / 1000.0 if broker_ms is not None else None

    def _save_record(self, **changes: Any) -> None:
        """Keep what the source knows about itself across restarts (:mod:`.status_record`)."""
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
            "dead_letters_pending": self.letters.pending(),
            "offsets_behind": [{"topic": t, "partition": p, "behind": n} for (t, p), n in sorted(self._behind.items())],
            "replicas": {table: {"inserted": r.inserted, "updated": r.updated, "deleted": r.deleted, "stale": r.stale,
                                 "batches": r.batches, "event_lag_seconds": r.last_event_lag_seconds,
                                 "position_basis": r.position_basis}
                         for table, r in sorted(self.replicas.items())},
        }

    # -- dead letters: the operator's list, skip and replay --------------------------------------

    def _on_letter_worker(self, what: Callable[[], Any], timeout: float) -> Any:
        """Run ``what`` (the sink's reads and writes) on the source's own letter thread, never the
        caller's (an HTTP thread); wait at most ``timeout`` seconds: then :class:`TimeoutError`, the work
        going on."""
        if self._letter_worker is None:
            self._letter_worker = ThreadPoolExecutor(1, thread_name_prefix=f"letters:{self.spec.name}")
        return self._letter_worker.submit(what).result(timeout)

    def dead_letters(self, status: str | None = None, table: str | None = None, limit: int = 500,
                     timeout: float = 30.0) -> list[dict[str, Any]]:
        """The recorded letters (newest last), of ``status`` and ``table`` when given, at most ``limit``."""
        def read() -> list[dict[str, Any]]:
            found = self.sink.letters(messages=False)
            chosen = [f for f in found if (status is None or f.status == status) and (table is None or f.table == table)]
            return [f.as_json() for f in chosen[-limit:]]
        return list(self._on_letter_worker(read, timeout))

    def resolve_dead_letters(self, verb: str, ids: Sequence[str] | None, table: str | None = None,
                             timeout: float = 30.0) -> LetterReport:
        """Skip or replay letters (the sink's :meth:`~lakemirror.sinks.event_contract.EventSink.resolve_letters`)
        between two batches of the source."""
        def resolve() -> LetterReport:
            with self._batch_lock:  # no batch writes the replicas meanwhile
                report = self.sink.resolve_letters(verb, ids, table)
            self.letters.resolved(report.resolutions)
            self._emit(self._tally())
            return report
        return self._on_letter_worker(resolve, timeout)  # type: ignore[no-any-return]

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
        checkpoint = layout.event_checkpoint(self.folder)
        refusal = self._resync_refusal(checkpoint)
        if refusal is not None:
            log.warning("%s", refusal)
            self._resync_refused = refusal
            return
        if checkpoint.exists():
            retired = layout.retired_event_checkpoint(self.folder, uuid.uuid4().hex[:8])
            checkpoint.rename(retired)
        for old in self.folder.glob(layout.RETIRED_CHECKPOINT_PREFIX + "*"):
            shutil.rmtree(old, ignore_errors=True)
        self.applied_through = None
        self.last_lag = None
        self._applied_offsets, self._behind, self._behind_since, self._message_times = {}, {}, None, {}
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

