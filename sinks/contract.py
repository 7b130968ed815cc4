"""Where a table's changes go, as the table runner sees it: the :class:`TableReplica` protocol.

A table replica is one source table's copy in one target. The runner asks it, in this order:
:meth:`TableReplica.claim` (may this pipeline write here?) and :meth:`TableReplica.bootstrap`
once per epoch, :meth:`TableReplica.prepare` each time the table starts (follow the source's
columns), then :meth:`TableReplica.batch_sink` for the object whose ``apply`` takes each
micro-batch exactly once under its transaction id (:class:`BatchSink`). While the table runs it
asks :meth:`TableReplica.server_wait` at each poll (a wait shows as the table's state) and
:meth:`TableReplica.on_server` while a batch is applied (a worker of the turn pool is let go while
the batch waits on the server). :attr:`TableReplica.delta_log` says whether the replica is a
Delta table: its log records its writes' transaction ids (read when the table starts), and its
bootstrap copies the source in chunks.

Implementations: :class:`lakemirror.sinks.merge.delta_replica.DeltaReplica` (Delta MERGE, rewrite or the
driver's delta-rs MERGE: :mod:`lakemirror.sinks.merge.apply_choice`),
:class:`lakemirror.sinks.postgres.spark_batches.PostgresTable` (COPY and a guarded upsert) and
:class:`lakemirror.sinks.memory.MemoryTableReplica`, the in-memory twin unit tests use. ``Frame``
is what a snapshot and a batch are made of: a Spark DataFrame, or a list of row dicts for the twin.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, TypeVar

from lakemirror.sinks.merge.planner import MergePlan
from lakemirror.sinks.txn import MergeOutcome, TxnId
from lakemirror.sinks.waits import ServerWait

Frame = TypeVar("Frame", contravariant=True)


class BatchSink(Protocol[Frame]):
    """Applies one epoch's micro-batches of change rows to a replica."""

    def apply(self, batch: Frame, txn: TxnId, read: Any = None) -> MergeOutcome:
        """Apply ``batch`` once under ``txn``; a ``txn`` already committed is skipped and answered
        with ``replayed=True``. ``read``: an optional driver-side reader of the batch's rows."""
        ...


class TableReplica(Protocol[Frame]):
    """One table's replica in one target, driven by the table runner (see the module docstring)."""

    @property
    def delta_log(self) -> bool:
        """Whether the replica is a Delta table (its log holds its writes' transaction ids)."""
        ...

    def claim(self, epoch: int) -> None:
        """Refuse (:class:`~lakemirror.errors.DestinationConflict`) a replica another pipeline
        owns, before the first bootstrap (``epoch`` 0) of this pipeline overwrites it."""
        ...

    def bootstrap(self, plan: MergePlan, snapshot: Frame, version: int, epoch: int,
                  source_properties: Mapping[str, str]) -> None:
        """Replace the replica with ``snapshot`` (the source at ``version``), atomically."""
        ...

    def prepare(self, plan: MergePlan, allow_evolution: bool) -> bool:
        """Follow the source's columns: add new ones (``allow_evolution``) or raise
        :class:`~lakemirror.errors.SchemaIncompatible` saying what to do. True when columns were added."""
        ...

    def batch_sink(self, plan: MergePlan, epoch: int) -> BatchSink[Frame]:
        """The apply of ``epoch``'s micro-batches."""
        ...

    def server_wait(self) -> ServerWait | None:
        """What the replica's work waits on in its server now (None: nothing, or no server)."""
        ...

    def on_server(self) -> bool:
        """Whether one of the replica's calls is on its server now (its work is the server's)."""
        ...


#: How the runners get a table's replica: ``replica_for(table, session)`` (the destination's factory).
ReplicaFactory = Callable[[str, Any], "TableReplica[Any]"]
