"""An event source (Kafka / Debezium, JSON-lines files) into PostgreSQL replicas, in one of two modes.

- **micro-batch** (the default): ``foreachBatch`` every ``trigger_interval_seconds``; the driver
  decodes the batch and applies it in one transaction (:class:`~lakemirror.sinks.postgres.events.PostgresEventSink`).
- **Real-Time Mode** (``source.real_time``, Kafka only): ``trigger(realTime=…)`` with the ``foreach``
  writer of :mod:`lakemirror.sinks.postgres.foreach`, which commits on the executors by count and by
  dwell time. Spark's Real-Time Mode is at-least-once into ``foreach``; the sequence guard makes
  every redelivery a no-op, so the replica is exact in both modes.

Either way the runner is an :class:`~lakemirror.supervisor.event_stream.EventStreamRunner` to the
supervisor (restarts, backoff, drain, status). In Real-Time Mode no batch function runs on the
driver: each finished real-time batch is reported from the query's progress instead, with the
latencies the progress carries (``processingLatencyMs``, ``sourceQueuingLatencyMs``,
``e2eLatencyMs`` where the Spark build reports them; open-source 4.2 does not) and the flush times
the writers added to an accumulator.
"""

from __future__ import annotations

import re
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from lakemirror.checkpoints.state import StateStore
from lakemirror.identifiers import TableName
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.postgres.events import FlushResult, PostgresEventSink
from lakemirror.sinks.postgres.executor import Connector, PostgresTarget
from lakemirror.sinks.postgres.foreach import EventSinkFactory, PostgresForeachWriter
from lakemirror.sinks.postgres.modes import connection_budget
from lakemirror.sinks.postgres.waits import ServerCalls
from lakemirror.sinks.txn import BatchStats, MergeOutcome
from lakemirror.sources.event_source import KIND_KAFKA, EventSource
from lakemirror.supervisor import state as sm
from lakemirror.supervisor.destination_wait import WaitReport
from lakemirror.supervisor.event_stream import EventStreamRunner, EventStreamSpec, ReplicaStatus
from lakemirror.supervisor.real_time_stall import RealTimeStall
from lakemirror.supervisor.runner import BatchReport, StreamLatency
from lakemirror.tables import TableLocation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

WRITE_POSTGRES_EVENTS = "postgres-guarded-upsert"
WRITE_POSTGRES_FOREACH = "postgres-foreach"
READ_DRIVER, READ_EXECUTORS = "driver", "executors"

log = logging.getLogger(__name__)


#: Spark's floor on the duration of a real-time batch (``trigger(realTime=…)``), a duration string.
MIN_BATCH_DURATION_CONF = "spark.sql.streaming.realTimeMode.minBatchDuration"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def duration_ms(text: str | None) -> int | None:
    """A Spark duration conf (``5000ms``, ``5s``, a bare number of milliseconds) in milliseconds; None
    when it is unset or in a form this does not read."""
    found = _DURATION.match(text or "")
    if not found:
        return None
    return round(float(found.group(1)) * _UNIT_MS[(found.group(2) or "ms").lower()])


@dataclass(frozen=True)
class RealTimeSpec:
    """Real-Time Mode's settings (``source.real_time`` in the YAML)."""

    checkpoint_interval_seconds: float = 1.0   # trigger(realTime=…): a checkpoint interval (see real_time.py)
    max_dwell_ms: int = 100                    # a writer commits a record at most this long after it came
    max_rows: int = 1000                       # ... or as soon as it holds this many
    tasks: int | None = None                   # partitions the budget counted at load; None: counted at start


class FlushTimes:
    """Flush durations (seconds) added up by the ``foreach`` writers on the executors (an accumulator)."""

    def __init__(self, spark: "SparkSession") -> None:
        from pyspark.accumulators import AccumulatorParam

        class _Lists(AccumulatorParam):  # type: ignore[type-arg]
            def zero(self, value: list[float]) -> list[float]:
                return []

            def addInPlace(self, a: list[float], b: list[float]) -> list[float]:
                a.extend(b)
                return a

        self._acc = spark.sparkContext.accumulator([], _Lists())
        self._seen = 0

    def callback(self) -> Callable[[FlushResult], None]:
        acc = self._acc
        return lambda result: acc.add([result.seconds])

    def new(self) -> list[float]:
        values = list(self._acc.value)
        fresh, self._seen = values[self._seen:], len(values)
        return fresh


def progress_latency(progress: Any, flushes: list[float]) -> StreamLatency:
    """The latencies a query progress reports (None where absent) and the sink's flush times."""
    def field(name: str) -> float | None:
        value = progress.get(name) if hasattr(progress, "get") else None
        if isinstance(value, dict):  # a distribution: keep its top percentile
            value = value.get("P99") or value.get("p99") or value.get("max")
        try:
            return None if value is None else float(value)
        except (TypeError, ValueError):
            return None
    return StreamLatency(processing_ms=field("processingLatencyMs"), source_queuing_ms=field("sourceQueuingLatencyMs"),
                         e2e_ms=field("e2eLatencyMs"), flush_seconds=tuple(flushes))


