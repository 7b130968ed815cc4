"""PostgreSQL → Debezium → Kafka → lakemirror → Delta, every part real, replica == Postgres row for row.

The stack (scripts/postgres.sh --logical, scripts/kafka.sh, scripts/debezium.sh) starts once for
the module. Debezium captures a real OLTP workload: a snapshot, inserts, updates to NULL, deletes,
a primary-key update (a delete of the old key and an insert of the new one, on different
partitions), transactions touching two tables, a rolled-back transaction, the re-insert of a
deleted key, decimals, dates, timestamps with and without a time zone and a composite key. No
hand-written envelope is produced: every event on the topics is Debezium's.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterator

import pytest

from lakemirror import tables
from lakemirror.tools.debezium_stack import DebeziumStack, StackError
from lakemirror.identifiers import TableName
from lakemirror.sinks.events.guard_plan import POSITION_COLUMN
from lakemirror.supervisor.control import table_state as sm
from lakemirror.sinks.events.delta_sink import delta_event_sink
from lakemirror.supervisor.events.stream_runner import EventLagReading, EventStreamRunner, EventStreamSpec
from lakemirror.sources.event_source import event_source_for
from lakemirror.tables import TableLocation

pytestmark = pytest.mark.integration

TABLES = {
    "customers": ("id", "id int PRIMARY KEY, name text, balance numeric(12,2), born date, "
                        "updated_at timestamp(6), seen_at timestamptz, vip boolean, score double precision"),
    "order_lines": ("order_id, line", "order_id bigint, line smallint, customer_id int, amount numeric(10,3), "
                                      "note text, PRIMARY KEY (order_id, line)"),
}


@pytest.fixture(scope="module")
def stack() -> Iterator[DebeziumStack]:
    pytest.importorskip("psycopg")
    # Not under pytest's tmp folder (mode 700): as root, PostgreSQL runs as `postgres` and needs its way in.
    root = Path(tempfile.mkdtemp(prefix="lakemirror-debezium-"))
    root.chmod(0o755)
    s = DebeziumStack(root)
    try:
        s.start()
    except StackError as exc:
        s.stop()
        pytest.skip(f"the Postgres/Kafka/Debezium stack could not start (run scripts/setup.sh): {exc}")
    try:
        with s.connect_sql() as db:
            for table, (key, ddl) in TABLES.items():
                db.execute(f"CREATE TABLE public.{table} ({ddl})")
        yield s
    finally:
        s.stop()
        shutil.rmtree(root, ignore_errors=True)


def customer(rng: random.Random, i: int) -> tuple[Any, ...]:
    return (i, None if rng.random() < 0.2 else f"name-{rng.randint(1, 9999)}",
            Decimal(rng.randint(-10**9, 10**9)).scaleb(-2),
            None if rng.random() < 0.1 else date(1950, 1, 1) + timedelta(days=rng.randint(0, 30000)),
            datetime(2024, 1, 1) + timedelta(microseconds=rng.randint(0, 10**13)),
            datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=rng.randint(0, 10**13)),
            rng.random() < 0.5, rng.uniform(-1e6, 1e6))


INSERT_CUSTOMER = "INSERT INTO customers VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
INSERT_LINE = "INSERT INTO order_lines VALUES (%s, %s, %s, %s, %s)"


def snapshot_rows(db: Any, rng: random.Random) -> None:
    for i in range(1, 21):
        db.execute(INSERT_CUSTOMER, customer(rng, i))
    for order in range(1, 6):
        for line in range(1, 4):
            db.execute(INSERT_LINE, (order, line, order, Decimal(rng.randint(0, 10**7)).scaleb(-3), None))


def oltp_workload(db: Any, rng: random.Random, rounds: int, next_id: list[int]) -> None:
    """A mix of the cases a replica gets wrong when it is not exact."""
    the_cases(db)
    random_mix(db, rng, rounds, next_id)


def the_cases(db: Any) -> None:
    db.execute("UPDATE customers SET name = NULL, balance = balance + 0.01 WHERE id = 1")       # to NULL
    db.execute("UPDATE customers SET id = 1000 WHERE id = 2")                                  # key change
    db.execute("DELETE FROM customers WHERE id = 3")
    db.execute(INSERT_CUSTOMER, (3, "back again", Decimal("0.00"), date(2000, 2, 29),          # re-insert
                                 datetime(2024, 2, 29, 23, 59, 59, 999999),
                                 datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=timezone.utc), None, None))
    with db.transaction():                                                                     # two tables
        db.execute(INSERT_LINE, (100, 1, 4, Decimal("-12.345"), "two tables, one transaction"))
        db.execute("UPDATE customers SET balance = balance - 12.35 WHERE id = 4")
        db.execute("UPDATE order_lines SET line = 9 WHERE order_id = 1 AND line = 1")        # composite key change
    try:
        with db.transaction():                                                                 # rolled back
            db.execute("DELETE FROM customers WHERE id = 5")
            raise RuntimeError("roll back")
    except RuntimeError:
        pass


def random_mix(db: Any, rng: random.Random, rounds: int, next_id: list[int]) -> None:
    for _ in range(rounds):
        roll = rng.random()
        ids = [r[0] for r in db.execute("SELECT id FROM customers").fetchall()]
        if roll < 0.35 or not ids:
            next_id[0] += 1
            db.execute(INSERT_CUSTOMER, customer(rng, next_id[0]))
        elif roll < 0.65:
            db.execute("UPDATE customers SET balance = %s, updated_at = %s, vip = NOT vip WHERE id = %s",
                       (Decimal(rng.randint(-10**6, 10**6)).scaleb(-2), datetime(2025, 1, 1) + timedelta(seconds=rng.randint(0, 10**7)),
                        rng.choice(ids)))
        elif roll < 0.8:
            db.execute("DELETE FROM customers WHERE id = %s", (rng.choice(ids),))
        elif roll < 0.9:
            order = rng.randint(1, 30)
            with db.transaction():
                db.execute("DELETE FROM order_lines WHERE order_id = %s", (order,))
                for line in range(1, rng.randint(2, 5)):
                    db.execute(INSERT_LINE, (order, line, rng.choice(ids), Decimal(rng.randint(-10**7, 10**7)).scaleb(-3),
                                             rng.choice([None, "gift", "rush"])))
        else:
            key = rng.choice(ids)
            next_id[0] += 1
            db.execute("UPDATE customers SET id = %s WHERE id = %s", (next_id[0], key))


def normal(value: Any) -> Any:
    """One representation per value: aware UTC datetimes, bytes, floats rounded to the double."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def postgres_rows(db: Any, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    cur = db.execute(f"SELECT * FROM {table}")
    names = [d.name for d in cur.description]
    key = [k.strip() for k in TABLES[table][0].split(",")]
    return {tuple(r[names.index(k)] for k in key): {n: normal(v) for n, v in zip(names, r)} for r in cur.fetchall()}


