"""The in-memory twin of an event source (:class:`~lakemirror.sources.event_source.EventSource`).

Its raw messages are held in a list, as the rows the real source's stream delivers: Kafka records
(topic, partition, offset, key, value; offsets numbered per partition as they are sent) or whole
files (file, value). :meth:`MemoryEventSource.raw_events` and :attr:`MemoryEventSource.decoder` are
the real sources' own row conversion and decoder, so unit tests take micro-batches through the
runners' decode path without Spark; the broker's offsets are a test's
:class:`~lakemirror.sources.kafka_offsets.StaticOffsets` (or any :class:`BrokerOffsets`).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

from lakemirror.sources.debezium import FORMAT_DEBEZIUM
from lakemirror.sources.event_source import KIND_FILES, KIND_KAFKA
from lakemirror.sources.event_stream import (FILE_COLUMN, VALUE_COLUMN, EventDecoder, RawEvent,
                                             raw_events_from_file_rows, raw_events_from_kafka_rows)
from lakemirror.sources.kafka_offsets import BrokerOffsets

Row = dict[str, Any]


class MemoryEventSource:
    """An event source in memory: ``kind`` says which real source its rows and decoding stand for."""

    def __init__(self, kind: str = KIND_KAFKA, format: str = FORMAT_DEBEZIUM,
                 key_columns: Mapping[str, tuple[str, ...]] | None = None,
                 offsets: BrokerOffsets | None = None) -> None:
        if kind not in (KIND_FILES, KIND_KAFKA):
            raise ValueError(f"unknown event source kind {kind!r} (known: {KIND_FILES}, {KIND_KAFKA})")
        self.kind = kind
        self.format = format
        self.key_columns: Mapping[str, tuple[str, ...]] = dict(key_columns or {})
        self._offsets = offsets
        self.rows: list[Row] = []
        self.closed = False
        self._next_offset: dict[tuple[str, int], int] = {}

    def send(self, value: str | None, key: str | None = None, *, topic: str = "events", partition: int = 0) -> Row:
        """A Kafka record at the next offset of ``topic``'s ``partition`` (``value`` None: a tombstone)."""
        if self.kind != KIND_KAFKA:
            raise ValueError("send() is a Kafka record: this twin stands for a files source (add_file)")
        offset = self._next_offset.get((topic, partition), 0)
        self._next_offset[(topic, partition)] = offset + 1
        row: Row = {"topic": topic, "partition": partition, "offset": offset, "key": key, "value": value}
        self.rows.append(row)
        return row

    def add_file(self, path: str, lines: Iterable[str]) -> Row:
        """A whole JSON-lines file moved into the directory."""
        if self.kind != KIND_FILES:
            raise ValueError("add_file() is a file: this twin stands for a Kafka source (send)")
        row: Row = {FILE_COLUMN: path, VALUE_COLUMN: "\n".join(lines)}
        self.rows.append(row)
        return row

    def stream(self, spark: object = None) -> list[Row]:
        """Every row held, in arrival order (what a query started now reads first)."""
        return list(self.rows)

    def raw_events(self, rows: Iterable[Any]) -> Iterator[RawEvent]:
        return raw_events_from_kafka_rows(rows) if self.kind == KIND_KAFKA else raw_events_from_file_rows(rows)

    @property
    def decoder(self) -> EventDecoder:
        return EventDecoder(self.kind, self.format, self.key_columns)

    @property
    def offsets(self) -> BrokerOffsets | None:
        return self._offsets

    def close(self) -> None:
        self.closed = True
        if self._offsets is not None:
            self._offsets.close()