class PostgresEventStreamRunner(EventStreamRunner):
    """One event source's query into Postgres replicas (micro-batch, or Real-Time Mode)."""

    def __init__(self, spec: EventStreamSpec, spark: "SparkSession", pipeline_id: str, folder: Path,
                 target: PostgresTarget, real_time: RealTimeSpec | None = None,
                 clock: Callable[[], float] = time.time, states: StateStore | None = None,
                 source: EventSource["DataFrame"] | None = None) -> None:
        def no_delta(table: str) -> TableLocation:
            raise AssertionError("a Postgres event runner writes no Delta replica")
        super().__init__(spec, spark, pipeline_id, folder, no_delta,
                         TableLocation(TableName("postgres", "none", "none"), None), clock, source=source,
                         states=states)
        self.target = target
        self.real_time = real_time
        self.factory = EventSinkFactory(target, pipeline_id, spec.name, self.source.decoder, spec.tables,
                                        spec.allow_schema_evolution)
        self._sink: PostgresEventSink | None = None
        self._flush_times: FlushTimes | None = None
        self._reported_batch = -1
        self._last_purge_at = clock()
        # Waits on the server show as the source's state: the driver's flushes (micro-batch), or
        # real-time batches that stop finishing while the writers wait on the executors.
        lookups = Connector(target)
        self.calls = ServerCalls(self.table, retry_seconds=target.retry_seconds,
                                 statement_timeout_seconds=target.statement_timeout_seconds, clock=clock)
        self.stall = (RealTimeStall(self.table, real_time.checkpoint_interval_seconds, lookups.check_server,
                                    retry_seconds=target.retry_seconds,
                                    statement_timeout_seconds=target.statement_timeout_seconds, clock=clock)
                      if real_time is not None else None)
        self.waits = WaitReport(self.stall if self.stall is not None else self.calls, self._emit, lookups.lock_wait)
        self._letters_recorded: int | None = None   # read from the dead-letter table (None: not yet)
        self._letters_here = 0                      # letters this process recorded before that read

    #: Its dead letters are rows of lakemirror_event_dead_letters in PostgreSQL, not of a Delta table.
    keeps_dead_letters_in_delta = False

    @property
    def dead_letter_count(self) -> int:
        """Dead letters the source's Postgres table holds: counted there at launch and after each batch
        that recorded some (a redelivered poison message is recorded once)."""
        return self._letters_recorded if self._letters_recorded is not None else self._letters_here

    def _count_letters(self) -> None:
        try:
            if self._sink is None:
                self._sink = self.factory()
            self._letters_recorded = self._sink.dead_letter_count()
        except Exception as exc:  # noqa: BLE001 (counted again after the next batch with letters)
            log.warning("%s: could not count the dead letters: %s", self.table, str(exc).splitlines()[0] if str(exc) else exc)

    # -- the query ---------------------------------------------------------------------------------

    def _check_partitions(self, rt: RealTimeSpec) -> None:
        """Real-Time Mode holds one connection per Kafka partition: refuse to start when the topics
        have more partitions than the connection budget counted at load (``source.real_time.tasks``),
        or, with ``tasks`` unset, more than the cap leaves beside the daemon's own pool. Nothing to
        count for a source without offsets (a files source, which Real-Time Mode refuses anyway)."""
        broker = self.source.offsets
        if broker is None:
            return
        partitions = len(broker.latest()[0])
        budget = connection_budget(self.target.max_connections, tasks=partitions, pool=self.target.pool_connections)
        if rt.tasks is None:
            if not budget.fits:
                raise ValueError(f"the topics have {partitions} partitions: Real-Time Mode would hold "
                                 f"{budget.arithmetic()}. Raise destination.max_connections to at least "
                                 f"{budget.needed}")
            return
        if partitions <= rt.tasks:
            return
        raise ValueError(f"the topics have {partitions} partitions, more than source.real_time.tasks = {rt.tasks} "
                         f"counted at start; Real-Time Mode would hold {budget.arithmetic()}. Set "
                         f"source.real_time.tasks: {partitions}"
                         + ("" if budget.fits else " and raise destination.max_connections"))

    def _launch(self) -> None:
        try:
            self._count_letters()
            rt = self.real_time
            if rt is not None:
                self._check_partitions(rt)
            stream = self.source.stream(self.spark).writeStream.option("checkpointLocation", self._checkpoint())
            if rt is not None:
                if self.spec.kind != KIND_KAFKA:
                    raise ValueError("Real-Time Mode reads Kafka only (source.kind: kafka)")
                self._allow_batch_duration(rt.checkpoint_interval_seconds)
                self._flush_times = FlushTimes(self.spark)
                writer = PostgresForeachWriter(self.factory, max_rows=rt.max_rows, max_dwell_ms=rt.max_dwell_ms,
                                               on_flush=self._flush_times.callback())
                stream = (stream.foreach(writer).outputMode("update")
                          # realTime is a trigger pyspark 4.2 takes but its type overloads do not list
                          .trigger(realTime=f"{rt.checkpoint_interval_seconds:g} seconds"))  # type: ignore[call-overload]
            else:
                stream = stream.foreachBatch(self._batch).trigger(
                    processingTime=f"{self.spec.trigger_interval_seconds} seconds")
            self._query = stream.start()
            if self.stall is not None:
                self.stall.started()
            self._emit(sm.StreamStarted())
        except Exception as exc:  # a failure to start is a visible state, never a dead thread
            self._emit(sm.Failed(error=f"{self.table}: {exc}".splitlines()[0]))

    def _allow_batch_duration(self, seconds: float) -> None:
        """Let a real-time batch last ``seconds``: Spark refuses a real-time trigger shorter than its
        minimum batch duration (a public SQL conf, 5 s by default), so a shorter interval lowers the
        minimum, for the queries this session starts (a lower minimum the user set is kept)."""
        wanted = max(1, round(seconds * 1000))
        current = duration_ms(self.spark.conf.get(MIN_BATCH_DURATION_CONF, None))
        if current is None or current > wanted:
            self.spark.conf.set(MIN_BATCH_DURATION_CONF, f"{wanted}ms")

    def _batch(self, batch: "DataFrame", batch_id: int) -> None:
        with self._batch_lock:
            if self._draining:
                raise RuntimeError("draining: the batch is left for the next start")
            started = self.clock()
            try:
                rows = batch.collect()
                raws = self.source.raw_events(rows)
                if self._sink is None:
                    self._sink = self.factory(self.calls)
                result = self._sink.apply(raws)
                self._purge_when_due()
            except Exception as exc:
                self._batch_error = f"{self.table}: batch {batch_id} failed: {type(exc).__name__}: " + \
                    (str(exc).strip().splitlines() or [""])[0]
                raise
            self._record(result)
            ended = self.clock()
            self.applied_through, self.last_batch_at = batch_id, ended
            outcome = MergeOutcome(BatchStats(result.events, batch_id, batch_id, None), result.counts, replayed=False,
                                   read=READ_DRIVER, write=WRITE_POSTGRES_EVENTS)
            self._emit(BatchReport(self.table, batch_id, outcome, ended - started, ended,
                                   StreamLatency(flush_seconds=(result.seconds,))))
            self._emit(sm.BatchApplied())

    def _record(self, result: FlushResult) -> None:
        if result.dead_letters:
            self._letters_here += result.dead_letters
            self._count_letters()
        for table, counts in result.tables.items():
            status = self.replicas.setdefault(table, ReplicaStatus())
            status.batches += 1
            status.inserted += counts.inserted
            status.updated += counts.updated
            status.deleted += counts.deleted

    def _purge_when_due(self) -> None:
        now = self.clock()
        if self._sink is None or now - self._last_purge_at < self.spec.purge_interval_seconds:
            return
        self._last_purge_at = now
        self._sink.purge(self.spec.tombstone_horizon_seconds)

    def halt(self, timeout: float = 60.0) -> None:
        if self.stall is not None:
            self.stall.stopped()
        super().halt(timeout)
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    # -- Real-Time Mode: batches reported from the query's progress ---------------------------------

    def poll(self) -> list["sm.Event | BatchReport"]:
        if self.real_time is not None:
            self._report_progress()
        if self._query is not None:
            self.waits.check()
        return super().poll()

    def _report_progress(self) -> None:
        query = self._query
        if query is None:
            return
        try:
            progress = query.lastProgress
        except Exception:  # noqa: BLE001 (a query stopping under us: poll() reports it)
            return
        if not progress or int(progress["batchId"]) <= self._reported_batch:
            return
        batch_id = int(progress["batchId"])
        self._reported_batch = batch_id
        if self.stall is not None:
            self.stall.batch_finished()
        rows = int(progress.get("numInputRows") or 0)
        duration = float((progress.get("durationMs") or {}).get("triggerExecution") or 0) / 1000
        flushes = self._flush_times.new() if self._flush_times is not None else []
        now = self.clock()
        self.applied_through, self.last_batch_at = batch_id, now
        outcome = MergeOutcome(BatchStats(rows, batch_id, batch_id, None), ApplyCounts(), replayed=False,
                               read=READ_EXECUTORS, write=WRITE_POSTGRES_FOREACH)
        self._emit(BatchReport(self.table, batch_id, outcome, duration, now, progress_latency(progress, flushes)))
        self._emit(sm.BatchApplied())

