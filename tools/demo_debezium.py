"""`lakemirror demo --source debezium`: a live Delta replica of a PostgreSQL database, through Debezium.

Starts PostgreSQL 15 (``wal_level=logical``), a KRaft Kafka broker and Kafka Connect with Debezium's
Postgres connector on loopback with the project's scripts (:mod:`lakemirror.tools.debezium_stack`),
creates ``public.customers`` (numeric, date, timestamp and timestamptz columns) and
``public.order_lines`` (a composite key), and keeps writing to them: inserts, updates (some to
NULL), deletes, primary-key updates and transactions over both tables. The daemon replicates the
connector's topics into ``demo_mirror.shop`` with the event source of a pipeline (one query, a
guarded MERGE per replica). The screen shows each replica's rows by operation, event-time lag and
the Kafka offsets behind, until Ctrl-C (or ``--duration``); then the writer stops, the replicas
catch up, and each is compared with its PostgreSQL table row for row.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakemirror.daemon.preflight import DEMO_PORT_SETTING
from lakemirror.daemon.settings import load_settings
from lakemirror.daemon.status import render_event_sources, render_table
from lakemirror.identifiers import TableName
from lakemirror.tools.debezium_stack import DebeziumStack, StackError
from lakemirror.tools.live_run import run_live, show, start_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakemirror.daemon.context import DaemonContext
    from lakemirror.supervisor.control.loop import Supervisor, TableView

TABLES = {
    "customers": (("id",), "id int PRIMARY KEY, name text, balance numeric(12,2), born date, "
                           "updated_at timestamp(6), seen_at timestamptz"),
    "order_lines": (("order_id", "line"), "order_id bigint, line smallint, customer_id int, amount numeric(10,3), "
                                          "note text, PRIMARY KEY (order_id, line)"),
}
ZONED = {"seen_at"}
CATCH_UP_SECONDS = 900.0


def demo_config(workdir: Path, http_port: int, stack: DebeziumStack) -> dict[str, object]:
    return {
        "pipeline_id": "demo-debezium", "source_catalog": "postgres", "destination_catalog": "demo_mirror",
        "schema_name": "shop", "checkpoint_volume": str(workdir / "checkpoints"),
        "trigger_interval_seconds": 1, "lag_interval_seconds": 1,
        "runtime": {"mode": "local", "warehouse": str(workdir / "lakehouse"), "master": "local[2]"},
        "http": {"host": "127.0.0.1", "port": http_port},
        "restart": {"base_delay_seconds": 1, "max_delay_seconds": 30},
        "source": {"kind": "kafka", "name": "shop", "format": "debezium",
                   "bootstrap_servers": stack.bootstrap_servers, "topic_pattern": stack.topic_pattern,
                   "tables": list(TABLES)},
    }


class PostgresWriter:
    """Commits a random OLTP mix to the captured tables, a few transactions a second."""

    def __init__(self, stack: DebeziumStack, seed: int = 7) -> None:
        self.stack = stack
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.commits = 0
        self.next_id = 1000
        self.thread = threading.Thread(target=self._loop, name="demo-postgres-writer", daemon=True)

    def _customer(self, i: int) -> tuple[Any, ...]:
        r = self.rng
        return (i, None if r.random() < 0.2 else f"name-{r.randint(1, 9999)}", Decimal(r.randint(-10**7, 10**7)).scaleb(-2),
                date(1950, 1, 1) + timedelta(days=r.randint(0, 25000)),
                datetime(2024, 1, 1) + timedelta(microseconds=r.randint(0, 10**13)),
                datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=r.randint(0, 10**13)))

    def seed(self) -> None:
        with self.stack.connect_sql() as db:
            for table, (_, ddl) in TABLES.items():
                db.execute(f"CREATE TABLE IF NOT EXISTS public.{table} ({ddl})")
            for i in range(1, 51):
                db.execute("INSERT INTO customers VALUES (%s, %s, %s, %s, %s, %s)", self._customer(i))

    def _loop(self) -> None:
        with self.stack.connect_sql() as db:
            while not self.stop.is_set():
                try:
                    for _ in range(3):
                        self.write_once(db)
                except Exception as exc:  # keep writing: a demo writer must not die silently
                    print(f"demo writer: {str(exc).splitlines()[0]}", file=sys.stderr)
                self.stop.wait(1.0)

    def write_once(self, db: Any) -> None:
        r = self.rng
        ids = [row[0] for row in db.execute("SELECT id FROM customers").fetchall()]
        roll = r.random()
        if roll < 0.35 or not ids:
            self.next_id += 1
            db.execute("INSERT INTO customers VALUES (%s, %s, %s, %s, %s, %s)", self._customer(self.next_id))
        elif roll < 0.65:
            db.execute("UPDATE customers SET balance = %s, name = %s, updated_at = now() WHERE id = %s",
                       (Decimal(r.randint(-10**6, 10**6)).scaleb(-2), None if r.random() < 0.3 else f"n{r.randint(1, 99)}",
                        r.choice(ids)))
        elif roll < 0.78:
            db.execute("DELETE FROM customers WHERE id = %s", (r.choice(ids),))
        elif roll < 0.83:
            self.next_id += 1
            db.execute("UPDATE customers SET id = %s WHERE id = %s", (self.next_id, r.choice(ids)))
        else:
            order = r.randint(1, 40)
            with db.transaction():  # two tables, one transaction
                db.execute("DELETE FROM order_lines WHERE order_id = %s", (order,))
                for line in range(1, r.randint(2, 5)):
                    db.execute("INSERT INTO order_lines VALUES (%s, %s, %s, %s, %s)",
                               (order, line, r.choice(ids), Decimal(r.randint(0, 10**7)).scaleb(-3),
                                r.choice([None, "gift", "rush"])))
                db.execute("UPDATE customers SET updated_at = now() WHERE id = %s", (r.choice(ids),))
        self.commits += 1


def _normal(value: Any, zoned: bool) -> Any:
    if isinstance(value, datetime) and (zoned or value.tzinfo is not None):
        return value.astimezone(timezone.utc)  # Spark hands TIMESTAMP back as naive local time
    return bytes(value) if isinstance(value, bytearray) else value


def compare(spark: "SparkSession", app: "DaemonContext", stack: DebeziumStack) -> dict[str, tuple[int, int, int]]:
    """Per table: (PostgreSQL rows, replica rows, keys whose rows differ or exist on one side only)."""
    from lakemirror import tables
    from lakemirror.sinks.events.guard_plan import POSITION_COLUMN

    out = {}
    with stack.connect_sql() as db:
        for table, (key, _) in TABLES.items():
            cur = db.execute(f"SELECT * FROM {table}")
            names = [d.name for d in cur.description]
            want = {tuple(r[names.index(k)] for k in key): {n: _normal(v, n in ZONED) for n, v in zip(names, r)}
                    for r in cur.fetchall()}
            loc = app.catalog.locate(TableName("demo_mirror", "shop", table))
            got: dict[tuple[Any, ...], dict[str, Any]] = {}
            if tables.exists(spark, loc):
                for row in tables.read(spark, loc).drop(POSITION_COLUMN).collect():
                    d = {n: _normal(v, n in ZONED and v is not None) for n, v in row.asDict().items()}
                    got[tuple(d[k] for k in key)] = d
            diff = sum(1 for k in set(want) | set(got) if want.get(k) != got.get(k))
            out[table] = (len(want), len(got), diff)
    return out


def run_debezium_demo(workdir: Path, duration: float | None, http_port: int) -> int:
    from lakemirror.daemon.context import DaemonContext

    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    # PostgreSQL runs as `postgres` when we are root: its folder must be reachable by that user.
    stack_root = Path(tempfile.mkdtemp(prefix="lakemirror-demo-debezium-"))
    stack = DebeziumStack(stack_root)
    print(f"starting PostgreSQL (wal_level=logical), Kafka and Kafka Connect with Debezium under {stack_root}…", flush=True)
    try:
        stack.start()
        writer = PostgresWriter(stack)
        writer.seed()
        stack.register([f"public.{t}" for t in TABLES], name="demo", config={"topic.creation.default.partitions": "3"})
    except StackError as exc:
        stack.stop()
        print(f"demo: {exc} (run scripts/setup.sh first: it installs PostgreSQL and caches the jars)", file=sys.stderr)
        return 1
    try:
        settings = load_settings(None, demo_config(workdir, http_port, stack))
        app = DaemonContext(settings)
        spark = start_spark(app, DEMO_PORT_SETTING)

        def draw(views: "list[TableView]", tty: bool) -> None:
            _draw(views, writer.commits, app.server.url, tty)

        def catch_up(sup: "Supervisor") -> tuple[dict[str, tuple[int, int, int]], int | None]:
            # Caught up: the broker holds nothing the replicas have not taken, and they equal PostgreSQL.
            deadline, result = time.time() + CATCH_UP_SECONDS, compare(spark, app, stack)
            tty = sys.stdout.isatty()
            while time.time() < deadline and (_behind(sup.views()) != 0 or any(d for _, _, d in result.values())):
                for _ in range(6):
                    sup.tick()
                    time.sleep(0.5)
                _draw(sup.views(), writer.commits, app.server.url, tty)
                result = compare(spark, app, stack)
            return result, _behind(sup.views())

        result, behind = run_live(app, writer, draw, duration, catch_up)
        if behind != 0:
            print(f"the replicas had not caught up after {CATCH_UP_SECONDS:.0f} s ({behind} Kafka messages not "
                  f"applied yet: a slow machine, or a stuck stream); the comparison is of replicas still behind")
        ok = behind == 0
        for table, (n_src, n_dst, diff) in result.items():
            verdict = "EQUAL" if diff == 0 else f"DIFFERENT ({diff} keys)"
            ok &= diff == 0
            print(f"  postgres public.{table:<12} {n_src:>5} rows, replica demo_mirror.shop.{table:<12} {n_dst:>5} rows: {verdict}")
        print("replica == PostgreSQL for every table" if ok else "REPLICA DIFFERS FROM POSTGRESQL")
        return 0 if ok else 1
    finally:
        stack.stop()
        shutil.rmtree(stack_root, ignore_errors=True)


def _behind(views: "list[TableView]") -> int | None:
    """Kafka messages the event source has not applied (None before the first lag probe)."""
    return next((v.versions_behind for v in views if v.table.startswith("events:")), None)


def _draw(views: "list[TableView]", commits: int, url: str, tty: bool) -> None:
    rows = [asdict(v) for v in views]
    text = render_table(rows)
    events = render_event_sources(rows)
    header = (f"lakemirror demo: PostgreSQL -> Debezium -> Kafka -> demo_mirror.shop   writer commits: {commits}   "
              f"metrics: {url}/metrics")
    show(header + "\n\n" + text + ("\n\n" + events if events else ""), tty)
