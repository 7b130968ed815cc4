"""The one event runner drives any event sink through the contract (:mod:`lakemirror.sinks.event_contract`),
without Spark: the guarded sink over in-memory replicas takes each decoded batch under its
transaction id (a replayed batch is skipped), the runner counts what each replica took and the new
dead letters; a sink whose writers run on the executors wires the query and reports finished batches
from the query's progress, once each; a sink's wait on its server shows as the source's state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from lakemirror.sinks.event_contract import EventBatchResult, EventTxn, ExecutorBatch, LettersNotResolvable
from lakemirror.sinks.events.dead_letters import LetterReport, StoredLetter
from lakemirror.sinks.events.memory_sink import MemoryEventStore
from lakemirror.sinks.waits import ServerWait
from lakemirror.sources.event_stream import DecodedBatch
from lakemirror.sources.memory_events import MemoryEventSource
from lakemirror.supervisor.control import table_state as sm
from lakemirror.sinks.events.memory_sink import memory_event_sink
from lakemirror.supervisor.events.stream_runner import DeadLetterTally, EventBatchReport, EventStreamRunner, EventStreamSpec

SPEC = EventStreamSpec("shop", "kafka", "simple", bootstrap_servers="127.0.0.1:1", topics="t", table_workers=1)


def simple(table: str, op: str, key: int, ts: int, **columns: Any) -> str:
    doc: dict[str, Any] = {"table_name": table, "operation": op, "timestamp": ts, "transaction_id": f"t{ts}",
                           "primary_key": {"id": key}}
    doc["after" if op != "DELETE" else "before"] = {"id": key, **columns}
    return json.dumps(doc)


class Frame:
    """A micro-batch as the batch function receives it: rows to collect."""

    def __init__(self, rows: Sequence[dict[str, Any]]) -> None:
        self.rows = list(rows)

    def collect(self) -> list[dict[str, Any]]:
        return self.rows


def test_the_runner_applies_a_decoded_batch_through_the_sink_and_a_replayed_batch_changes_nothing(
        tmp_path: Path) -> None:
    source = MemoryEventSource("kafka", "simple")
    store = MemoryEventStore()
    runner = EventStreamRunner(SPEC, None, tmp_path, memory_event_sink(SPEC, source.decoder, "p", store),  # type: ignore[arg-type]
                               source=source, clock=lambda: 50.0)
    runner._epoch = "e1"
    rows = [source.send(simple("orders", "INSERT", 1, 10, amount=5)), source.send(simple("orders", "INSERT", 2, 11)),
            source.send(simple("users", "INSERT", 7, 12)), source.send("not json")]
    runner._batch(Frame(rows), 0)  # type: ignore[arg-type]
    assert set(store.replicas["orders"].replica.live()) == {(1,), (2,)} and set(store.replicas["users"].replica.live()) == {(7,)}
    assert store.replicas["orders"].writes[0].app_id == "lakemirror/p/shop/orders/e1"
    report = next(e for e in runner.poll() if isinstance(e, EventBatchReport))
    assert (report.outcome.counts.inserted, report.dead_letters, report.total) == (3, 1, 1)
    assert runner.replicas["orders"].inserted == 2 and runner.replicas["orders"].position_basis
    runner._batch(Frame(rows), 0)  # type: ignore[arg-type]  # Spark replays the batch after a crash
    again = next(e for e in runner.poll() if isinstance(e, EventBatchReport))
    assert again.outcome.replayed and again.outcome.counts.inserted == 0 and again.dead_letters == 0
    assert runner.replicas["orders"].replays == 1 and runner.dead_letter_count == 1


class ExecutorWritesTwin:
    """Writers on the executors: the query wired with them, batches finished as progress reports."""

    def __init__(self) -> None:
        self.wired: list[Any] = []
        self.events: list[str] = []

    def check(self, source: Any) -> None:
        self.events.append("checked")

    def start(self, spark: Any, writer: Any, source: Any) -> Any:
        self.wired.append(writer)
        return writer

    def started(self) -> None:
        self.events.append("started")

    def finished(self, progress: Any) -> ExecutorBatch | None:
        if not progress:
            return None
        return ExecutorBatch(int(progress["batchId"]), 4, 0.5, read="executors", write="twin-foreach",
                             flush_seconds=(0.01,))

    def stopped(self) -> None:
        self.events.append("stopped")


class ExecutorSink:
    """A sink whose writers run on the executors, and which waits on its server when told to."""

    resolves_letters = False
    letters_elsewhere = "its server: its dead letters are rows there"

    def __init__(self) -> None:
        self.executor_writes = ExecutorWritesTwin()
        self.waiting: ServerWait | None = None
        self.closed = 0

    def prepare(self) -> None:
        pass

    def apply(self, batch: DecodedBatch, txn: EventTxn) -> EventBatchResult:
        raise AssertionError("the executors apply the batches")

    def letters(self, ids: Iterable[str] | None = None, messages: bool = True) -> list[StoredLetter]:
        return []

    def resolve_letters(self, verb: str, ids: Sequence[str] | None, table: str | None = None) -> LetterReport:
        raise LettersNotResolvable("elsewhere")

    def wait(self) -> ServerWait | None:
        return self.waiting

    def close(self) -> None:
        self.closed += 1


class Query:
    def __init__(self) -> None:
        self.lastProgress: dict[str, Any] | None = None
        self.isActive = True
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


class Writer:
    """A DataStreamWriter that starts ``query``."""

    def __init__(self, query: Query) -> None:
        self.query = query
        self.options: dict[str, str] = {}

    def option(self, key: str, value: str) -> "Writer":
        self.options[key] = value
        return self

    def start(self) -> Query:
        return self.query


class Stream:
    def __init__(self, query: Query) -> None:
        self.writeStream = Writer(query)


class StreamingTwin(MemoryEventSource):
    def __init__(self, query: Query) -> None:
        super().__init__("kafka")
        self.query = query

    def stream(self, spark: object = None) -> Any:
        return Stream(self.query)


def test_a_sink_writing_on_the_executors_wires_the_query_and_each_finished_batch_is_reported_once(
        tmp_path: Path) -> None:
    query, sink = Query(), ExecutorSink()
    runner = EventStreamRunner(SPEC, None, tmp_path, sink, source=StreamingTwin(query), clock=lambda: 9.0)  # type: ignore[arg-type]
    assert runner.keeps_dead_letters_in_delta is False and runner.letters_elsewhere == sink.letters_elsewhere
    runner._launch()
    assert sink.executor_writes.wired and sink.executor_writes.events == ["checked", "started"]
    assert [type(e) for e in runner.poll()] == [DeadLetterTally, sm.StreamStarted]
    query.lastProgress = {"batchId": 3}
    first = runner.poll()
    again = runner.poll()   # the same progress: no second report
    [report] = [e for e in first if isinstance(e, EventBatchReport)]
    assert (report.batch_id, report.outcome.write, report.outcome.stats.rows_read) == (3, "twin-foreach", 4)
    assert report.latency is not None and report.latency.flush_seconds == (0.01,)
    assert not [e for e in again if isinstance(e, EventBatchReport)] and runner.applied_through == 3
    sink.waiting = ServerWait(1.0, "events:shop: waiting for the server", "postgres_unavailable")
    assert [e.error for e in runner.poll() if isinstance(e, sm.Waiting)] == ["events:shop: waiting for the server"]
    sink.waiting = None
    assert any(isinstance(e, sm.WaitOver) for e in runner.poll())
    runner.halt(1.0)
    assert query.stopped and sink.executor_writes.events[-1] == "stopped" and sink.closed == 1
