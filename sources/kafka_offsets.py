"""How far an event stream is behind its Kafka topics, per topic-partition.

Spark keeps its Kafka offsets in the query's checkpoint and never commits them to a consumer
group, so no external lag exporter (one that reads a group's committed offsets) can see them.
Offsets behind are computed
here from the two ends:

- applied: the end offsets of the last batch the query completed (``endOffset`` of the Kafka
  source in Spark's progress: the next offset to read, per partition), which the batch function
  committed to the replicas before Spark recorded the batch;
- latest: the broker's end offsets of every partition of the subscribed topics
  (:class:`BrokerOffsets`, a kafka-python consumer that never joins a group or commits).

How long ago the backlog began is read from the broker too: the first message of each partition
that is behind (:meth:`BrokerOffsets.first_records`, at the applied end offset) is the oldest one
the replicas have not taken, and its time is when that partition's backlog began.

:func:`offsets_behind` is pure; a partition the query has not read yet counts from the partition's
beginning offset (the query starts from ``earliest``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]


def parse_end_offsets(value: Any) -> Offsets:
    """Spark's Kafka offsets (``{"topic": {"0": 42, …}}``, as JSON text or a dict) as a flat map."""
    if value is None:
        return {}
    doc = json.loads(value) if isinstance(value, str) else value
    if not isinstance(doc, dict):
        return {}
    out: Offsets = {}
    for topic, partitions in doc.items():
        if isinstance(partitions, dict):
            for partition, offset in partitions.items():
                out[(str(topic), int(partition))] = int(offset)
    return out


def progress_end_offsets(progress: Any) -> Offsets:
    """The Kafka end offsets of a ``StreamingQueryProgress`` (attribute or dict style), all sources."""
    if progress is None:
        return {}
    sources = getattr(progress, "sources", None)
    if sources is None and isinstance(progress, Mapping):
        sources = progress.get("sources")
    out: Offsets = {}
    for source in sources or ():
        end = getattr(source, "endOffset", None)
        if end is None and isinstance(source, Mapping):
            end = source.get("endOffset")
        try:
            out.update(parse_end_offsets(end))
        except (ValueError, TypeError):  # not a Kafka source's offsets (a file source's): not ours to count
            continue
    return out


def offsets_behind(applied: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
                   beginning: Mapping[TopicPartition, int] | None = None) -> Offsets:
    """Per partition of ``latest``: messages the broker holds that the replicas have not taken."""
    out: Offsets = {}
    for tp, end in latest.items():
        start = applied.get(tp, (beginning or {}).get(tp, 0))
        out[tp] = max(0, end - start)
    return out


@dataclass(frozen=True)
class BrokerRecord:
    """One message as the broker holds it: where it is, when the broker got it, what it says."""

    offset: int
    timestamp_ms: int | None   # the record's time (its producer's, or the broker's append time); None if unset
    key: str | None = None
    value: str | None = None


class BrokerOffsets(Protocol):
    """The broker's view of the subscribed partitions."""

    def latest(self) -> tuple[Offsets, Offsets]:
        """(end offsets, beginning offsets) of every partition of the subscribed topics."""
        ...

    def first_records(self, positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, BrokerRecord]:
        """Per partition, the first message at or after its position that the broker holds; a
        partition whose message does not arrive in time is left out."""
        ...

    def close(self) -> None: ...


class StaticOffsets:
    """The in-memory twin: offsets and messages set by the test."""

    def __init__(self, end: Offsets | None = None, beginning: Offsets | None = None,
                 records: Mapping[TopicPartition, list[BrokerRecord]] | None = None) -> None:
        self.end = dict(end or {})
        self.beginning = dict(beginning or {})
        self.records = {tp: list(rs) for tp, rs in (records or {}).items()}
        #: The positions each :meth:`first_records` call asked for, in order.
        self.asked: list[dict[TopicPartition, int]] = []

    def latest(self) -> tuple[Offsets, Offsets]:
        return dict(self.end), dict(self.beginning)

    def first_records(self, positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, BrokerRecord]:
        self.asked.append(dict(positions))
        out: dict[TopicPartition, BrokerRecord] = {}
        for tp, position in positions.items():
            held = [r for r in self.records.get(tp, ()) if r.offset >= position]
            if held:
                out[tp] = min(held, key=lambda r: r.offset)
        return out

    def close(self) -> None:
        pass


