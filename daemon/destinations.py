"""A pipeline's destination by its ``kind``: the one place a kind is looked up.

:data:`DESTINATIONS` maps each kind to the function that builds its :class:`Destination` from the
composition root's parts: the factories the runners are handed (``source_for`` and ``replica_for``
for each table runner, ``event_sink_for`` for an event source's runner) and the destination's own
scheduled work (``cycles``), so that no runner branches on a kind and none imports a destination's
package. :class:`~lakemirror.daemon.context.DaemonContext` looks the kind up once
(:func:`destination_for`); a new destination is a package under ``sinks/`` and one entry here.

Kinds: ``delta`` (the default: Delta tables in ``destination_catalog.destination_schema``),
``postgres`` (:mod:`lakemirror.sinks.postgres`) and ``memory``, the in-memory twins the unit tests
drive through the same runners and factories (not a kind the settings offer).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from lakemirror.checkpoints import layout
from lakemirror.checkpoints.state import FileStateStore, StateStore
from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.operations import Operations
from lakemirror.sinks.contract import ReplicaFactory, TableReplica
from lakemirror.sinks.event_contract import EventSink
from lakemirror.sinks.events.memory_sink import MemoryEventStore
from lakemirror.sinks.memory import MemoryTableReplica
from lakemirror.sinks.merge.feed_letters import FEED_DEAD_LETTERS, FeedDeadLetters, FeedLetterStore, InMemoryFeedLetters
from lakemirror.sinks.postgres.cycles import SparkCycles
from lakemirror.sinks.postgres.event_replicas import PostgresEventReplicas
from lakemirror.sinks.postgres.executor import Connector
from lakemirror.sinks.postgres.real_time import RealTimeSpec
from lakemirror.sinks.postgres.spark_batches import PostgresTable
from lakemirror.sinks.postgres.waits import ServerCalls
from lakemirror.sinks.waits import ServerWait
from lakemirror.sources.catalog import Catalog
from lakemirror.sources.change_event import Decoded
from lakemirror.sources.contract import TableChangeSource
from lakemirror.sources.event_stream import RawEvent
from lakemirror.sources.memory import MemoryChangeSource
from lakemirror.supervisor.change_feed.dead_letters import FeedLetterDesk
from lakemirror.supervisor.change_feed.table_factories import SourceFactory, delta_change_feeds, delta_table_replicas
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec
from lakemirror.supervisor.events.batch_apply import EventStreamSpec, delta_event_sink, memory_event_sink
from lakemirror.supervisor.events.stream_runner import RUNNER_PREFIX

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakemirror.daemon.settings import Settings

log = logging.getLogger(__name__)

#: Event-source pipelines write records they cannot apply to ``<destination schema>.<prefix><source name>``.
DEAD_LETTER_PREFIX = "_lakemirror_dead_letters_"

Decoder = Callable[[RawEvent], Decoded]


class Parts(Protocol):
    """What a destination is built from: the composition root's parts (each made on first use)."""

    @property
    def settings(self) -> "Settings": ...
    @property
    def spark(self) -> "SparkSession": ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def spec(self) -> PipelineSpec: ...
    @property
    def states(self) -> StateStore: ...
    @property
    def pipeline_dir(self) -> Path: ...
    @property
    def fault(self) -> Callable[[str], None]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def feed_letters(self) -> FeedLetterDesk: ...


class Cycles(Protocol):
    """A destination's scheduled cycles of tables kept without a stream (PostgreSQL's triggered and
    snapshot replicas): operations of the batch runner beside the pipeline's own."""

    def around(self, base: Operations) -> Operations:
        """``base`` (the sub-tasks' operations) with the cycles' operations added."""
        ...

    def wait_of(self, table: str) -> ServerWait | None:
        """What the table's cycle waits on in the destination's server now, or None."""
        ...


