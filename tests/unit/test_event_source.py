"""The event-source seam without Spark: the factory picks the implementation from the spec, the
in-memory twin gives a micro-batch's raw events in source order with the real decoder (through the
batch function's decode step, :func:`decode_batch`), and the runners decode with, count lag from and
close the source they are given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakemirror.sinks.events.guard_plan import plan_batch
from lakemirror.sources.change_event import STREAM, UPSERT, ChangeEvent, DeadLetter, Position, Skipped
from lakemirror.sources.event_source import FileEventSource, KafkaEventSource, event_source_for
from lakemirror.sources.event_stream import EventDecoder, RawEvent, decode_batch
from lakemirror.sources.kafka_offsets import KafkaBrokerOffsets, StaticOffsets
from lakemirror.sources.memory_events import MemoryEventSource
from lakemirror.sinks.events.memory_sink import memory_event_sink
from lakemirror.supervisor.events.stream_runner import EventStreamRunner, EventStreamSpec
from tests.unit.test_debezium import envelope, pg_source, simple


def test_a_kafka_spec_gives_spark_s_kafka_source_with_the_broker_s_offsets() -> None:
    spec = EventStreamSpec("shop", "kafka", "simple", bootstrap_servers="k:9092", topic_pattern="shop\\..*",
                           key_columns={"a": ("id",)}, max_per_trigger=500)
    source = event_source_for(spec)
    assert isinstance(source, KafkaEventSource)
    assert (source.bootstrap_servers, source.topic_pattern, source.max_offsets_per_trigger) == ("k:9092", "shop\\..*", 500)
    broker = source.offsets
    assert isinstance(broker, KafkaBrokerOffsets) and broker.bootstrap_servers == "k:9092"
    assert broker.matches("shop.a") and not broker.matches("other.a")
    assert (source.decoder.kind, source.decoder.format, dict(source.decoder.key_columns)) == ("kafka", "simple", {"a": ("id",)})
    source.close()  # never connected: nothing to close, no error


def test_a_files_spec_gives_spark_s_file_source_without_offsets() -> None:
    source = event_source_for(EventStreamSpec("feed", "files", path="/in", max_per_trigger=3))
    assert isinstance(source, FileEventSource)
    assert (source.path, source.max_files_per_trigger, source.offsets) == ("/in", 3, None)
    assert (source.decoder.kind, source.decoder.format) == ("files", "debezium")


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event source kind 'mqtt'"):
        event_source_for(EventStreamSpec("x", "mqtt"))


def test_the_twin_gives_kafka_records_in_partition_and_offset_order_decoded() -> None:
    source = MemoryEventSource("kafka", offsets=StaticOffsets({("shop.public.customers", 0): 2}))
    after = {"id": 1, "name": "a"}
    source.send(json.dumps(envelope("u", None, after, pg_source(2000))), json.dumps({"id": 1}),
                topic="shop.public.customers", partition=1)
    source.send(json.dumps(envelope("c", None, after, pg_source(1000))), json.dumps({"id": 1}),
                topic="shop.public.customers", partition=0)
    source.send(None, json.dumps({"id": 1}), topic="shop.public.customers", partition=0)
    source.send("{not json", None, topic="shop.public.customers", partition=1)
    raws = list(source.raw_events(source.stream()))
    assert [(r.partition, r.offset) for r in raws] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    decoded = [source.decoder(r) for r in raws]
    assert isinstance(decoded[0], ChangeEvent) and isinstance(decoded[2], ChangeEvent)
    assert (decoded[0].table, decoded[0].op, decoded[0].keys) == ("customers", UPSERT, (("id", 1),))
    assert decoded[0].position < decoded[2].position and decoded[2].position.phase == STREAM
    assert isinstance(decoded[1], Skipped) and isinstance(decoded[3], DeadLetter)
    assert source.offsets is not None and source.offsets.latest()[0] == {("shop.public.customers", 0): 2}


def test_the_twin_numbers_the_lines_of_each_file_in_path_order() -> None:
    source = MemoryEventSource("files", "simple")
    row = simple("INSERT", "2024-01-01T10:00:00Z", "TXN_1001", after={"id": 7}, pk={"id": 7}, table="t")
    source.add_file("file:/in/b.json", [row, "", "oops"])
    source.add_file("file:/in/a.json", [row])
    raws = list(source.raw_events(source.stream()))
    assert [(r.origin, r.offset) for r in raws] == [("file:/in/a.json", 1), ("file:/in/b.json", 1),
                                                    ("file:/in/b.json", 3)]
    first = source.decoder(raws[0])
    assert isinstance(first, ChangeEvent) and first.position == Position(STREAM, 1704103200_000000, 1001)
    assert isinstance(source.decoder(raws[2]), DeadLetter)
    assert source.offsets is None


def test_the_twin_holds_the_rows_of_the_kind_it_stands_for() -> None:
    with pytest.raises(ValueError, match="add_file"):
        MemoryEventSource("files").send("{}")
    with pytest.raises(ValueError, match="send"):
        MemoryEventSource("kafka").add_file("f", ["{}"])
    with pytest.raises(ValueError, match="unknown event source kind"):
        MemoryEventSource("mqtt")
    assert RawEvent("v", None, "t", 0, 3) == next(MemoryEventSource().raw_events(
        [{"topic": "t", "partition": 0, "offset": 3, "key": None, "value": "v"}]))


def test_a_runner_reads_the_source_its_spec_names_and_closes_it_when_it_halts(tmp_path: Path) -> None:
    spec = EventStreamSpec("shop", "files", "simple", path=str(tmp_path / "in"))
    default = EventStreamRunner(spec, None, tmp_path, memory_event_sink(spec, EventDecoder("files", "simple"), "p"))  # type: ignore[arg-type]
    assert isinstance(default.source, FileEventSource) and default.source.decoder == EventDecoder("files", "simple")
    assert default.probe_lag(0.0) is None  # no offsets: no lag to count
    twin = MemoryEventSource("kafka", offsets=StaticOffsets())
    runner = EventStreamRunner(spec, None, tmp_path, memory_event_sink(spec, twin.decoder, "p"), source=twin)  # type: ignore[arg-type]
    runner.halt()
    assert twin.closed


def test_a_postgres_runner_decodes_with_its_source_s_decoder(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from lakemirror.daemon.context import DaemonContext
    from lakemirror.daemon.metrics import Metrics
    from lakemirror.daemon.settings import load_settings
    from lakemirror.sinks.postgres.event_replicas import PostgresEventReplicas

    (tmp_path / "p.yaml").write_text(
        "source_catalog: src\ndestination_catalog: dst\nschema_name: s\ncheckpoint_volume: " + str(tmp_path / "ck")
        + "\nsource: {kind: kafka, format: simple, bootstrap_servers: 'k:9092', topics: [t], key_columns: {t: [id]}}"
        + "\ndestination: {kind: postgres, host: h, database: d, user: u}\n")
    ctx = DaemonContext(load_settings(tmp_path / "p.yaml")).replace(
        spark=object(), metrics=Metrics("main", CollectorRegistry()))
    runner = ctx.event_source_supervisor._factory("events:events")
    assert isinstance(runner, EventStreamRunner) and isinstance(runner.sink, PostgresEventReplicas)
    assert runner.sink.factory.decode == runner.source.decoder == EventDecoder("kafka", "simple", {"t": ("id",)})


def test_a_twin_batch_decodes_to_the_changes_to_plan_and_dead_letters_that_say_where_they_came_from() -> None:
    """The first step of EventBatchApplier.apply: decode, skip, keep the replicated tables and
    dead-letter what cannot be applied, then the fold per key."""
    source = MemoryEventSource("kafka")
    customers, orders, key = "shop.public.customers", "shop.public.orders", json.dumps({"id": 1})
    source.send(json.dumps(envelope("u", None, {"id": 1, "name": "b"}, pg_source(2000))), key, topic=customers,
                partition=1)
    source.send("{not json", key, topic=customers, partition=1)
    source.send(json.dumps(envelope("c", None, {"id": 1, "name": "a"}, pg_source(1000))), key, topic=customers)
    source.send(None, key, topic=customers)
    source.send(json.dumps(envelope("c", None, {"id": 9}, pg_source(1500, table="orders"))), json.dumps({"id": 9}),
                topic=orders)
    batch = decode_batch(source.raw_events(source.stream()), source.decoder, tables=("customers",))
    assert (batch.events, batch.skipped) == (5, 2)  # the tombstone, and the table not replicated
    assert [c.columns["name"] for c in batch.changes] == ["a", "b"]  # partition 0 before partition 1
    assert [(batch.raw_of(c).partition, batch.raw_of(c).offset) for c in batch.changes] == [(0, 0), (1, 0)]
    [(raw, letter)] = batch.dead_letters
    assert (raw.origin, raw.partition, raw.offset, raw.value) == (customers, 1, 1, "{not json") and letter.reason
    plans, refused = plan_batch(batch.changes)
    assert not refused and [w.columns["name"] for w in plans["customers"].winners] == ["b"]


def test_a_poison_line_of_a_file_is_a_dead_letter_with_its_file_and_line() -> None:
    source = MemoryEventSource("files", "simple")
    ok = simple("INSERT", "2024-01-01T10:00:00Z", "TXN_1001", after={"id": 7}, pk={"id": 7}, table="t")
    source.add_file("file:/in/a.json", [ok, "", '{"table_name": "t"}'])
    batch = decode_batch(source.raw_events(source.stream()), source.decoder)
    assert [batch.raw_of(c).offset for c in batch.changes] == [1]
    assert [(raw.origin, raw.offset) for raw, _ in batch.dead_letters] == [("file:/in/a.json", 3)]
