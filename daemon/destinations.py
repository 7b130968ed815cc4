"""A pipeline's destination by its ``kind``: the one place a kind is looked up.

:data:`DESTINATIONS` maps each kind to the function that builds its :class:`Destination` from the
composition root's parts: the factories the runners are handed (``source_for`` and ``replica_for``
for each table runner, ``event_sink_for`` for an event source's runner) and the destination's own
scheduled work (``cycles``), so that no runner branches on a kind and none imports a destination's
package. :class:`~lakemirror.daemon.context.DaemonContext` looks the kind up once
(:func:`destination_for`); a new destination is a package under ``sinks/`` and one entry here.

Kinds: ``delta`` (the default: Delta tables in ``destination_catalog.destination_schema``),
``memory``, the in-memory twins the unit tests drive through the same runners and factories (not a
kind the settings offer), and the kinds whose package builds them (:func:`packaged`), each one
line of :data:`DESTINATIONS`.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, cast

from lakemirror.identifiers import TableName
from lakemirror.sinks.batch.operations import Operations
from lakemirror.sinks.contract import ReplicaFactory, TableReplica
from lakemirror.sinks.destination_parts import DestinationParts
from lakemirror.sinks.event_contract import EventSink
from lakemirror.sinks.events.memory_sink import MemoryEventStore, memory_event_sink
from lakemirror.sinks.memory import MemoryTableReplica
from lakemirror.sinks.merge.feed_letters import FEED_DEAD_LETTERS, FeedDeadLetters, FeedLetterStore, InMemoryFeedLetters
from lakemirror.sinks.waits import ServerWait
from lakemirror.sources.change_event import Decoded
from lakemirror.sources.contract import TableChangeSource
from lakemirror.sources.event_stream import RawEvent
from lakemirror.sources.memory import MemoryChangeSource
from lakemirror.supervisor.change_feed.dead_letters import FeedLetterDesk
from lakemirror.supervisor.change_feed.table_factories import SourceFactory, delta_change_feeds, delta_table_replicas
from lakemirror.supervisor.control.pipeline_spec import PipelineSpec
from lakemirror.sinks.events.delta_sink import delta_event_sink
from lakemirror.supervisor.events.stream_runner import RUNNER_PREFIX
from lakemirror.supervisor.events.stream_spec import EventStreamSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakemirror.daemon.settings import Settings

log = logging.getLogger(__name__)

#: Event-source pipelines write records they cannot apply to ``<destination schema>.<prefix><source name>``.
DEAD_LETTER_PREFIX = "_lakemirror_dead_letters_"

Decoder = Callable[[RawEvent], Decoded]


class Parts(DestinationParts, Protocol):
    """What a destination is built from: the composition root's parts (each made on first use)."""

    @property
    def settings(self) -> "Settings": ...
    @property
    def spec(self) -> PipelineSpec: ...
    @property
    def feed_letters(self) -> FeedLetterDesk: ...


class Cycles(Protocol):
    """A destination's scheduled cycles of tables kept without a stream (replicas refreshed on a
    schedule): operations of the batch runner beside the pipeline's own."""

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


class PackagedDestination(Protocol):
    """What a destination's own package builds (:func:`packaged`): its replicas, its event sinks, its
    cycles and its words; its tables' changes are the Delta change feed, as for every kind."""

    kind: str
    reason: str
    letters_elsewhere: str

    def replica(self, table: str, session: "SparkSession") -> TableReplica[Any]: ...
    def event_sink(self, stream: Any, decoder: Decoder, label: str) -> EventSink: ...
    @property
    def has_cycles(self) -> bool: ...
    def cycles(self) -> Cycles: ...


class DestinationPackage(Protocol):
    """A destination's module: ``destination(parts, settings, real_time)`` (``settings``: the kind's
    settings model; ``real_time``: the event source's Real-Time Mode, or None)."""

    def destination(self, parts: Any, settings: Any, real_time: Any = None) -> PackagedDestination: ...


def packaged(module: str) -> Callable[[Parts], Destination]:
    """The destination built by ``module`` (a package under ``sinks/``), imported when a pipeline
    takes it, so that a daemon writing elsewhere never loads its package (nor its client library)."""

    def build(parts: Parts) -> Destination:
        package = cast(DestinationPackage, importlib.import_module(module))
        source_settings = parts.settings.source
        made = package.destination(parts, parts.settings.destination,
                                   source_settings.real_time if source_settings is not None else None)

        def source(table: str, session: "SparkSession") -> TableChangeSource[Any]:
            return delta_change_feeds(parts.catalog, parts.spec)(table, session)

        def event_sink(stream: EventStreamSpec, decoder: Decoder) -> EventSink:
            return made.event_sink(stream, decoder, RUNNER_PREFIX + stream.name)

        return Destination(made.kind, made.reason, source, made.replica, event_sink,
                           made.cycles if made.has_cycles else None, letters_elsewhere=made.letters_elsewhere)

    return build


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
    "postgres": packaged("lakemirror.sinks.postgres.destination"),
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
