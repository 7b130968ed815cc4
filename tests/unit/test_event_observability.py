"""Observability of event sources: offsets behind per topic-partition, event-time lag, rows by
operation and dead letters, as metrics and in status."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry

from lakemirror.daemon.metrics import Metrics
from lakemirror.daemon.status import render_event_sources
from lakemirror.sinks.events.dead_letters import PENDING, SKIPPED, DeadLetterRow, InMemoryDeadLetters, StoredLetter
from lakemirror.sinks.memory import ApplyCounts
from lakemirror.sinks.txn import BatchStats, MergeOutcome, TxnId
from lakemirror.sources.change_event import UPSERT, ChangeEvent, Position
from lakemirror.sources.kafka_offsets import BrokerRecord, StaticOffsets, offsets_behind, parse_end_offsets, progress_end_offsets
from lakemirror.sources.event_stream import RawEvent
from lakemirror.sources.memory_events import MemoryEventSource
from lakemirror.sinks.events.guarded_sink import event_lags
from lakemirror.sinks.events.memory_sink import memory_event_sink
from lakemirror.supervisor.events.stream_runner import (DeadLetterTally, EventBatchReport, EventLagReading,
                                                        EventStreamRunner, EventStreamSpec, ReplicaBatch, ReplicaStatus,
                                                        checkpoint_end_offsets)


def test_offsets_behind_counts_unread_partitions_from_their_beginning() -> None:
    applied = {("t", 0): 10, ("t", 1): 7}
    latest = {("t", 0): 10, ("t", 1): 12, ("t", 2): 5}
    assert offsets_behind(applied, latest, {("t", 2): 1}) == {("t", 0): 0, ("t", 1): 5, ("t", 2): 4}


def test_spark_progress_end_offsets_in_either_style() -> None:
    class Source:
        endOffset = '{"shop.public.a": {"0": 4, "2": 9}}'

    class Progress:
        sources = [Source()]

    assert progress_end_offsets(Progress()) == {("shop.public.a", 0): 4, ("shop.public.a", 2): 9}
    assert progress_end_offsets({"sources": [{"endOffset": {"x": {"1": 3}}}]}) == {("x", 1): 3}
    assert progress_end_offsets({"sources": [{"endOffset": "not json"}]}) == {}
    assert parse_end_offsets(None) == {}


def test_the_checkpoint_gives_the_last_committed_batch_end_offsets(tmp_path: Path) -> None:
    cp = tmp_path / "checkpoint"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    for n, end in ((0, 3), (1, 8), (2, 11)):
        (cp / "offsets" / str(n)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"t":{{"0":{end}}}}}\n')
    (cp / "commits" / "0").write_text("v1\n{}")
    (cp / "commits" / "1").write_text("v1\n{}")  # batch 2 is planned, not committed
    assert checkpoint_end_offsets(cp) == {("t", 0): 8}
    assert checkpoint_end_offsets(tmp_path / "nothing") == {}


def test_event_lag_is_commit_time_minus_source_commit_time() -> None:
    events = [ChangeEvent("a", UPSERT, (("id", 1),), Position(1, 5), {"id": 1}, ts_ms=1_000_000),
              ChangeEvent("a", UPSERT, (("id", 2),), Position(1, 6), {"id": 2}, ts_ms=None),
              ChangeEvent("a", UPSERT, (("id", 3),), Position(1, 7), {"id": 3}, ts_ms=1_002_500)]
    assert event_lags(events, 1_003.0) == (3.0, 0.5)
    assert event_lags(events[:1], 999.0) == (0.0,)  # a source clock ahead of ours is not a negative lag


def runner(tmp_path: Path, broker: StaticOffsets, now: list[float]) -> EventStreamRunner:
    spec = EventStreamSpec("shop", "kafka", bootstrap_servers="127.0.0.1:1", topic_pattern="shop\\..*")
    source = MemoryEventSource("kafka", offsets=broker)
    return EventStreamRunner(spec, None, tmp_path, memory_event_sink(spec, source.decoder, "p"),  # type: ignore[arg-type]
                             clock=lambda: now[0], source=source)


def test_probe_lag_reports_offsets_behind_and_a_lag_that_is_zero_when_caught_up(tmp_path: Path) -> None:
    broker = StaticOffsets({("shop.a", 0): 5, ("shop.a", 1): 3})
    now = [100.0]
    r = runner(tmp_path, broker, now)
    first = r.probe_lag(100.0)
    assert isinstance(first, EventLagReading)
    assert first.offsets_behind == {("shop.a", 0): 5, ("shop.a", 1): 3} and first.versions_behind == 8
    assert first.lag_seconds == 0.0  # the backlog was first seen now
    r._applied_offsets = {("shop.a", 0): 5, ("shop.a", 1): 1}   # what the last batch's progress said
    r.replicas["a"] = ReplicaStatus(last_event_lag_seconds=2.0)
    second = r.probe_lag(130.0)
    assert second is not None and second.versions_behind == 2 and second.lag_seconds == 30.0
    r._applied_offsets = {("shop.a", 0): 5, ("shop.a", 1): 3}
    third = r.probe_lag(140.0)
    assert third is not None and third.versions_behind == 0 and third.lag_seconds == 0.0
    assert r.describe()["offsets_behind"] == [{"topic": "shop.a", "partition": 0, "behind": 0},
                                              {"topic": "shop.a", "partition": 1, "behind": 0}]


def test_event_metrics_are_exported(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    m = Metrics("p", registry)
    outcome = MergeOutcome(BatchStats(9, 3, 3, None), ApplyCounts(2, 1, 1), replayed=False)
    m.batch_applied("events:shop", EventBatchReport(
        "events:shop", 3, outcome, 0.5, 1000.0, source="shop", dead_letters=2,
        replicas={"customers": ReplicaBatch(2, 1, 1, 4, (0.3, 1.5))}))
    m.lag_measured("events:shop", EventLagReading(0.0, 7, 20, 13, offsets_behind={("shop.public.customers", 2): 7}))
    value = registry.get_sample_value
    assert value("lakemirror_event_rows_applied_total", {"pipeline": "p", "source": "shop", "table": "customers", "op": "delete"}) == 1
    assert value("lakemirror_event_changes_stale_total", {"pipeline": "p", "source": "shop", "table": "customers"}) == 4
    assert value("lakemirror_dead_letters_total", {"pipeline": "p", "source": "shop"}) == 2
    assert value("lakemirror_event_time_lag_seconds_count", {"pipeline": "p", "source": "shop", "table": "customers"}) == 2
    assert value("lakemirror_event_batch_lag_seconds", {"pipeline": "p", "source": "shop", "table": "customers"}) == 1.5
    assert value("lakemirror_kafka_offsets_behind", {"pipeline": "p", "source": "shop",
                                                     "topic": "shop.public.customers", "partition": "2"}) == 7
    assert value("lakemirror_versions_behind", {"pipeline": "p", "table": "events:shop"}) == 7


def test_status_shows_each_event_source(tmp_path: Path) -> None:
    r = runner(tmp_path, StaticOffsets({("shop.a", 0): 4}), [0.0])
    r.probe_lag(0.0)
    r.letters.seed([StoredLetter(f"id{n}", RawEvent("x", None, "shop.a", 0, n), "customers" if n else None, "bad",
                                 PENDING if n < 2 else SKIPPED) for n in range(3)])  # as read at launch
    r.replicas["customers"] = ReplicaStatus(batches=2, inserted=5, updated=1, deleted=2, stale=1,
                                            position_basis="postgres lsn", last_event_lag_seconds=1.25)
    text = render_event_sources([{"table": "events:shop", "detail": r.describe()}, {"table": "x", "detail": None}])
    assert "event source shop (kafka): dead letters 3 (2 pending: ? 1, customers 1); offsets behind: shop.a[0] 4" in text
    assert "customers  5" in text and "1.2s" in text and "postgres lsn" in text
    assert render_event_sources([{"table": "x"}]) == ""


def test_a_backlog_keeps_its_age_across_a_restart(tmp_path: Path) -> None:
    """The lag of an event source used to start again from 0 in each process."""
    broker = StaticOffsets({("shop.a", 0): 5})
    now = [100.0]
    first = runner(tmp_path, broker, now)
    first.probe_lag(100.0)  # a backlog, first seen at 100
    assert first.probe_lag(130.0).lag_seconds == 30.0  # type: ignore[union-attr]
    again = runner(tmp_path, broker, now)  # a new daemon process on the same folder
    reading = again.probe_lag(160.0)
    assert reading is not None and reading.lag_seconds == 60.0
    assert reading.lag_at(170.0) == 70.0, "and it keeps counting between readings"


def test_a_backlog_built_up_while_the_daemon_was_down_counts_from_when_it_was_last_caught_up(tmp_path: Path) -> None:
    broker = StaticOffsets({("shop.a", 0): 5})
    now = [100.0]
    first = runner(tmp_path, broker, now)
    first._applied_offsets = {("shop.a", 0): 5}
    assert first.probe_lag(100.0).lag_seconds == 0.0  # type: ignore[union-attr]
    broker.end[("shop.a", 0)] = 9  # written while no daemon ran
    again = runner(tmp_path, broker, now)
    again._applied_offsets = {("shop.a", 0): 5}
    reading = again.probe_lag(400.0)
    assert reading is not None and reading.versions_behind == 4 and reading.lag_seconds == 300.0


def change(offset: int, committed_at: float | None, key: int = 1) -> BrokerRecord:
    """A Debezium change as the broker holds it: committed at the source at ``committed_at`` (None: a
    message without a source time), written to the broker one second later."""
    source = {"table": "a", "schema": "public", "db": "shop", "lsn": offset, "connector": "postgresql"}
    if committed_at is not None:
        source["ts_ms"] = int(committed_at * 1000)
    value = json.dumps({"before": None, "after": {"id": key}, "source": source, "op": "c"})
    return BrokerRecord(offset, int(((committed_at or 0.0) + 1.0) * 1000), json.dumps({"id": key}), value)


def test_under_steady_flow_the_lag_is_the_age_of_the_oldest_unapplied_message_not_of_the_first_backlog(
        tmp_path: Path) -> None:
    """A backlog that never empties (new messages keep arriving as batches apply) used to count from
    the probe that first saw it, so the lag grew without end while the replicas were seconds behind."""
    tp = ("shop.a", 0)
    broker = StaticOffsets({tp: 3}, records={tp: [change(n, 100.0 + 10 * n) for n in range(40)]})
    now = [103.0]
    r = runner(tmp_path, broker, now)
    r._applied_offsets = {tp: 0}
    first = r.probe_lag(103.0)
    assert first is not None and first.lag_seconds == 3.0 and first.oldest_unapplied_at == 100.0
    for applied in range(1, 30):  # each probe: one more message applied, one more written
        broker.end[tp] = applied + 3
        r._applied_offsets = {tp: applied}
        reading = r.probe_lag(103.0 + 10 * applied)
        assert reading is not None and reading.versions_behind == 3
        assert reading.lag_seconds == 3.0, (applied, reading)  # the oldest unapplied is 3 s old, every time
    assert reading.lag_at(108.0 + 10 * applied) == 8.0, "it keeps growing between readings"
    assert len(broker.asked) == 30, "each position is read from the broker once"
    r.probe_lag(400.0)
    assert len(broker.asked) == 30, "an unchanged position is not read again"


def test_the_broker_time_prices_a_message_without_a_source_time_and_the_oldest_partition_wins(tmp_path: Path) -> None:
    a0, a1 = ("shop.a", 0), ("shop.a", 1)
    broker = StaticOffsets({a0: 6, a1: 2}, records={a0: [change(n, 200.0 + n) for n in range(6)],
                                                    a1: [change(0, 150.0), change(1, None)]})
    r = runner(tmp_path, broker, [0.0])
    r._applied_offsets = {a0: 4, a1: 1}
    reading = r.probe_lag(300.0)
    assert reading is not None and reading.versions_behind == 3
    # a0's oldest unapplied change was committed at 204; a1's message has no source time and was
    # written to the broker at 1 (epoch seconds), so it prices the lag.
    assert reading.oldest_unapplied_at == 1.0 and reading.lag_seconds == 299.0
    r._applied_offsets = {a0: 4, a1: 2}
    again = r.probe_lag(300.0)
    assert again is not None and again.lag_seconds == 96.0 and again.oldest_unapplied_at == 204.0
    assert r.probe_lag(300.0).offsets_behind == {a0: 2, a1: 0}  # type: ignore[union-attr]


def test_a_restarted_runner_reads_the_backlogs_age_from_the_broker(tmp_path: Path) -> None:
    """Exact from the first probe of a new process, whenever the backlog began."""
    tp = ("shop.a", 0)
    broker = StaticOffsets({tp: 9}, records={tp: [change(n, 50.0 + n) for n in range(9)]})
    r = runner(tmp_path, broker, [0.0])
    r._applied_offsets = {tp: 5}
    reading = r.probe_lag(400.0)
    assert reading is not None and reading.versions_behind == 4 and reading.lag_seconds == 345.0


def test_a_message_the_broker_does_not_return_leaves_the_backlogs_seen_age(tmp_path: Path) -> None:
    tp = ("shop.a", 0)
    broker = StaticOffsets({tp: 5}, records={tp: []})
    r = runner(tmp_path, broker, [0.0])
    r.probe_lag(100.0)
    reading = r.probe_lag(130.0)
    assert reading is not None and reading.lag_seconds == 30.0 and reading.oldest_unapplied_at == 100.0
    broker.records[tp] = [change(n, 10.0 + n) for n in range(5)]  # the broker answers again
    assert r.probe_lag(140.0).lag_seconds == 130.0  # type: ignore[union-attr]


def test_replica_counts_carry_over_a_restart_and_show_without_the_daemon(tmp_path: Path) -> None:
    from lakemirror.supervisor.events.status_record import describe, load_record

    first = runner(tmp_path, StaticOffsets({}), [0.0])
    first.replicas["customers"] = ReplicaStatus(batches=2, inserted=5, updated=1, deleted=2, last_ts_ms=90_000)
    first.letters.add([DeadLetterRow(RawEvent("x", None, "shop.a", 0, 0), "bad", "customers")])
    first._save_record(batch_id=7, last_batch_at=95.0)
    again = runner(tmp_path, StaticOffsets({}), [0.0])
    assert again.replicas["customers"].inserted == 5 and again.applied_through == 7
    record = load_record(tmp_path)
    assert record.last_event_at == 90.0 and record.dead_letters == 1
    assert describe(record, "shop", "kafka")["replicas"]["customers"]["deleted"] == 2


def test_pending_dead_letters_are_a_gauge_that_a_restart_does_not_reset(tmp_path: Path) -> None:
    """Read from the dead-letter table at launch (a tally, not a batch), then kept by each batch; a
    table whose letters were all resolved goes to 0."""
    registry = CollectorRegistry()
    m = Metrics("p", registry)
    empty = MergeOutcome(BatchStats(0, None, None, None), ApplyCounts(), replayed=False)
    m.batch_applied("events:shop", DeadLetterTally("events:shop", -1, empty, 0.0, 1000.0, source="shop",
                                                   pending={"orders": 3, "": 1}, total=5))
    value = registry.get_sample_value
    assert value("lakemirror_dead_letters_pending", {"pipeline": "p", "source": "shop", "table": "orders"}) == 3
    assert value("lakemirror_batches_total", {"pipeline": "p", "table": "events:shop"}) is None  # not a batch
    m.batch_applied("events:shop", EventBatchReport("events:shop", 4, empty, 0.1, 1001.0, source="shop",
                                                    pending={"": 1}, total=5))
    assert value("lakemirror_dead_letters_pending", {"pipeline": "p", "source": "shop", "table": "orders"}) == 0
    assert value("lakemirror_dead_letters_pending", {"pipeline": "p", "source": "shop", "table": ""}) == 1


def test_a_restarted_runner_counts_the_letters_its_table_holds(tmp_path: Path) -> None:
    r = runner(tmp_path, StaticOffsets({("shop.a", 0): 4}), [0.0])
    held = InMemoryDeadLetters()
    held.append(None, [DeadLetterRow(RawEvent("x", None, "shop.a", 0, n), "bad", "orders") for n in range(4)],
                TxnId("a", 0), 0.0)
    r.sink.dead_letters = held  # type: ignore[attr-defined]
    r._seed_letters()
    assert r.dead_letter_count == 4 and r.describe()["dead_letters_pending"] == {"orders": 4}
    [tally] = r.poll()
    assert isinstance(tally, DeadLetterTally) and tally.pending == {"orders": 4} and tally.total == 4
