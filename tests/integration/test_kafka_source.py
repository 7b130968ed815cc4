"""The Kafka variant of an event source, against a real single-node KRaft broker started by
scripts/kafka.sh on loopback (the session's ``broker``, tests/conftest.py): Debezium-shaped
messages produced with kafka-python, read by Spark's Kafka source (offsets in the query's
checkpoint), applied exactly."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from lakemirror import tables
from lakemirror.identifiers import TableName
from lakemirror.sinks.events.guard_plan import POSITION_COLUMN, ordered_fold
from lakemirror.sources.change_event import ChangeEvent
from lakemirror.sources.debezium import decode_debezium
from lakemirror.supervisor.change_feed.table_runner import BatchReport
from lakemirror.supervisor.control import table_state as sm
from lakemirror.sinks.events.delta_sink import delta_event_sink
from lakemirror.sources.event_source import event_source_for
from lakemirror.supervisor.events.stream_runner import EventStreamRunner, EventStreamSpec
from lakemirror.tables import TableLocation

pytestmark = pytest.mark.integration


def envelope(op: str, lsn: int, key: dict[str, Any], after: dict[str, Any] | None, table: str) -> dict[str, Any]:
    source = {"version": "3.7.0.Final", "connector": "postgresql", "name": "shop", "ts_ms": 1764063000000 + lsn,
              "snapshot": "last" if op == "r" else "false", "db": "shop", "sequence": json.dumps([None, str(lsn)]),
              "schema": "public", "table": table, "txId": 700 + lsn, "lsn": lsn, "xmin": None}
    return {"before": key if op == "d" else None, "after": None if after is None else {**key, **after},
            "source": source, "transaction": None, "op": op, "ts_ms": source["ts_ms"] + 2}


class Topics:
    def __init__(self, servers: str) -> None:
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient, NewTopic

        KafkaAdminClient(bootstrap_servers=servers).create_topics(
            [NewTopic("shop.public.accounts", 2, 1), NewTopic("shop.public.tiers", 1, 1)])
        self.producer = KafkaProducer(bootstrap_servers=servers)
        self.sent: list[tuple[str | None, str | None]] = []

    def send(self, topic: str, partition: int, key: dict[str, Any] | None, value: dict[str, Any] | str | None) -> None:
        k = None if key is None else json.dumps({"schema": {"type": "struct", "fields": []}, "payload": key})
        v = value if isinstance(value, str) or value is None else json.dumps(value)
        self.producer.send(topic, key=None if k is None else k.encode(), value=None if v is None else v.encode(),
                           partition=partition).get(timeout=30)
        self.sent.append((k, v))


def test_debezium_topics_through_spark_kafka_source(spark: Any, broker: str, tmp_path: Path) -> None:
    topics = Topics(broker)
    acc = lambda op, lsn, i, bal=None: envelope(op, lsn, {"id": i}, None if bal is None else {"balance": bal}, "accounts")  # noqa: E731
    a = "shop.public.accounts"
    topics.send(a, 0, {"id": 1}, acc("r", 5000, 1, 10))
    topics.send(a, 1, {"id": 2}, acc("r", 5000, 2, 20))
    topics.send(a, 1, {"id": 1}, acc("u", 120, 1, 12))       # key 1's later change on another partition...
    topics.send(a, 0, {"id": 1}, acc("u", 110, 1, 11))       # ...and its earlier one after it
    topics.send(a, 0, {"id": 2}, acc("d", 130, 2))
    topics.send(a, 0, {"id": 2}, None)                       # the tombstone after the delete
    topics.send(a, 1, {"id": 2}, acc("u", 125, 2, 99))       # older than the delete: stays deleted
    topics.send(a, 1, {"id": 1}, acc("u", 120, 1, 12))       # a redelivery
    topics.send(a, 0, None, "not an envelope")               # poison
    topics.send("shop.public.tiers", 0, {"id": 7}, envelope("c", 140, {"id": 7}, {"kind": "gold"}, "tiers"))

    def locate(table: str) -> TableLocation:
        return TableLocation(TableName("dst", "s", table), str(tmp_path / "lake" / table))

    # Exactly this test's topics, anchored: Spark's pattern subscription also takes a topic the pattern is
    # only found in, and test_kafka_postgres.py makes shop.public.accounts_<hex> topics on the same broker.
    spec = EventStreamSpec("shop", "kafka", "debezium", bootstrap_servers=broker,
                           topic_pattern="^shop\\.public\\.(accounts|tiers)$", trigger_interval_seconds=0.5)

    def run_until(count: int) -> int:
        sink = delta_event_sink(spec, event_source_for(spec).decoder, "test", spark, locate, locate("_dead_letters"))
        runner = EventStreamRunner(spec, spark, tmp_path / "events", sink)
        runner.launch()
        read, deadline = 0, time.time() + 300
        try:
            while read < count:
                assert time.time() < deadline, f"timed out: {read} of {count} messages read"
                for item in runner.poll():
                    if isinstance(item, BatchReport):
                        read += item.outcome.stats.rows_read
                    assert not isinstance(item, sm.Failed), item
                time.sleep(0.2)
        finally:
            runner.halt()
        return read

    run_until(len(topics.sent))
    topics.send(a, 1, {"id": 3}, acc("c", 150, 3, 30))
    assert run_until(1) == 1  # a new runner resumes from the checkpoint's offsets: only the new message

    events = [e for e in (decode_debezium(v, k) for k, v in topics.sent) if isinstance(e, ChangeEvent)]
    got = {r["id"]: r["balance"] for r in tables.read(spark, locate("accounts")).drop(POSITION_COLUMN).collect()}
    want = {k[0]: v["balance"] for k, v in ordered_fold(e for e in events if e.table == "accounts").items()}
    assert got == want == {1: 12, 3: 30}
    assert [r["kind"] for r in tables.read(spark, locate("tiers")).collect()] == ["gold"]
    (letter,) = tables.read(spark, locate("_dead_letters")).collect()
    assert (letter["origin"], letter["partition"], letter["offset"], letter["value"]) == (a, 0, 4, "not an envelope")


def test_the_lag_is_the_age_of_the_oldest_message_the_replicas_have_not_taken(broker: str, tmp_path: Path) -> None:
    """The broker is asked for each lagging partition's first unapplied message: its source commit
    time (or, for a message without one, the broker's time) prices the lag, in every process."""
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    from lakemirror.sinks.events.memory_sink import memory_event_sink
    from lakemirror.sources.kafka_offsets import KafkaBrokerOffsets

    topic = "lagshop.public.orders"
    KafkaAdminClient(bootstrap_servers=broker).create_topics([NewTopic(topic, 2, 1)])
    producer = KafkaProducer(bootstrap_servers=broker)
    now = time.time()
    for lsn in range(4):  # partition 0: four changes committed 100, 90, 80, 70 s ago
        value = envelope("c", lsn, {"id": lsn}, {"v": lsn}, "orders")
        value["source"]["ts_ms"] = int((now - 100 + 10 * lsn) * 1000)
        producer.send(topic, key=json.dumps({"id": lsn}).encode(), value=json.dumps(value).encode(), partition=0,
                      timestamp_ms=int((now - 5) * 1000)).get(timeout=30)
    for n in range(2):  # partition 1: messages without a source time, written 300 and 30 s ago
        producer.send(topic, key=b"k", value=b"not json", partition=1,
                      timestamp_ms=int((now - 300 + 270 * n) * 1000)).get(timeout=30)
    producer.close()

    offsets = KafkaBrokerOffsets(broker, topics=topic)
    try:
        got = offsets.first_records({(topic, 0): 2, (topic, 1): 1, })
        assert {tp: r.offset for tp, r in got.items()} == {(topic, 0): 2, (topic, 1): 1}
        assert json.loads(got[(topic, 0)].value or "")["source"]["lsn"] == 2 and got[(topic, 1)].value == "not json"
        assert got[(topic, 1)].timestamp_ms == int((now - 30) * 1000)
        assert offsets.first_records({(topic, 0): 4}) == {}, "nothing past the end"
    finally:
        offsets.close()

    spec = EventStreamSpec("lagshop", "kafka", bootstrap_servers=broker, topics=topic)
    source = event_source_for(spec)
    runner = EventStreamRunner(spec, None, tmp_path, memory_event_sink(spec, source.decoder, "p"),  # type: ignore[arg-type]
                               source=source)
    try:
        runner._applied_offsets = {(topic, 0): 1, (topic, 1): 2}  # as the last batch's progress said
        reading = runner.probe_lag(now)
        assert reading is not None and reading.offsets_behind == {(topic, 0): 3, (topic, 1): 0}
        assert reading.oldest_unapplied_at == pytest.approx(now - 90, abs=0.01)  # lsn 1's source commit
        runner._applied_offsets = {(topic, 0): 4, (topic, 1): 1}
        reading = runner.probe_lag(now)
        assert reading is not None and reading.lag_seconds == pytest.approx(30, abs=0.01)  # the broker's time
    finally:
        source.close()
