"""Real-Time Mode's foreach writer: flushes by count, by dwell time (also during a lull, by its
timer) and at close; a failed flush fails the task; the latencies reach Prometheus."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pyspark import cloudpickle

from lakemirror.daemon.metrics import Metrics
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.postgres.events import FlushResult
from lakemirror.sinks.postgres.foreach import PostgresForeachWriter
from lakemirror.sinks.txn import BatchStats, MergeOutcome
from lakemirror.sinks.postgres.real_time import finished_batch
from lakemirror.supervisor.change_feed.table_runner import BatchReport, StreamLatency


class RecordingSink:
    """The twin of PostgresEventSink: keeps each flush's records (offsets) instead of committing them."""

    def __init__(self, fail: bool = False) -> None:
        self.flushes: list[list[int]] = []
        self.closed = False
        self.fail = fail
        self.flushed = threading.Event()

    def apply(self, raws: Any) -> FlushResult:
        if self.fail:
            raise OSError("server gone")
        self.flushes.append([r.offset for r in raws])
        self.flushed.set()
        return FlushResult(events=len(self.flushes[-1]), seconds=0.001)

    def close(self) -> None:
        self.closed = True


def record(offset: int) -> dict[str, Any]:
    return {"key": None, "value": "{}", "topic": "t", "partition": 0, "offset": offset}


def test_a_writer_flushes_by_count_and_by_dwell_time_and_at_close() -> None:
    sink = RecordingSink()
    results: list[FlushResult] = []
    sink_in_worker = RecordingSink()
    writer = PostgresForeachWriter(RecordingSink, max_rows=3, max_dwell_ms=60_000)
    writer.open(5, 0)
    writer.process(record(99))
    # As Spark ships it to a worker: the configuration travels, not the buffer, lock or thread.
    writer = cloudpickle.loads(cloudpickle.dumps(writer))
    assert (writer.max_rows, writer.max_dwell_ms, writer.make_sink) == (3, 60_000, RecordingSink)
    writer.make_sink, writer.on_flush = (lambda: sink_in_worker), results.append
    assert writer.open(0, 0)
    for i in range(7):
        writer.process(record(i))
    assert sink_in_worker.flushes == [[0, 1, 2], [3, 4, 5]]   # by count
    writer.close(None)
    assert sink_in_worker.flushes[-1] == [6] and sink_in_worker.closed   # the rest at close
    assert len(results) == 3


def test_a_lull_does_not_hold_the_last_records_back() -> None:
    sink = RecordingSink()
    writer = PostgresForeachWriter(lambda: sink, max_rows=1000, max_dwell_ms=20)
    writer.open(1, 0)
    writer.process(record(41))
    started = time.monotonic()
    assert sink.flushed.wait(10), "the timer never flushed a dwelling record"
    assert sink.flushes == [[41]] and time.monotonic() - started < 10
    writer.close(None)
    assert sink.flushes == [[41]]


def test_a_failed_flush_fails_the_task() -> None:
    writer = PostgresForeachWriter(lambda: RecordingSink(fail=True), max_rows=1, max_dwell_ms=1000)
    writer.open(0, 0)
    with pytest.raises(OSError):
        writer.process(record(0))
    writer = PostgresForeachWriter(lambda: RecordingSink(fail=True), max_rows=100, max_dwell_ms=5)
    writer.open(0, 0)
    writer.process(record(0))
    time.sleep(0.3)  # the timer's flush fails; the task learns it from the next call
    with pytest.raises(RuntimeError, match="a flush to Postgres failed: OSError: server gone"):
        writer.close(None)


def test_latencies_from_progress_and_flushes_reach_prometheus() -> None:
    done = finished_batch({"batchId": 3, "numInputRows": 5, "processingLatencyMs": {"P50": 2, "P99": 40},
                           "e2eLatencyMs": 250, "durationMs": {"triggerExecution": 1500}}, [0.02, 0.5])
    assert (done.batch_id, done.rows, done.duration_seconds) == (3, 5, 1.5)
    assert (done.processing_ms, done.source_queuing_ms, done.e2e_ms, done.flush_seconds) == (40.0, None, 250.0, (0.02, 0.5))
    bare = finished_batch({"batchId": 1, "durationMs": {}}, [])
    assert (bare.processing_ms, bare.source_queuing_ms, bare.e2e_ms, bare.flush_seconds) == (None, None, None, ())
    latency = StreamLatency(done.processing_ms, done.source_queuing_ms, done.e2e_ms, done.flush_seconds)
    registry = CollectorRegistry()
    metrics = Metrics("p", registry)
    outcome = MergeOutcome(BatchStats(5, 1, 1, None), ApplyCounts(), replayed=False)
    metrics.batch_applied("events:shop", BatchReport("events:shop", 1, outcome, 1.0, 2.0, latency))
    labels = {"pipeline": "p", "table": "events:shop"}
    assert registry.get_sample_value("lakemirror_sink_flush_seconds_count", labels) == 2
    assert registry.get_sample_value("lakemirror_sink_flush_seconds_sum", labels) == pytest.approx(0.52)
    assert registry.get_sample_value("lakemirror_stream_latency_seconds", {**labels, "kind": "e2e"}) == 0.25
    assert registry.get_sample_value("lakemirror_stream_latency_seconds", {**labels, "kind": "processing"}) == 0.04
    assert registry.get_sample_value("lakemirror_stream_latency_seconds", {**labels, "kind": "source_queuing"}) is None