@dataclass(frozen=True)
class Destination:
    """One pipeline's destination: the factories its runners are handed."""

    kind: str
    #: Where the replicas go, in words (logged once when the pipeline starts).
    reason: str
    #: Each table's change source: ``source_for(table, session)``.
    source_for: SourceFactory
    #: Each table's replica: ``replica_for(table, session)``.
    replica_for: ReplicaFactory
    #: The event sink of an event source: ``event_sink_for(spec, decoder)``.
    event_sink_for: Callable[[EventStreamSpec, Decoder], EventSink]
    #: The destination's cycles, made on their first run (None: it has none).
    cycles: Callable[[], Cycles] | None = None
    #: Where the change-feed tables' dead letters are recorded, for the operator to list, skip and
    #: replay (None: the destination keeps them itself, as :attr:`letters_elsewhere` says).
    feed_letter_store: Callable[[], FeedLetterStore] | None = None
    #: Where the destination keeps its replicas' dead letters when it has no :attr:`feed_letter_store`.
    letters_elsewhere: str = ""


def delta(parts: Parts) -> Destination:
    """Delta replicas in ``destination_catalog.destination_schema`` (the default)."""
    spec = parts.spec

    def replica(table: str, session: "SparkSession") -> TableReplica[Any]:
        return delta_table_replicas(parts.catalog, spec, parts.fault,
                                    on_letters=lambda found: parts.feed_letters.recorded(found))(table, session)

    def source(table: str, session: "SparkSession") -> TableChangeSource[Any]:
        return delta_change_feeds(parts.catalog, spec)(table, session)

    def event_sink(stream: EventStreamSpec, decoder: Decoder) -> EventSink:
        schema = (spec.destination_catalog, spec.destination_schema)

        def locate(table: str) -> Any:
            return parts.catalog.locate(TableName(*schema, table))

        return delta_event_sink(stream, decoder, spec.pipeline_id, parts.spark, locate,
                                locate(DEAD_LETTER_PREFIX + stream.name), parts.clock, parts.fault,
                                on_prepare=lambda: parts.catalog.ensure_schema(parts.spark, *schema))

    def letters() -> FeedLetterStore:
        return FeedDeadLetters(parts.catalog.locate(TableName(spec.destination_catalog, spec.destination_schema,
                                                              FEED_DEAD_LETTERS)), spec.pipeline_id)

    return Destination("delta", "destination kind delta: Delta replicas, one MERGE (or rewrite) per micro-batch",
                       source, replica, event_sink, feed_letter_store=letters)


def postgres(parts: Parts) -> Destination:
    """PostgreSQL replicas (:mod:`lakemirror.sinks.postgres`): COPY and a guarded upsert per batch; the
    tables' streams, their cycles and the event sources' flushes share one pool of connections."""
    d = parts.settings.destination
    target = d.target()  # type: ignore[union-attr]
    connector = Connector(target)
    spec = parts.spec

    def replica(table: str, session: "SparkSession") -> TableReplica[Any]:
        label = str(spec.source(table))
        calls = ServerCalls(label, retry_seconds=target.retry_seconds,
                            statement_timeout_seconds=target.statement_timeout_seconds, clock=parts.clock)
        return PostgresTable(connector, spec.pipeline_id, table, label, fault=parts.fault, calls=calls)

    def source(table: str, session: "SparkSession") -> TableChangeSource[Any]:
        return delta_change_feeds(parts.catalog, spec)(table, session)

    def event_sink(stream: EventStreamSpec, decoder: Decoder) -> EventSink:
        event_source = parts.settings.source
        rt = event_source.real_time if event_source is not None else None
        # Real-Time Mode's tasks hold one connection each; with their number unset (counted at the
        # broker when the source starts) the daemon keeps one connection of its own.
        executors = 0 if rt is None else (rt.tasks if rt.tasks is not None else target.max_connections - 1)
        real_time = None if rt is None else RealTimeSpec(rt.checkpoint_interval_seconds, rt.max_dwell_ms,
                                                          rt.max_rows, rt.tasks)
        return PostgresEventReplicas(
            d.target(executor_connections=executors), spec.pipeline_id, stream.name, decoder,  # type: ignore[union-attr]
            label=RUNNER_PREFIX + stream.name, tables=stream.tables, allow_evolution=stream.allow_schema_evolution,
            purge_interval_seconds=stream.purge_interval_seconds,
            tombstone_horizon_seconds=stream.tombstone_horizon_seconds, real_time=real_time, clock=parts.clock)

    def cycles() -> Cycles:
        return SparkCycles(parts.spark, parts.catalog, connector, spec, parts.states,
                           FileStateStore(layout.cycles_dir(parts.pipeline_dir)),
                           d.snapshot_above_fraction)  # type: ignore[union-attr]

    return Destination("postgres", f"destination kind postgres: {target.describe()}, COPY and a guarded upsert per "
                                   f"micro-batch", source, replica, event_sink,
                       cycles if d.cycled_modes() else None,  # type: ignore[union-attr]
                       letters_elsewhere=f"PostgreSQL replicas: their dead letters are rows of lakemirror_dead_letters "
                                         f"in PostgreSQL schema {target.schema}")


