"""Real-Time Mode into PostgreSQL: the executors' ``foreach`` writers wired into an event source's query.

With ``source.real_time`` (Kafka only) the query runs ``trigger(realTime=…)`` with the ``foreach``
writer of :mod:`.foreach`, which commits on the executors by count and by dwell time. Spark's
Real-Time Mode is at-least-once into ``foreach``; the sequence guard makes every redelivery a no-op,
so the replica is exact as in micro-batch mode. No batch function runs on the driver: each finished
real-time batch is reported from the query's progress instead (:meth:`RealTimeWrites.finished`), with
the latencies the progress carries (``processingLatencyMs``, ``sourceQueuingLatencyMs``,
``e2eLatencyMs`` where the Spark build reports them; open-source 4.2 does not) and the flush times the
writers added to an accumulator. :class:`RealTimeWrites` is the
:class:`~lakemirror.sinks.event_contract.ExecutorWrites` of :class:`~.event_replicas.PostgresEventReplicas`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from lakemirror.sinks.event_contract import ExecutorBatch
from lakemirror.sinks.postgres.events import FlushResult
from lakemirror.sinks.postgres.executor import Connector, PostgresTarget
from lakemirror.sinks.postgres.foreach import EventSinkFactory, PostgresForeachWriter
from lakemirror.sinks.postgres.modes import connection_budget
from lakemirror.sinks.postgres.real_time_stall import RealTimeStall
from lakemirror.sinks.waits import ServerWait

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakemirror.sources.event_source import EventSource

WRITE_POSTGRES_FOREACH = "postgres-foreach"
READ_EXECUTORS = "executors"

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


def finished_batch(progress: Any, flushes: list[float]) -> ExecutorBatch:
    """The batch a query progress reports, with its latencies (None where absent) and the sink's flush times."""
    def field(name: str) -> float | None:
        value = progress.get(name) if hasattr(progress, "get") else None
        if isinstance(value, dict):  # a distribution: keep its top percentile
            value = value.get("P99") or value.get("p99") or value.get("max")
        try:
            return None if value is None else float(value)
        except (TypeError, ValueError):
            return None
    duration = float((progress.get("durationMs") or {}).get("triggerExecution") or 0) / 1000
    return ExecutorBatch(int(progress["batchId"]), int(progress.get("numInputRows") or 0), duration,
                         read=READ_EXECUTORS, write=WRITE_POSTGRES_FOREACH,
                         processing_ms=field("processingLatencyMs"), source_queuing_ms=field("sourceQueuingLatencyMs"),
                         e2e_ms=field("e2eLatencyMs"), flush_seconds=tuple(flushes))


class RealTimeWrites:
    """The ``foreach`` writers of one event source's Real-Time Mode query, and the watch on its batches
    (:class:`~.real_time_stall.RealTimeStall`: a query whose batches stopped finishing is a wait)."""

    def __init__(self, target: PostgresTarget, factory: EventSinkFactory, spec: RealTimeSpec, label: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self.factory = factory
        self.spec = spec
        self.label = label
        self._flush_times: FlushTimes | None = None
        self._reported = -1
        lookups = Connector(target)
        self.stall = RealTimeStall(label, spec.checkpoint_interval_seconds, lookups.check_server,
                                   retry_seconds=target.retry_seconds,
                                   statement_timeout_seconds=target.statement_timeout_seconds, clock=clock)

    def check(self, source: "EventSource[Any]") -> None:
        """Real-Time Mode reads Kafka only, within the connection budget (:meth:`check_partitions`)."""
        self.check_partitions(source)
        if source.offsets is None:
            raise ValueError("Real-Time Mode reads Kafka only (source.kind: kafka)")

    def check_partitions(self, source: "EventSource[Any]") -> None:
        """Real-Time Mode holds one connection per Kafka partition: refuse to start when the topics
        have more partitions than the connection budget counted at load (``source.real_time.tasks``),
        or, with ``tasks`` unset, more than the cap leaves beside the daemon's own pool. Nothing to
        count for a source without offsets (a files source, refused by :meth:`check` anyway)."""
        broker = source.offsets
        if broker is None:
            return
        rt = self.spec
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

    def start(self, spark: "SparkSession", writer: Any, source: "EventSource[Any]") -> Any:
        rt = self.spec
        allow_batch_duration(spark, rt.checkpoint_interval_seconds)
        self._flush_times = FlushTimes(spark)
        foreach = PostgresForeachWriter(self.factory, max_rows=rt.max_rows, max_dwell_ms=rt.max_dwell_ms,
                                        on_flush=self._flush_times.callback())
        return (writer.foreach(foreach).outputMode("update")
                # realTime is a trigger pyspark 4.2 takes but its type overloads do not list
                .trigger(realTime=f"{rt.checkpoint_interval_seconds:g} seconds"))

    def started(self) -> None:
        self.stall.started()

    def finished(self, progress: Any) -> ExecutorBatch | None:
        if not progress or int(progress["batchId"]) <= self._reported:
            return None
        self._reported = int(progress["batchId"])
        self.stall.batch_finished()
        flushes = self._flush_times.new() if self._flush_times is not None else []
        return finished_batch(progress, flushes)

    def stopped(self) -> None:
        self.stall.stopped()

    def wait(self) -> ServerWait | None:
        return self.stall.wait()


def allow_batch_duration(spark: "SparkSession", seconds: float) -> None:
    """Let a real-time batch last ``seconds``: Spark refuses a real-time trigger shorter than its
    minimum batch duration (a public SQL conf, 5 s by default), so a shorter interval lowers the
    minimum, for the queries this session starts (a lower minimum the user set is kept)."""
    wanted = max(1, round(seconds * 1000))
    current = duration_ms(spark.conf.get(MIN_BATCH_DURATION_CONF, None))
    if current is None or current > wanted:
        spark.conf.set(MIN_BATCH_DURATION_CONF, f"{wanted}ms")
