"""The raw messages of event streams and their decoder, with Spark's readers of the two kinds.

:func:`kafka_stream` (Kafka topics) and :func:`file_stream` (JSON-lines files in a directory) are
Structured Streaming sources of raw messages only; :mod:`lakemirror.sources.event_source` wraps them
as the :class:`~lakemirror.sources.event_source.EventSource` implementations the runners use. Each
micro-batch row becomes a :class:`RawEvent` that remembers where it came from, so a poison message
reaches the dead letters with its file and line (or topic, partition and offset). :class:`EventDecoder`
turns each into the change contract with the pure :mod:`lakemirror.sources.debezium`: on the driver
in a micro-batch, on the executors in Real-Time Mode. :func:`decode_batch` sorts a micro-batch's
decoded events into the changes to apply, the messages to skip and the dead letters.

Files: Spark's file source reads each new file once, whole (``wholetext``), so a line's number in
its file is known exactly; files must be moved into the directory complete (write elsewhere, then
rename), as for any Spark file source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable, Iterator, Mapping

from lakemirror.sources.change_event import ChangeEvent, DeadLetter, Decoded, Skipped
from lakemirror.sources.debezium import FORMAT_DEBEZIUM, decode_debezium, decode_line

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FILE_COLUMN = "file"
VALUE_COLUMN = "value"


@dataclass(frozen=True)
class RawEvent:
    """One message as read, before decoding."""

    value: str | None
    key: str | None = None
    origin: str = ""              # the file's path, or the Kafka topic
    partition: int | None = None  # Kafka partition (None for files)
    offset: int = 0               # Kafka offset, or the 1-based line number in the file


@dataclass(frozen=True)
class EventDecoder:
    """One raw message into the change contract, by the source's kind and format. Picklable, so a
    ``foreach`` writer on an executor decodes as the driver's batch function does."""

    kind: str                                   # files | kafka
    format: str = FORMAT_DEBEZIUM               # debezium | simple
    key_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __call__(self, raw: RawEvent) -> Decoded:
        keys = dict(self.key_columns)
        if raw.partition is not None or self.kind == "kafka":
            if self.format == FORMAT_DEBEZIUM:
                return decode_debezium(raw.value, raw.key, key_columns=keys, topic=raw.origin)
            if raw.value is None:
                return Skipped("tombstone (a null value)")
        return decode_line(raw.value or "", self.format, key_columns=keys)


@dataclass
class DecodedBatch:
    """A micro-batch's raw events decoded, in source order: the changes to apply, each with the raw
    event it came from (:meth:`raw_of`), and the dead letters with theirs."""

    events: int = 0                                             # raw events read
    skipped: int = 0                                            # tombstones, markers, tables not replicated
    changes: list[ChangeEvent] = field(default_factory=list)
    dead_letters: list[tuple[RawEvent, DeadLetter]] = field(default_factory=list)
    _origin: dict[int, RawEvent] = field(default_factory=dict)

    def raw_of(self, change: ChangeEvent) -> RawEvent:
        """The raw event ``change`` was decoded from (one of :attr:`changes`)."""
        return self._origin[id(change)]


def decode_batch(raws: Iterable[RawEvent], decode: Callable[[RawEvent], Decoded],
                 tables: Collection[str] | None = None) -> DecodedBatch:
    """Each raw event decoded: a change of one of ``tables`` (None: of any table), a message to skip
    (a change of another table too), or a dead letter."""
    batch = DecodedBatch()
    for raw in raws:
        batch.events += 1
        decoded = decode(raw)
        if isinstance(decoded, DeadLetter):
            batch.dead_letters.append((raw, decoded))
        elif isinstance(decoded, Skipped):
            batch.skipped += 1
        elif tables is not None and decoded.table not in tables:
            batch.skipped += 1
        else:
            batch.changes.append(decoded)
            batch._origin[id(decoded)] = raw
    return batch


def lines_of(file: str, text: str | None) -> Iterator[RawEvent]:
    """The non-blank lines of one file as raw events, numbered from 1."""
    for number, line in enumerate((text or "").splitlines(), start=1):
        if line.strip():
            yield RawEvent(line, None, file, None, number)


def raw_events_from_file_rows(rows: Iterable[Any]) -> Iterator[RawEvent]:
    """Rows of :func:`file_stream` (one per file) as raw events, files in path order."""
    for row in sorted(rows, key=lambda r: str(r[FILE_COLUMN])):
        yield from lines_of(str(row[FILE_COLUMN]), row[VALUE_COLUMN])


def file_stream(spark: "SparkSession", path: str, *, max_files_per_trigger: int | None = None) -> "DataFrame":
    """New files of ``path`` as a stream of (file, value = the whole file's text)."""
    reader = spark.readStream.format("text").option("wholetext", "true")
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    return reader.load(path).selectExpr(f"_metadata.file_path AS {FILE_COLUMN}", VALUE_COLUMN)


def raw_event_from_kafka_row(row: Any) -> RawEvent:
    """One row of :func:`kafka_stream` (a micro-batch's, or one a ``foreach`` writer is handed)."""
    return RawEvent(row["value"], row["key"], row["topic"], int(row["partition"]), int(row["offset"]))


def raw_events_from_kafka_rows(rows: Iterable[Any]) -> Iterator[RawEvent]:
    """Rows of :func:`kafka_stream` as raw events, in (topic, partition, offset) order."""
    for row in sorted(rows, key=lambda r: (r["topic"], r["partition"], r["offset"])):
        yield raw_event_from_kafka_row(row)


def kafka_stream(spark: "SparkSession", bootstrap_servers: str, *, topics: str | None = None,
                 topic_pattern: str | None = None, starting_offsets: str = "earliest",
                 max_offsets_per_trigger: int | None = None) -> "DataFrame":
    """Spark's Kafka source: key and value as strings; offsets live in the query's checkpoint."""
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap_servers)
              .option("startingOffsets", starting_offsets).option("failOnDataLoss", "true"))
    if topic_pattern:
        reader = reader.option("subscribePattern", topic_pattern)
    else:
        reader = reader.option("subscribe", topics or "")
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load().selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value",
                                    "topic", "partition", "offset")