@dataclass(frozen=True)
class MemoryDestination(Destination):
    """The in-memory twins, and what they hold: a test puts its source tables in :attr:`sources`
    and reads the replicas from :attr:`replicas` and :attr:`events`."""

    sources: dict[str, MemoryChangeSource] = field(default_factory=dict)
    replicas: dict[str, MemoryTableReplica] = field(default_factory=dict)
    events: dict[str, MemoryEventStore] = field(default_factory=dict)
    letters: InMemoryFeedLetters = field(default_factory=InMemoryFeedLetters)


def memory(parts: Parts) -> Destination:
    """The in-memory twins: source tables (:class:`~lakemirror.sources.memory.MemoryChangeSource`),
    table replicas (:class:`~lakemirror.sinks.memory.MemoryTableReplica`) and each event source's
    replicas and dead letters (:class:`~lakemirror.sinks.events.memory_sink.MemoryEventStore`)."""
    spec = parts.spec
    sources: dict[str, MemoryChangeSource] = {}
    replicas: dict[str, MemoryTableReplica] = {}
    events: dict[str, MemoryEventStore] = {}
    letters = InMemoryFeedLetters()

    def source(table: str, session: Any) -> TableChangeSource[Any]:
        if table not in sources:
            raise LookupError(f"no in-memory source table {table!r}: put one in the destination's sources")
        return sources[table]

    def replica(table: str, session: Any) -> TableReplica[Any]:
        return replicas.setdefault(table, MemoryTableReplica(spec.pipeline_id))

    def event_sink(stream: EventStreamSpec, decoder: Decoder) -> EventSink:
        store = events.setdefault(stream.name, MemoryEventStore(clock=parts.clock))
        return memory_event_sink(stream, decoder, spec.pipeline_id, store, clock=parts.clock, fault=parts.fault)

    return MemoryDestination("memory", "destination kind memory: in-memory replicas (tests)", source, replica,
                             event_sink, None, lambda: letters, "", sources, replicas, events, letters)


#: Every destination kind, with the function that builds it.
DESTINATIONS: Mapping[str, Callable[[Parts], Destination]] = {
    "delta": delta,
    "postgres": postgres,
    "memory": memory,
}


def destination_for(parts: Parts) -> Destination:
    """The destination ``parts.settings`` names, by its kind."""
    kind = parts.settings.destination.kind
    build = DESTINATIONS.get(kind)
    if build is None:
        raise ValueError(f"unknown destination kind {kind!r} (known: {', '.join(sorted(DESTINATIONS))})")
    built = build(parts)
    log.info("pipeline %s: %s", parts.spec.pipeline_id, built.reason)
    return built
