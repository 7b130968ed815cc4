"""Real-Time Mode's Postgres writer: a ``foreach`` sink (open / process / close) that commits by
time and by count.

Open-source Spark 4.2 runs Real-Time Mode (``trigger(realTime=…)``) only from Kafka into ``foreach``,
Kafka and console sinks (docs/postgres.md, "Real-Time Mode"). Each task of a real-time batch is a
long-running read of one Kafka partition; Spark calls :meth:`PostgresForeachWriter.process` for each
record as it arrives and :meth:`~PostgresForeachWriter.close` only when the batch ends (the
``realTime`` duration later). Committing at ``close`` would hold every record for up to that long, so
the writer flushes its buffer in one transaction (:class:`~lakemirror.sinks.postgres.events.PostgresEventSink`)
when it holds ``max_rows`` records, or when its oldest record has waited ``max_dwell_ms`` — checked on
every record and by a timer thread, so a lull does not hold the last records back.

Real-Time Mode into ``foreach`` is at-least-once: after a failure Spark replays the batch from its
start offsets, and records flushed before the failure come again. The sequence guard makes the
replay a no-op (every row already holds an order at least as new), so the replica stays exact.

A flush that fails (after the sink's own reconnect-with-backoff) is raised from the next
``process`` or from ``close``: the task fails, the query stops, the supervisor restarts it from
its checkpoint. The writer is pickled to Spark's Python workers: it carries the target (with its
password) and builds its sink and connection there, in ``open``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from lakemirror.errors import LakemirrorError
from lakemirror.sinks.postgres.events import FlushResult, PostgresEventSink
from lakemirror.sinks.postgres.executor import PostgresTarget
from lakemirror.sinks.postgres.waits import ServerCalls
from lakemirror.sources.change_event import Decoded
from lakemirror.sources.event_stream import RawEvent, raw_event_from_kafka_row


@dataclass(frozen=True)
class EventSinkFactory:
    """Builds a :class:`PostgresEventSink` where it runs (picklable: the writer carries it)."""

    target: PostgresTarget
    pipeline_id: str
    source: str
    decode: Callable[[RawEvent], Decoded]
    tables: tuple[str, ...] | None = None
    allow_evolution: bool = True

    def __call__(self, calls: ServerCalls | None = None) -> PostgresEventSink:
        """A sink; ``calls``: where its flushes are recorded (the driver's, for the supervisor's eyes)."""
        return PostgresEventSink(self.target, self.pipeline_id, self.source, self.decode, tables=self.tables,
                                 allow_evolution=self.allow_evolution, calls=calls)


class PostgresForeachWriter:
    """``writeStream.foreach(writer)``: buffer Kafka records, flush by count and by dwell time.

    ``on_flush``: called on the executor after each flush with its :class:`FlushResult` (e.g. to
    add to accumulators the driver reads)."""

    def __init__(self, make_sink: Callable[[], PostgresEventSink], *, max_rows: int = 1000,
                 max_dwell_ms: int = 100, on_flush: Callable[[FlushResult], None] | None = None) -> None:
        if max_rows < 1 or max_dwell_ms < 1:
            raise ValueError("max_rows and max_dwell_ms must be at least 1")
        self.make_sink = make_sink
        self.max_rows = max_rows
        self.max_dwell_ms = max_dwell_ms
        self.on_flush = on_flush
        self._init_state()

    def _init_state(self) -> None:
        self._sink: PostgresEventSink | None = None
        self._buffer: list[RawEvent] = []
        self._first_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._error: BaseException | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Only the configuration travels to the workers; locks, threads and connections are made there.
        return {"make_sink": self.make_sink, "max_rows": self.max_rows, "max_dwell_ms": self.max_dwell_ms,
                "on_flush": self.on_flush}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_state()

    # -- the ForeachWriter protocol ---------------------------------------------------------------

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self._init_state()
        self._sink = self.make_sink()
        self._timer = threading.Thread(target=self._watch, name=f"lakemirror-flush-{partition_id}", daemon=True)
        self._timer.start()
        return True

    def process(self, row: Any) -> None:
        self._raise_pending()
        raw = raw_event_from_kafka_row(row)
        with self._lock:
            if self._first_at is None:
                self._first_at = time.monotonic()
            self._buffer.append(raw)
            if len(self._buffer) >= self.max_rows or self._dwelled():
                self._flush_locked()

    def close(self, error: BaseException | None) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(10)
        try:
            if error is None:
                self._raise_pending()
                with self._lock:
                    self._flush_locked()
        finally:
            if self._sink is not None:
                self._sink.close()
                self._sink = None

    # -- flushing -----------------------------------------------------------------------------------

    def _dwelled(self) -> bool:
        return self._first_at is not None and (time.monotonic() - self._first_at) * 1000 >= self.max_dwell_ms

    def _flush_locked(self) -> None:
        if not self._buffer or self._sink is None:
            return
        batch, self._buffer, self._first_at = self._buffer, [], None
        result = self._sink.apply(batch)
        if self.on_flush is not None:
            self.on_flush(result)

    def _watch(self) -> None:
        """Flush a buffer whose oldest record has waited ``max_dwell_ms`` while no record arrives."""
        tick = max(0.001, self.max_dwell_ms / 4000)
        while not self._stop.wait(tick):
            with self._lock:
                if self._error is not None or not self._dwelled():
                    continue
                try:
                    self._flush_locked()
                except BaseException as exc:  # raised by the task's thread: process() or close()
                    self._error = exc
                    return

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, LakemirrorError):  # already says what failed and what to check
                raise error
            raise RuntimeError(f"a flush to Postgres failed: {type(error).__name__}: {error}") from error
