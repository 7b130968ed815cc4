"""PostgreSQL as a pipeline's destination: the one factory the composition root's registry calls.

:func:`destination` builds a :class:`PostgresFactories` from the composition root's parts and the
destination's settings; it holds everything a pipeline writing PostgreSQL replicas is made of:

- each change-feed table's replica (:class:`~lakemirror.sinks.postgres.spark_batches.PostgresTable`:
  COPY into a staging table and a sequence-guarded upsert per micro-batch, one transaction);
- an event source's replicas (:class:`~lakemirror.sinks.postgres.event_replicas.PostgresEventReplicas`),
  flushed by the driver or, in Real-Time Mode, by ``foreach`` writers on the executors;
- the scheduled cycles of triggered and snapshot replicas (:class:`~lakemirror.sinks.postgres.cycles.SparkCycles`);
- how the pipeline is described when it starts, and where its dead letters are (rows of the server's
  ``lakemirror_dead_letters``, not a Delta table the daemon lists).

The tables' streams, the cycles and the event sources' driver-side flushes share one pool of
connections (:class:`~lakemirror.sinks.postgres.executor.Connector`), at most the destination's
``pool_connections`` at once; Real-Time Mode's tasks hold one connection each beside it.

What it is handed is typed here by what it reads (:class:`Parts`, :class:`Settings`,
:class:`EventStream`), so that the package depends on no layer above ``sinks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from lakemirror.checkpoints import layout
from lakemirror.checkpoints.state import FileStateStore
from lakemirror.sinks.contract import TableReplica
from lakemirror.sinks.destination_parts import DestinationParts
from lakemirror.sinks.event_contract import EventSink
from lakemirror.sinks.postgres.cycles import CycleSpec, SparkCycles
from lakemirror.sinks.postgres.event_replicas import PostgresEventReplicas
from lakemirror.sinks.postgres.executor import Connector, PostgresTarget
from lakemirror.sinks.postgres.modes import Mode
from lakemirror.sinks.postgres.real_time import RealTimeSpec
from lakemirror.sinks.postgres.spark_batches import PostgresTable
from lakemirror.sinks.postgres.waits import ServerCalls
from lakemirror.sources.change_event import Decoded
from lakemirror.sources.event_stream import RawEvent

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KIND = "postgres"
#: The table of the change-feed replicas' dead letters, in the destination's schema.
FEED_DEAD_LETTERS = "lakemirror_dead_letters"


def letters_elsewhere(schema: str) -> str:
    """Where a pipeline writing PostgreSQL replicas keeps its change-feed tables' dead letters, in words
    (the daemon neither lists nor replays them: they are rows of the server)."""
    return (f"PostgreSQL replicas: their dead letters are rows of {FEED_DEAD_LETTERS} in PostgreSQL schema "
            f"{schema} (docs/postgres.md)")


class Parts(DestinationParts, Protocol):
    """What the destination takes of the composition root (each part made on first use)."""

    @property
    def spec(self) -> CycleSpec: ...


class Settings(Protocol):
    """The destination's settings (``destination: {kind: postgres, …}``, validated by the daemon)."""

    @property
    def snapshot_above_fraction(self) -> float: ...
    def target(self, executor_connections: int = 0) -> PostgresTarget:
        """The server, with the daemon's pool sized for ``executor_connections`` held by executors."""
        ...
    def cycled_modes(self) -> set[Mode]:
        """The modes other than continuous that some table uses."""
        ...


class RealTimeSettings(Protocol):
    """The event source's Real-Time Mode (``source.real_time``, validated by the daemon)."""

    @property
    def checkpoint_interval_seconds(self) -> float: ...
    @property
    def max_dwell_ms(self) -> int: ...
    @property
    def max_rows(self) -> int: ...
    @property
    def tasks(self) -> int | None: ...


class EventStream(Protocol):
    """What an event source's replicas read of its query's spec."""

    @property
    def name(self) -> str: ...
    @property
    def tables(self) -> Sequence[str] | None: ...
    @property
    def allow_schema_evolution(self) -> bool: ...
    @property
    def purge_interval_seconds(self) -> float: ...
    @property
    def tombstone_horizon_seconds(self) -> float: ...


class PostgresFactories:
    """One pipeline's PostgreSQL destination (see the module docstring)."""

    kind = KIND

    def __init__(self, parts: Parts, settings: Settings, real_time: RealTimeSettings | None = None) -> None:
        self.parts = parts
        self.settings = settings
        self.real_time = None if real_time is None else RealTimeSpec(
            real_time.checkpoint_interval_seconds, real_time.max_dwell_ms, real_time.max_rows, real_time.tasks)
        self.target = settings.target()
        #: The pool every table's batches, the cycles and the bootstraps share.
        self.connector = Connector(self.target)
        #: Where the replicas go, in words (logged once when the pipeline starts).
        self.reason = (f"destination kind {KIND}: {self.target.describe()}, COPY and a guarded upsert per "
                       f"micro-batch")
        self.letters_elsewhere = letters_elsewhere(self.target.schema)

    def replica(self, table: str, session: "SparkSession") -> TableReplica[Any]:
        """The replica of a change-feed table: a PostgreSQL table named as the source table."""
        spec = self.parts.spec
        label = str(spec.source(table))
        calls = ServerCalls(label, retry_seconds=self.target.retry_seconds,
                            statement_timeout_seconds=self.target.statement_timeout_seconds, clock=self.parts.clock)
        return PostgresTable(self.connector, spec.pipeline_id, table, label, fault=self.parts.fault, calls=calls)

    def event_sink(self, stream: EventStream, decoder: Callable[[RawEvent], Decoded], label: str) -> EventSink:
        """An event source's replicas; ``label`` names the source in waits and errors."""
        rt = self.real_time
        # Real-Time Mode's tasks hold one connection each; with their number unset (counted at the
        # broker when the source starts) the daemon keeps one connection of its own.
        executors = 0 if rt is None else (rt.tasks if rt.tasks is not None else self.target.max_connections - 1)
        return PostgresEventReplicas(
            self.settings.target(executor_connections=executors), self.parts.spec.pipeline_id, stream.name, decoder,
            label=label, tables=stream.tables, allow_evolution=stream.allow_schema_evolution,
            purge_interval_seconds=stream.purge_interval_seconds,
            tombstone_horizon_seconds=stream.tombstone_horizon_seconds, real_time=rt, clock=self.parts.clock)

    @property
    def has_cycles(self) -> bool:
        """Whether some table is kept by scheduled cycles (triggered or snapshot) rather than streamed."""
        return bool(self.settings.cycled_modes())

    def cycles(self) -> SparkCycles:
        """The cycles of the triggered and snapshot replicas, on the pool of the streamed ones."""
        parts = self.parts
        return SparkCycles(parts.spark, parts.catalog, self.connector, parts.spec, parts.states,
                           FileStateStore(layout.cycles_dir(parts.pipeline_dir)), self.settings.snapshot_above_fraction)


def destination(parts: Parts, settings: Settings, real_time: RealTimeSettings | None = None) -> PostgresFactories:
    """PostgreSQL replicas for the pipeline of ``parts``; ``real_time``: the event source runs in
    Spark's Real-Time Mode (``source.real_time``), its writers on the executors."""
    return PostgresFactories(parts, settings, real_time)
