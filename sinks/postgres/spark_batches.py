"""Spark's side of the Postgres sink: micro-batch DataFrames to Arrow on the driver, then the replica.

The table runner treats a table's Postgres replica through
:class:`PostgresTable`: ``prepare`` when the table starts, ``bootstrap`` with the snapshot at the
pinned version, and ``batch_sink`` for its ``foreachBatch`` function, whose ``apply`` answers
like the Delta MERGE sink's (a :class:`~lakemirror.sinks.txn.MergeOutcome`), so the runner's
checkpoint rows, metrics and crash points are the same for both kinds of replica.

A batch's change rows come to the driver without their ``update_preimage`` rows (never applied),
as one Arrow table; the winner per key is picked there (:mod:`.plan`), which costs no Spark job
beyond reading the batch. Batches are bounded by ``max_files_per_trigger`` /
``max_bytes_per_trigger`` where the driver's memory needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from lakemirror.identifiers import quote
from lakemirror.sinks.merge.planner import CDF_COLUMNS, CHANGE_TYPE, UPDATE_PRE, MergePlan
from lakemirror.sinks.postgres.executor import Connector, PostgresReplica
from lakemirror.sinks.postgres.plan import ReplicaTable
from lakemirror.sinks.postgres.waits import ServerCalls, ServerWait
from lakemirror.sinks.txn import READ_BY_SPARK, MergeOutcome, TxnId

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: ``MergeOutcome.write`` of a batch applied to a Postgres replica.
WRITE_POSTGRES = "postgres-copy-upsert"
#: How a Postgres replica finds a replayed batch already written (``MergeOutcome.replay_note``).
REPLAY_NOTE = "its progress row in PostgreSQL, committed with the data, made it a no-op"


class PostgresBatchSink:
    """The ``foreachBatch`` apply of one table into its Postgres replica, for one epoch."""

    def __init__(self, replica: PostgresReplica, epoch: int) -> None:
        self.replica = replica
        self.epoch = epoch

    def changes(self, batch: "DataFrame") -> Any:
        """The batch's applicable change rows as an Arrow table (replica columns + CDF columns)."""
        cols = [*self.replica.table.column_names, *CDF_COLUMNS]
        return (batch.where(f"{quote(CHANGE_TYPE)} <> '{UPDATE_PRE}'")
                .select(*[quote(c) for c in cols]).toArrow())

    def apply(self, batch: "DataFrame", txn: TxnId, read: Any = None) -> MergeOutcome:
        """Apply ``batch`` under ``txn.version`` (the batch id); a replayed batch id is skipped."""
        result = self.replica.apply(self.changes(batch), self.epoch, txn.version)
        return MergeOutcome(result.stats, result.counts, result.replayed, read=READ_BY_SPARK, write=WRITE_POSTGRES,
                            replay_note=REPLAY_NOTE)


class PostgresTable:
    """One source table's replica in Postgres, as the runner drives it
    (a :class:`~lakemirror.sinks.contract.TableReplica`)."""

    def __init__(self, connector: Connector, pipeline_id: str, name: str, label: str,
                 fault: Callable[[str], None] = lambda point: None, calls: ServerCalls | None = None) -> None:
        self.connector = connector
        self.pipeline_id = pipeline_id
        self.name = name
        self.label = label
        self.fault = fault
        target = connector.target
        #: The replica's call in flight on the server, whatever part of the table makes it (:mod:`.waits`).
        self.calls = calls if calls is not None else ServerCalls(
            label, retry_seconds=target.retry_seconds, statement_timeout_seconds=target.statement_timeout_seconds)

    #: A PostgreSQL table: its progress rows, not a Delta log, record its batches.
    delta_log = False

    def server_wait(self) -> ServerWait | None:
        return self.calls.wait(self.connector.lock_wait)

    def on_server(self) -> bool:
        return self.calls.in_call()

    def replica(self, plan: MergePlan) -> PostgresReplica:
        table = ReplicaTable.from_plan(self.connector.target.schema, self.name, plan)
        return PostgresReplica(self.connector, self.pipeline_id, table, label=self.label, calls=self.calls,
                               fault=self.fault)

    def claim(self, epoch: int) -> None:
        """Nothing to check here: the replica's owner mark is checked by its bootstrap, in the
        transaction that replaces it (:meth:`PostgresReplica.bootstrap`)."""

    def prepare(self, plan: MergePlan, allow_evolution: bool) -> bool:
        """Follow the source's columns; True when the replica gained columns."""
        return self.replica(plan).prepare(allow_evolution)

    def bootstrap(self, plan: MergePlan, snapshot: "DataFrame", version: int, epoch: int,
                  source_properties: Mapping[str, str] | None = None) -> None:
        columns = [quote(c.name) for c in plan.columns]
        self.replica(plan).bootstrap(snapshot.select(*columns).toArrow(), version, epoch)

    def batch_sink(self, plan: MergePlan, epoch: int) -> PostgresBatchSink:
        return PostgresBatchSink(self.replica(plan), epoch)
