"""Where an event source plugs in: the :class:`EventSource` protocol, its two implementations and
:func:`event_source_for`, the one place that picks an implementation by the source's kind.

An event source delivers the change events of many tables in one stream (Kafka topics carrying
Debezium envelopes or the simple event form, or JSON-lines files moved into a directory); it is the
counterpart of :class:`~lakemirror.sources.contract.ChangeSource`, which serves one table. The
runner (:mod:`lakemirror.supervisor.events.stream_runner`, whatever the destination)
read the source only through the protocol: a new kind of event source is a class here and one
branch of :func:`event_source_for`.

Implementations: :class:`KafkaEventSource` (Spark's Kafka source, with the broker's offsets for
lag), :class:`FileEventSource` (Spark's file source over whole files) and
:class:`lakemirror.sources.memory_events.MemoryEventSource`, the in-memory twin unit tests use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Protocol, TypeVar

from lakemirror.sources.change_event import Decoded
from lakemirror.sources.debezium import FORMAT_DEBEZIUM
from lakemirror.sources.event_stream import (EventDecoder, RawEvent, file_stream, kafka_stream,
                                             raw_events_from_file_rows, raw_events_from_kafka_rows)
from lakemirror.sources.kafka_offsets import BrokerOffsets, KafkaBrokerOffsets

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

KIND_FILES, KIND_KAFKA = "files", "kafka"

#: What a source's stream is: a Spark streaming DataFrame, or the twin's list of rows.
StreamFrame = TypeVar("StreamFrame", covariant=True)


class EventSource(Protocol[StreamFrame]):
    """Many tables' change events in one stream, as raw messages, with the decoder to the contract.

    Lifecycle: built once per runner from the source's settings (:func:`event_source_for`); holds no
    Spark resources. The runner calls :meth:`stream` each time it starts the source's query;
    :meth:`raw_events` on the driver for each micro-batch's collected rows; :attr:`decoder` when
    the runner is built (used on the driver, and pickled to the executors by Real-Time Mode's
    ``foreach`` writer); :attr:`offsets` on every lag probe, before a resync and before a Real-Time
    Mode start; :meth:`close` when the runner halts.
    A closed source may be used again: its offsets client reconnects on the next call.
    """

    def stream(self, spark: "SparkSession") -> StreamFrame:
        """The raw messages as a stream; where it resumes is kept in the query's checkpoint."""
        ...

    def raw_events(self, rows: Iterable[Any]) -> Iterator[RawEvent]:
        """One micro-batch's rows as raw events in source order (per partition by offset, per file
        by line), each remembering where it came from for the dead letters."""
        ...

    @property
    def decoder(self) -> Callable[[RawEvent], Decoded]:
        """One raw event into the change contract (keys, an orderable position, an operation,
        columns), a message to skip, or a dead letter. Picklable."""
        ...

    @property
    def offsets(self) -> BrokerOffsets | None:
        """The source's own view of what it holds, to count the messages not yet applied (lag) and
        to check that a replay can reach everything (resync); None where the source has none."""
        ...

    def close(self) -> None:
        """Release the offsets client's connection (a no-op for a source without one)."""
        ...


class EventSourceOptions(Protocol):
    """The settings an event source is built from
    (:class:`~lakemirror.supervisor.events.stream_runner.EventStreamSpec`)."""

    @property
    def kind(self) -> str: ...                                 # files | kafka
    @property
    def format(self) -> str: ...                               # debezium | simple
    @property
    def path(self) -> str | None: ...                          # files: the directory
    @property
    def bootstrap_servers(self) -> str | None: ...             # kafka
    @property
    def topics(self) -> str | None: ...                        # kafka: comma-separated topics
    @property
    def topic_pattern(self) -> str | None: ...                 # kafka: or a pattern
    @property
    def key_columns(self) -> Mapping[str, tuple[str, ...]]: ...  # for events without a key
    @property
    def max_per_trigger(self) -> int | None: ...               # files or offsets per micro-batch


@dataclass(frozen=True, kw_only=True)
class KafkaEventSource:
    """Kafka topics (by name or pattern) read by Spark's Kafka source; offsets from the broker."""

    bootstrap_servers: str
    topics: str | None = None
    topic_pattern: str | None = None
    format: str = FORMAT_DEBEZIUM
    key_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    max_offsets_per_trigger: int | None = None
    #: The broker's end offsets (:class:`~lakemirror.sources.kafka_offsets.KafkaBrokerOffsets`).
    offsets: BrokerOffsets

    def stream(self, spark: "SparkSession") -> "DataFrame":
        return kafka_stream(spark, self.bootstrap_servers, topics=self.topics, topic_pattern=self.topic_pattern,
                            max_offsets_per_trigger=self.max_offsets_per_trigger)

    def raw_events(self, rows: Iterable[Any]) -> Iterator[RawEvent]:
        return raw_events_from_kafka_rows(rows)

    @property
    def decoder(self) -> EventDecoder:
        return EventDecoder(KIND_KAFKA, self.format, self.key_columns)

    def close(self) -> None:
        self.offsets.close()


@dataclass(frozen=True, kw_only=True)
class FileEventSource:
    """JSON-lines files moved into a directory, read whole by Spark's file source; no offsets."""

    path: str
    format: str = FORMAT_DEBEZIUM
    key_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    max_files_per_trigger: int | None = None

    def stream(self, spark: "SparkSession") -> "DataFrame":
        return file_stream(spark, self.path, max_files_per_trigger=self.max_files_per_trigger)

    def raw_events(self, rows: Iterable[Any]) -> Iterator[RawEvent]:
        return raw_events_from_file_rows(rows)

    @property
    def decoder(self) -> EventDecoder:
        return EventDecoder(KIND_FILES, self.format, self.key_columns)

    @property
    def offsets(self) -> BrokerOffsets | None:
        return None  # Spark's file source has no backlog to ask, and every file left is read again

    def close(self) -> None:
        pass


def event_source_for(options: EventSourceOptions) -> EventSource["DataFrame"]:
    """The event source ``options`` describe, by its kind."""
    if options.kind == KIND_KAFKA:
        servers = options.bootstrap_servers or ""
        return KafkaEventSource(bootstrap_servers=servers, topics=options.topics, topic_pattern=options.topic_pattern,
                                format=options.format, key_columns=options.key_columns,
                                max_offsets_per_trigger=options.max_per_trigger,
                                offsets=KafkaBrokerOffsets(servers, topics=options.topics,
                                                           topic_pattern=options.topic_pattern))
    if options.kind == KIND_FILES:
        return FileEventSource(path=options.path or "", format=options.format, key_columns=options.key_columns,
                               max_files_per_trigger=options.max_per_trigger)
    raise ValueError(f"unknown event source kind {options.kind!r} (known: {KIND_FILES}, {KIND_KAFKA})")
