"""The in-memory twins of :class:`~lakemirror.sinks.events.guard_merge.GuardedDeltaSink` and of an
event source's Delta replicas with their dead-letter table (:class:`MemoryEventStore`).

Pure: no pyspark import. It takes the same :class:`~lakemirror.sinks.events.guard_plan.TablePlan` under
the same transaction ids and answers the same :class:`~lakemirror.sinks.events.guard_merge.GuardOutcome`:
the rows and tombstones are a :class:`~lakemirror.sinks.events.guard_plan.GuardedMemoryReplica`, a
transaction id it holds already is skipped as Delta skips it (``replayed``), and ``constraint`` stands
for what a Delta replica may refuse whole (a ``CHECK`` constraint an operator added): a change it
names fails the write with Delta's error text and nothing of the write is applied.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from lakemirror.sinks.events.dead_letters import InMemoryDeadLetters
from lakemirror.sinks.events.guard_merge import GuardOutcome
from lakemirror.sinks.events.guard_plan import GuardedMemoryReplica, TablePlan
from lakemirror.sinks.events.guarded_sink import EventBatchApplier, GuardedSinkSpec
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import TxnId
from lakemirror.sources.change_event import DELETE, ChangeEvent, Decoded
from lakemirror.sources.event_stream import RawEvent


class ConstraintViolated(Exception):
    """A write the replica refused whole because of one row (Delta's error class in its text)."""


@dataclass
class MemoryGuardedSink:
    """A guarded replica in memory, with the transaction ids it committed (app id → last version)."""

    constraint: Callable[[ChangeEvent], bool] = lambda change: True   # False: the replica refuses the row
    replica: GuardedMemoryReplica = field(default_factory=GuardedMemoryReplica)
    txns: dict[str, int] = field(default_factory=dict)
    writes: list[TxnId] = field(default_factory=list)   # every write attempted, committed or refused
    clock: Callable[[], float] = lambda: 0.0

    def apply(self, session: Any, plan: TablePlan, txn: TxnId) -> GuardOutcome:
        self.writes.append(txn)
        if self.txns.get(txn.app_id, -1) >= txn.version:
            return GuardOutcome(ApplyCounts(), True)
        for w in plan.winners:
            if w.op != DELETE and not self.constraint(w):
                raise ConstraintViolated(f"[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint violated by row "
                                         f"with values: {dict(w.columns)}")
        counts = self.replica.apply(plan, self.clock())
        self.txns[txn.app_id] = txn.version
        applied = ApplyCounts(counts.inserted, counts.updated, counts.deleted)
        return GuardOutcome(applied, False, len(plan.winners) - counts.stale, counts.stale)

    def purge(self, session: Any, horizon_seconds: float) -> int:
        return self.replica.purge(self.clock(), horizon_seconds)


@dataclass
class MemoryEventStore:
    """An event source's replicas and dead letters in memory: what the guarded event sink
    (:class:`~lakemirror.sinks.events.guarded_sink.EventBatchApplier`) writes in place of Delta tables.

    ``replica_for(table)`` gives each table's :class:`MemoryGuardedSink` (made on first use, kept in
    :attr:`replicas`); ``refuse`` names tables the destination cannot hold (ValueError, as a Delta
    catalog refuses a name), whose changes become dead letters."""

    replicas: dict[str, MemoryGuardedSink] = field(default_factory=dict)
    dead_letters: InMemoryDeadLetters = field(default_factory=InMemoryDeadLetters)
    clock: Callable[[], float] = lambda: 0.0
    refuse: Callable[[str], bool] = lambda table: False

    def replica_for(self, table: str) -> MemoryGuardedSink:
        if self.refuse(table):
            raise ValueError(f"the destination cannot hold a table named {table!r}")
        if table not in self.replicas:
            self.replicas[table] = MemoryGuardedSink(clock=self.clock)
        return self.replicas[table]


def memory_event_sink(spec: GuardedSinkSpec, decoder: Callable[[RawEvent], Decoded], pipeline_id: str,
                      store: MemoryEventStore | None = None, clock: Callable[[], float] = time.time,
                      fault: Callable[[str], None] = lambda point: None) -> EventBatchApplier:
    """The guarded event sink over in-memory replicas and dead letters (``store``, a new one if None):
    the destination kind ``memory``, and the sink the unit tests drive the event runner with."""
    store = store if store is not None else MemoryEventStore(clock=clock)
    return EventBatchApplier(spec, decoder, pipeline_id, store.replica_for, store.dead_letters, lambda name: None,
                             clock, fault)