def _topic_matcher(topics: str | None, pattern: str | None) -> Any:
    if pattern:
        compiled = re.compile(pattern)  # Spark's subscribePattern is a Java regex; simple ones read the same
        return lambda t: compiled.fullmatch(t) is not None
    wanted = {t.strip() for t in (topics or "").split(",") if t.strip()}
    return lambda t: t in wanted


class KafkaBrokerOffsets:
    """End offsets from the broker with kafka-python: metadata and ListOffsets requests only (no group)."""

    #: A message is fetched with its record batch; a small fetch keeps a probe's read small (the broker
    #: still returns a first batch larger than this whole).
    RECORD_FETCH_BYTES = 64 * 1024

    def __init__(self, bootstrap_servers: str, *, topics: str | None = None, topic_pattern: str | None = None,
                 timeout_ms: int = 5000, record_timeout_ms: int = 2000) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.matches = _topic_matcher(topics, topic_pattern)
        self.timeout_ms = timeout_ms
        self.record_timeout_ms = record_timeout_ms
        self._consumer: Any = None
        self._reader: Any = None

    def _new_consumer(self, **config: Any) -> Any:
        from kafka import KafkaConsumer

        # kafka-python logs every metadata refresh at INFO and slow polls at WARNING: one line a
        # probe. A failed request raises, and the supervisor's lag probe reports that.
        logging.getLogger("kafka").setLevel(logging.ERROR)
        return KafkaConsumer(bootstrap_servers=self.bootstrap_servers, group_id=None, enable_auto_commit=False,
                             request_timeout_ms=max(self.timeout_ms, 1000) + 1000, **config)

    def _client(self) -> Any:
        if self._consumer is None:
            self._consumer = self._new_consumer()
        return self._consumer

    def first_records(self, positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, BrokerRecord]:
        """Seeks a consumer of its own (no group, nothing committed) to each position and keeps the
        first message each partition returns within ``record_timeout_ms``. A position the broker no
        longer holds reads from the partition's oldest message."""
        from kafka import TopicPartition as KTP

        if not positions:
            return {}
        if self._reader is None:
            self._reader = self._new_consumer(auto_offset_reset="earliest",
                                              max_partition_fetch_bytes=self.RECORD_FETCH_BYTES)
        reader = self._reader
        wanted = {KTP(t, p): offset for (t, p), offset in positions.items()}
        reader.assign(list(wanted))
        for tp, offset in wanted.items():
            reader.seek(tp, offset)
        out: dict[TopicPartition, BrokerRecord] = {}
        deadline = time.monotonic() + self.record_timeout_ms / 1000.0
        while len(out) < len(wanted):
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            for tp, records in reader.poll(timeout_ms=left_ms).items():
                held = [r for r in records if r.offset >= wanted.get(tp, 0)]
                if held and (tp.topic, tp.partition) not in out:
                    first = min(held, key=lambda r: r.offset)
                    out[(tp.topic, tp.partition)] = BrokerRecord(
                        first.offset, first.timestamp if first.timestamp is not None and first.timestamp >= 0 else None,
                        _text(first.key), _text(first.value))
                    reader.pause(tp)
        reader.unsubscribe()  # drops the assignment: the next probe assigns what it asks
        return out

    def latest(self) -> tuple[Offsets, Offsets]:
        from kafka import TopicPartition as KTP

        consumer = self._client()
        partitions = [KTP(t, p) for t in sorted(consumer.topics()) if self.matches(t)
                      for p in sorted(consumer.partitions_for_topic(t) or ())]
        if not partitions:
            return {}, {}
        end = consumer.end_offsets(partitions, self.timeout_ms)
        begin = consumer.beginning_offsets(partitions, self.timeout_ms)
        return ({(tp.topic, tp.partition): int(o) for tp, o in end.items()},
                {(tp.topic, tp.partition): int(o) for tp, o in begin.items()})

    def close(self) -> None:
        consumers, self._consumer, self._reader = (self._consumer, self._reader), None, None
        failures = []
        for consumer in consumers:
            if consumer is not None:
                try:
                    consumer.close()
                except Exception as exc:  # noqa: BLE001 (close the other one, then say why)
                    failures.append(exc)
        if failures:
            raise failures[0]


def _text(raw: bytes | None) -> str | None:
    """A message's key or value as text, as Spark's ``CAST(value AS STRING)`` reads it."""
    return None if raw is None else raw.decode("utf-8", errors="replace")
