"""What the parts of one table's runner share while the table runs.

The runner's parts (:mod:`.batch_apply`, :mod:`.turn_taker`, :mod:`.stream_wiring`) run on
different threads: Spark's stream thread applies batches, a turn worker takes turns, the
supervisor's thread polls and probes lag. They share this one record of the table's live state
instead of reaching into each other, and hand the supervisor its events through :meth:`TableLive.emit`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

from lakemirror.errors import LakemirrorError
from lakemirror.sinks.batch.bootstrap_plan import BootstrapProgress
from lakemirror.sinks.txn import MergeOutcome
from lakemirror.supervisor.control import table_state as sm

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery


@dataclass(frozen=True)
class BatchReport:
    """One applied (or replayed) micro-batch, as the supervisor's observer sees it."""

    table: str
    batch_id: int
    outcome: MergeOutcome
    duration_seconds: float
    ended_at: float
    latency: "StreamLatency | None" = None


@dataclass(frozen=True)
class StreamLatency:
    """Latencies of one batch: from the query's progress where Spark reports them (Real-Time Mode on
    builds that do; None otherwise), and the sink's own flush times, which Spark's e2e latency
    leaves out (the write to the destination)."""

    processing_ms: float | None = None
    source_queuing_ms: float | None = None
    e2e_ms: float | None = None
    flush_seconds: tuple[float, ...] = ()


Item = Union[sm.Event, BatchReport, BootstrapProgress]


@dataclass
class TableLive:
    """The live state of one table's stream, shared by the runner's parts."""

    table: str
    #: The newest source version whose changes the replica holds (None: not known yet).
    applied_through: int | None = None
    last_batch_at: float | None = None
    #: A batch or a turn has completed since the launch: the table is healthy again.
    turn_proven: bool = False
    #: A drain was requested: batches that begin from now on are refused.
    draining: bool = False
    #: The translated error of the batch that failed last (a query's own error is less precise).
    batch_error: LakemirrorError | None = None
    #: The table's query while it runs (always on, or started for a turn).
    query: "StreamingQuery | None" = None
    _events: list[Item] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def emit(self, item: Item) -> None:
        with self._lock:
            self._events.append(item)

    def take_events(self) -> list[Item]:
        with self._lock:
            out, self._events = self._events, []
        return out

    def advance(self, through: int | None) -> None:
        """Move the applied version forward (never back)."""
        if through is not None and (self.applied_through is None or through > self.applied_through):
            self.applied_through = through

    def batch_done(self, batch_id: int, outcome: MergeOutcome, started: float, ended: float) -> None:
        """Record a batch the replica now holds and report it (a healthy table)."""
        self.advance(outcome.stats.last_version)
        self.last_batch_at = ended
        self.turn_proven = True
        self.emit(BatchReport(self.table, batch_id, outcome, ended - started, ended))
        self.emit(sm.BatchApplied())
