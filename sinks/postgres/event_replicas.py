"""An event source's PostgreSQL replicas, as the event runner drives them: the
:class:`~lakemirror.sinks.event_contract.EventSink` of a ``destination: {kind: postgres}`` pipeline.

Two modes:

- **micro-batch** (the default): the runner decodes each batch on the driver and
  :meth:`PostgresEventReplicas.apply` writes it in one transaction
  (:meth:`~.events.PostgresEventSink.apply_decoded`: COPY into staging, the guarded upsert, tombstones,
  dead letters), retried whole while the server does not answer; tombstones past the horizon are
  purged every ``purge_interval_seconds``;
- **Real-Time Mode** (``source.real_time``, Kafka only): the executors' ``foreach`` writers apply the
  records (:attr:`PostgresEventReplicas.executor_writes`, :mod:`.real_time`).

Either way the replicas are exact without a progress row: a change writes a row only if its
position is newer than the row's and its key's tombstone, so a replayed batch changes nothing. The
dead letters are rows of ``lakemirror_event_dead_letters`` in the destination schema, recorded once
per message; they are listed from there (every one pending): the operator's skip and replay are not
offered (:attr:`PostgresEventReplicas.resolves_letters` is False).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

from lakemirror.sinks.event_contract import EventBatchResult, EventTxn, LettersNotResolvable, ReplicaBatch
from lakemirror.sinks.events.dead_letters import DeadLetterRow, LetterReport, StoredLetter
from lakemirror.sinks.postgres.events import EVENT_DEAD_LETTERS, PostgresEventSink
from lakemirror.sinks.postgres.executor import Connector, PostgresTarget
from lakemirror.sinks.postgres.foreach import EventSinkFactory
from lakemirror.sinks.postgres.real_time import RealTimeSpec, RealTimeWrites
from lakemirror.sinks.postgres.waits import ServerCalls
from lakemirror.sinks.waits import ServerWait
from lakemirror.sources.change_event import ChangeEvent, Decoded
from lakemirror.sources.event_stream import DecodedBatch, RawEvent

WRITE_POSTGRES_EVENTS = "postgres-guarded-upsert"
READ_DRIVER = "driver"


class PostgresEventReplicas:
    """One event source's replicas in one PostgreSQL schema (see the module docstring).

    ``label``: how the source is named in waits and errors (the supervisor's ``events:<name>``)."""

    def __init__(self, target: PostgresTarget, pipeline_id: str, source: str, decoder: Callable[[RawEvent], Decoded],
                 *, label: str, tables: Sequence[str] | None = None, allow_evolution: bool = True,
                 purge_interval_seconds: float = 3600.0, tombstone_horizon_seconds: float = 7 * 86400.0,
                 real_time: RealTimeSpec | None = None, clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self.real_time = real_time
        self.purge_interval_seconds = purge_interval_seconds
        self.tombstone_horizon_seconds = tombstone_horizon_seconds
        self.clock = clock
        self.factory = EventSinkFactory(target, pipeline_id, source, decoder,
                                        tuple(tables) if tables is not None else None, allow_evolution)
        #: The driver's flushes in flight, for the supervisor to see their waits.
        self.calls = ServerCalls(label, retry_seconds=target.retry_seconds,
                                 statement_timeout_seconds=target.statement_timeout_seconds, clock=clock)
        self._lookups = Connector(target)
        self._writes = RealTimeWrites(target, self.factory, real_time, label, clock) if real_time is not None else None
        self._sink: PostgresEventSink | None = None
        self._last_purge_at = clock()

    @property
    def executor_writes(self) -> RealTimeWrites | None:
        return self._writes

    #: The letters are rows of lakemirror_event_dead_letters, with no status to resolve.
    resolves_letters = False
    letters_elsewhere = (f"PostgreSQL replicas: its dead letters are rows of {EVENT_DEAD_LETTERS} in the "
                         f"destination schema")

    def _flushes(self) -> PostgresEventSink:
        if self._sink is None:
            self._sink = self.factory(self.calls)
        return self._sink

    def prepare(self) -> None:
        """Nothing: the connection, the schema and the shared tables are made by the first flush (a
        server that does not answer yet is waited for there, not refused at start)."""

    def apply(self, batch: DecodedBatch, txn: EventTxn) -> EventBatchResult:
        """``batch`` in one transaction; ``txn`` is not needed: the guard makes a replay a no-op."""
        sink = self._flushes()
        flush = sink.apply_decoded(batch)
        committed = self.clock()
        self._purge_when_due()
        by_table: dict[str, list[ChangeEvent]] = {}
        for change in batch.changes:
            by_table.setdefault(change.table, []).append(change)
        replicas = {table: _replica_batch(by_table.get(table, ()), counts.inserted, counts.updated, counts.deleted,
                                          flush.stale_by_table.get(table, 0), committed)
                    for table, counts in flush.tables.items()}
        letters = tuple(DeadLetterRow(d.raw, d.reason, d.table) for d in flush.letters)
        return EventBatchResult(flush.events, flush.skipped, flush.dead_letters, flush.tables, replicas, letters,
                                flush.counts, replayed=False, read=READ_DRIVER, write=WRITE_POSTGRES_EVENTS,
                                flush_seconds=(flush.seconds,))

    def _purge_when_due(self) -> None:
        now = self.clock()
        if self._sink is None or now - self._last_purge_at < self.purge_interval_seconds:
            return
        self._last_purge_at = now
        self._sink.purge(self.tombstone_horizon_seconds)

    def letters(self, ids: Iterable[str] | None = None, messages: bool = True) -> list[StoredLetter]:
        wanted = None if ids is None else set(ids)
        return [letter for letter in self._flushes().letters(messages) if wanted is None or letter.id in wanted]

    def resolve_letters(self, verb: str, ids: Sequence[str] | None, table: str | None = None) -> LetterReport:
        raise LettersNotResolvable(f"the dead letters of a PostgreSQL destination are rows of {EVENT_DEAD_LETTERS} "
                                   f"in schema {self.target.schema}: the operator's skip and replay are not offered "
                                   f"for them")

    def wait(self) -> ServerWait | None:
        if self._writes is not None:
            return self._writes.wait()
        return self.calls.wait(self._lookups.lock_wait)

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None


def _replica_batch(changes: Sequence[ChangeEvent], inserted: int, updated: int, deleted: int, stale: int,
                   committed: float) -> ReplicaBatch:
    """One replica's part of a flush: the counts, and the event-time lag, position basis and newest
    event time of the table's changes."""
    lags = tuple(max(0.0, committed - c.ts_ms / 1000.0) for c in changes if c.ts_ms is not None)
    basis = next((c.basis for c in reversed(changes) if c.basis), "")
    stamps = [c.ts_ms for c in changes if c.ts_ms is not None]
    return ReplicaBatch(inserted, updated, deleted, stale, lags, False, basis, max(stamps) if stamps else None)