def replica_rows(spark: Any, loc: TableLocation, table: str, zoned: set[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    if not tables.exists(spark, loc):
        return {}
    key = [k.strip() for k in TABLES[table][0].split(",")]
    out = {}
    for row in tables.read(spark, loc).drop(POSITION_COLUMN).collect():
        d = row.asDict()
        # Spark hands TIMESTAMP values back as naive local times: make them aware again.
        d = {n: (v.astimezone(timezone.utc) if n in zoned and isinstance(v, datetime) else normal(v)) for n, v in d.items()}
        out[tuple(d[k] for k in key)] = d
    return out


class Replicator:
    """The event stream's runner over the connector's topics, run until the replicas match a condition."""

    def __init__(self, spark: Any, stack: DebeziumStack, root: Path) -> None:
        self.spark, self.root = spark, root
        self.spec = EventStreamSpec("shop", "kafka", "debezium", bootstrap_servers=stack.bootstrap_servers,
                                    topic_pattern=stack.topic_pattern, tables=tuple(TABLES),
                                    trigger_interval_seconds=0.5)
        self.most_behind = 0

    def locate(self, table: str) -> TableLocation:
        return TableLocation(TableName("dst", "shop", table), str(self.root / "lake" / table))

    def run_until(self, done: Any, what: str, timeout: float = 600) -> EventStreamRunner:
        sink = delta_event_sink(self.spec, event_source_for(self.spec).decoder, "e2e", self.spark, self.locate,
                                self.locate("_dead_letters"))
        runner = EventStreamRunner(self.spec, self.spark, self.root / "events", sink)
        runner.launch()
        deadline = time.time() + timeout
        try:
            while True:
                for item in runner.poll():
                    assert not isinstance(item, sm.Failed), item
                reading = runner.probe_lag(time.time())  # the real broker's end offsets, as the supervisor asks
                assert isinstance(reading, EventLagReading)
                self.most_behind = max(self.most_behind, reading.versions_behind)
                if reading.versions_behind == 0 and done():
                    return runner
                assert time.time() < deadline, f"timed out waiting for {what}"
                time.sleep(2.0)
        finally:
            runner.halt()


def test_a_real_oltp_workload_through_debezium_is_replicated_row_for_row(spark: Any, stack: DebeziumStack,
                                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    rng = random.Random(25)
    next_id = [5000]
    with stack.connect_sql() as db:
        snapshot_rows(db, rng)                                       # read by Debezium's initial snapshot (op r)
        stack.register([f"public.{t}" for t in TABLES], name="e2e",
                       config={"topic.creation.default.partitions": "3"})
        oltp_workload(db, rng, rounds=150, next_id=next_id)
        replicator = Replicator(spark, stack, tmp_path_factory.mktemp("replica"))
        zoned = {"seen_at"}

        def equal() -> bool:
            return all(replica_rows(spark, replicator.locate(t), t, zoned) == postgres_rows(db, t) for t in TABLES)

        first = replicator.run_until(equal, "the replicas to match Postgres and no offset to be behind")
        assert first.dead_letter_count == 0 and sum(s.inserted for s in first.replicas.values()) > 0
        assert replicator.most_behind > 0  # the backlog was seen before it was applied
        assert all(r.last_event_lag_seconds is not None and r.last_event_lag_seconds >= 0 for r in first.replicas.values())
        assert {r.position_basis for r in first.replicas.values()} == {"postgres lsn, txId, in-transaction order"}

        # More changes while the replicator is down: a new runner resumes from the checkpoint's offsets.
        random_mix(db, rng, rounds=60, next_id=next_id)
        db.execute("UPDATE customers SET balance = NULL, born = NULL, seen_at = NULL WHERE id = 3")
        second = replicator.run_until(equal, "the replicas to catch up after a restart")
        assert second.dead_letter_count == 0 and sum(s.deleted for s in second.replicas.values()) > 0

        for table in TABLES:
            want = postgres_rows(db, table)
            got = replica_rows(spark, replicator.locate(table), table, zoned)
            assert len(want) > 5 and got == want
        kinds = {f.name: f.dataType.simpleString() for f in tables.read(spark, replicator.locate("customers")).schema.fields}
        assert (kinds["balance"], kinds["born"], kinds["updated_at"], kinds["seen_at"], kinds["id"]) == \
            ("decimal(12,2)", "date", "timestamp_ntz", "timestamp", "int")
        assert (2,) not in postgres_rows(db, "customers")  # moved to 1000 by the key change, whatever came after
        assert not tables.exists(spark, replicator.locate("_dead_letters"))
