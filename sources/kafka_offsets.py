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

:func:`offsets_behind` is pure; a partition the query has not read yet counts from the partition's
beginning offset (the query starts from ``earliest``).
"""

from __future__ import annotations

import json
import logging
import re
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


class BrokerOffsets(Protocol):
    """The broker's view of the subscribed partitions."""

    def latest(self) -> tuple[Offsets, Offsets]:
        """(end offsets, beginning offsets) of every partition of the subscribed topics."""
        ...

    def close(self) -> None: ...


class StaticOffsets:
    """The in-memory twin: offsets set by the test."""

    def __init__(self, end: Offsets | None = None, beginning: Offsets | None = None) -> None:
        self.end = dict(end or {})
        self.beginning = dict(beginning or {})

    def latest(self) -> tuple[Offsets, Offsets]:
        return dict(self.end), dict(self.beginning)

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

    def __init__(self, bootstrap_servers: str, *, topics: str | None = None, topic_pattern: str | None = None,
                 timeout_ms: int = 5000) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.matches = _topic_matcher(topics, topic_pattern)
        self.timeout_ms = timeout_ms
        self._consumer: Any = None

    def _client(self) -> Any:
        if self._consumer is None:
            from kafka import KafkaConsumer

            # kafka-python logs every metadata refresh at INFO and slow polls at WARNING: one line a
            # probe. A failed request raises, and the supervisor's lag probe reports that.
            logging.getLogger("kafka").setLevel(logging.ERROR)

            self._consumer = KafkaConsumer(bootstrap_servers=self.bootstrap_servers, group_id=None,
                                           enable_auto_commit=False, request_timeout_ms=max(self.timeout_ms, 1000) + 1000)
        return self._consumer

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
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None
