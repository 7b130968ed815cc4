"""A Kafka event source into a real PostgreSQL, in Real-Time Mode and in micro-batches: the replica
equals the ordered fold of every distinct event, whatever the disorder, the redeliveries and the
restarts (Real-Time Mode's ``foreach`` is at-least-once; the sequence guard makes it exact).

The broker is scripts/kafka.sh's (the session's ``broker``, tests/conftest.py), the server
scripts/postgres.sh's (tests/integration/postgres_server.py).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from lakemirror.sinks.events.guard_plan import ordered_fold
from lakemirror.sinks.postgres.executor import PostgresTarget
from lakemirror.sources.change_event import ChangeEvent
from lakemirror.sources.debezium import decode_debezium
from lakemirror.supervisor.change_feed.table_runner import BatchReport
from lakemirror.sinks.postgres.event_replicas import PostgresEventReplicas
from lakemirror.sinks.postgres.real_time import RealTimeSpec
from lakemirror.sources.event_source import event_source_for
from lakemirror.supervisor.control import table_state as sm
from lakemirror.supervisor.events.stream_runner import DeadLetterTally, EventStreamRunner, EventStreamSpec
from tests.integration.test_kafka_source import envelope

pytestmark = pytest.mark.integration


class Producer:
    def __init__(self, servers: str, topic: str, partitions: int) -> None:
        from kafka import KafkaProducer
        from kafka.admin import KafkaAdminClient, NewTopic

        KafkaAdminClient(bootstrap_servers=servers).create_topics([NewTopic(topic, partitions, 1)])
        self.topic = topic
        self.producer = KafkaProducer(bootstrap_servers=servers)
        self.sent: list[tuple[str | None, str | None]] = []

    def send(self, partition: int, key: dict[str, Any] | None, value: dict[str, Any] | str | None) -> None:
        k = None if key is None else json.dumps(key)
        v = value if isinstance(value, str) or value is None else json.dumps(value)
        self.producer.send(self.topic, key=None if k is None else k.encode(), value=None if v is None else v.encode(),
                           partition=partition).get(timeout=30)
        self.sent.append((k, v))

    def expected(self, table: str) -> dict[Any, dict[str, Any]]:
        events = [e for e in (decode_debezium(v, k) for k, v in self.sent) if isinstance(e, ChangeEvent)]
        return {key[0]: row for key, row in ordered_fold(e for e in events if e.table == table).items()}


def replica(postgres: Any, schema: str, table: str) -> dict[Any, dict[str, Any]]:
    try:
        rows = postgres.query(f'SELECT id, balance, name FROM "{schema}"."{table}"')
    except Exception:  # noqa: BLE001 (not created yet)
        return {}
    return {i: {k: v for k, v in (("id", i), ("balance", b), ("name", n)) if v is not None} for i, b, n in rows}


def postgres_runner(spec: EventStreamSpec, spark: Any, folder: Path, target: PostgresTarget,
                    real_time: RealTimeSpec | None) -> EventStreamRunner:
    """The event runner into PostgreSQL replicas, as the daemon builds it (destination kind postgres)."""
    source = event_source_for(spec)
    sink = PostgresEventReplicas(target, "test", spec.name, source.decoder, label=f"events:{spec.name}",
                                 real_time=real_time)
    return EventStreamRunner(spec, spark, folder, sink, source=source)


def run_until(runner: EventStreamRunner, done: Any, what: str, reports: list[BatchReport],
              timeout: float = 400) -> None:
    runner.launch()
    deadline = time.time() + timeout
    try:
        while not done():
            assert time.time() < deadline, f"timed out waiting for {what}"
            for item in runner.poll():
                assert not isinstance(item, sm.Failed), item
                if isinstance(item, BatchReport) and not isinstance(item, DeadLetterTally):  # a tally is no batch
                    reports.append(item)
            time.sleep(0.5)
    finally:
        runner.halt()


@pytest.mark.parametrize("mode", ["real-time", "micro-batch"])
def test_kafka_into_postgres_is_exact_under_disorder_duplicates_and_restarts(
        spark: Any, broker: str, postgres: Any, tmp_path: Path, mode: str) -> None:  # noqa: F811
    schema, topic = f"rt_{uuid.uuid4().hex[:8]}", f"shop.public.accounts_{uuid.uuid4().hex[:6]}"
    source = Producer(broker, topic, 2)
    acc = lambda op, lsn, i, bal=None, name=None: envelope(  # noqa: E731
        op, lsn, {"id": i}, None if bal is None else {"balance": bal, "name": name}, "accounts")
    source.send(0, {"id": 1}, acc("r", 5000, 1, 10, "a"))
    source.send(1, {"id": 2}, acc("r", 5000, 2, 20, "b"))
    source.send(0, {"id": 3}, acc("r", 5000, 3, 30, "c"))
    source.send(1, {"id": 1}, acc("u", 120, 1, 12, "a2"))     # key 1's later change on another partition...
    source.send(0, {"id": 1}, acc("u", 110, 1, 11, "a1"))     # ...and its earlier one after it
    source.send(0, {"id": 2}, acc("d", 130, 2))
    source.send(0, {"id": 2}, None)                           # the tombstone after the delete
    source.send(1, {"id": 2}, acc("u", 125, 2, 99, "late"))   # older than the delete: stays deleted
    source.send(1, {"id": 1}, acc("u", 120, 1, 12, "a2"))     # a redelivery
    source.send(0, None, "not an envelope")                   # poison: a dead letter, the stream goes on
    source.send(0, {"id": 5}, acc("c", 150, 5, 50, "e"))
    target = PostgresTarget(postgres.host, postgres.port, postgres.database, schema, postgres.user,
                            postgres.password, retry_seconds=5)
    spec = EventStreamSpec("shop", "kafka", "debezium", bootstrap_servers=broker, topics=topic,
                           trigger_interval_seconds=0.5)
    # the default checkpoint interval (1 s): under Spark's 5 s minimum batch duration, which the runner lowers
    real_time = RealTimeSpec(max_dwell_ms=50, max_rows=100) \
        if mode == "real-time" else None

    def runner() -> EventStreamRunner:
        return postgres_runner(spec, spark, tmp_path / "events", target, real_time)

    def letters() -> list[tuple[Any, ...]]:
        try:
            return postgres.query(f'SELECT origin, kafka_partition, kafka_offset, reason FROM "{schema}".'
                                  f'lakemirror_event_dead_letters ORDER BY kafka_partition, kafka_offset')
        except Exception:  # noqa: BLE001 (not created yet)
            return []

    want = source.expected("accounts")
    assert want == {1: {"id": 1, "balance": 12, "name": "a2"}, 3: {"id": 3, "balance": 30, "name": "c"},
                    5: {"id": 5, "balance": 50, "name": "e"}}
    reports: list[BatchReport] = []
    run_until(runner(), lambda: replica(postgres, schema, "accounts") == want and len(letters()) == 1,
              "the replica and the dead letter", reports)
    assert replica(postgres, schema, "accounts") == want
    (poison,) = letters()
    assert (poison[0], poison[1], poison[2]) == (topic, 0, 5) and "not JSON" in poison[3], poison

    # A second runner resumes from the checkpoint (Real-Time Mode replays the unfinished batch:
    # at-least-once), then takes new changes, including a delete, a re-insert and an older update.
    source.send(1, {"id": 3}, acc("d", 200, 3))
    source.send(0, {"id": 3}, acc("c", 210, 3, 33, "c-again"))
    source.send(1, {"id": 5}, acc("u", 145, 5, -1, "older"))   # older than its insert: changes nothing
    source.send(0, {"id": 6}, acc("c", 220, 6, 60, "f"))
    source.send(1, {"id": 4}, acc("c", 230, 4, "lots", "d"))  # a balance that is no bigint: a dead letter
    want = source.expected("accounts")
    del want[4]  # the row with the unfit value stays out of the replica
    # Real-Time Mode reports a batch from the query's progress when the batch ends: wait for one.
    run_until(runner(), lambda: replica(postgres, schema, "accounts") == want and len(letters()) == 2
              and bool(reports), "the replica after the restart, and a batch reported", reports)
    assert replica(postgres, schema, "accounts") == want
    poison_again, unfit = letters()
    assert poison_again == poison, "a replayed poison message was kept twice"
    assert (unfit[1], unfit[2]) == (1, 6) and "does not fit" in unfit[3] and "lots" in unfit[3], unfit
    if mode == "real-time":
        assert all(r.outcome.write == "postgres-foreach" for r in reports)
    else:
        assert all(r.outcome.write == "postgres-guarded-upsert" for r in reports)
        assert any(r.latency is not None and r.latency.flush_seconds for r in reports)


def test_real_time_mode_shows_a_server_outage_and_a_refused_login_clearly(
        spark: Any, broker: str, postgres: Any, tmp_path: Path) -> None:  # noqa: F811
    """Real-Time Mode's writers run on the executors, out of the daemon's sight: an outage shorter
    than retry_seconds shows as a wait (the batches stop finishing) and ends by itself; a refused
    login reaches the source's error as one line naming the settings, not a Python traceback."""
    schema, topic = f"rt_{uuid.uuid4().hex[:8]}", f"shop.public.accounts_{uuid.uuid4().hex[:6]}"
    source = Producer(broker, topic, 1)
    acc = lambda lsn, i, bal: envelope("c", lsn, {"id": i}, {"balance": bal, "name": "n"}, "accounts")  # noqa: E731
    source.send(0, {"id": 1}, acc(100, 1, 10))
    spec = EventStreamSpec("shop", "kafka", "debezium", bootstrap_servers=broker, topics=topic)
    real_time = RealTimeSpec(max_dwell_ms=50, max_rows=100)

    refused = postgres_runner(spec, spark, tmp_path / "refused", PostgresTarget(
        postgres.host, postgres.port, postgres.database, schema, "no_such_role", "secret-pw"), real_time)
    refused.launch()
    deadline, failed = time.time() + 240, None
    try:
        while failed is None:
            assert time.time() < deadline, "the refused login was never reported"
            failed = next((e for e in refused.poll() if isinstance(e, sm.Failed)), None)
            time.sleep(0.5)
    finally:
        refused.halt()
    assert "refused the login" in failed.error and "destination.user" in failed.error, failed.error
    assert "Traceback" not in failed.error and "PYTHON_EXCEPTION" not in failed.error
    assert "secret-pw" not in failed.error and len(failed.error.splitlines()) == 1

    if not postgres.restartable:
        return  # the outage needs the script-managed server
    target = PostgresTarget(postgres.host, postgres.port, postgres.database, schema, postgres.user,
                            postgres.password, retry_seconds=180)
    runner = postgres_runner(spec, spark, tmp_path / "events", target, real_time)
    runner.launch()
    seen: list[Any] = []

    def poll_until(done: Any, what: str, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while not done():
            assert time.time() < deadline, f"timed out waiting for {what}; events: {seen[-5:]}"
            events = runner.poll()
            assert not any(isinstance(e, sm.Failed) for e in events), events
            seen.extend(events)
            time.sleep(0.5)

    try:
        poll_until(lambda: replica(postgres, schema, "accounts") == source.expected("accounts"), "the first row")
        postgres.stop()
        try:
            source.send(0, {"id": 2}, acc(200, 2, 20))
            poll_until(lambda: any(isinstance(e, sm.Waiting) for e in seen), "the outage to show")
        finally:
            postgres.start()
        waiting = next(e for e in seen if isinstance(e, sm.Waiting))
        assert "no real-time batch has finished" in waiting.error and "cannot reach PostgreSQL" in waiting.error
        poll_until(lambda: replica(postgres, schema, "accounts") == source.expected("accounts")
                   and any(isinstance(e, sm.WaitOver) for e in seen), "the writers to go on after the outage")
    finally:
        runner.halt()
