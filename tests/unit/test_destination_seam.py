"""The acceptance test of the destination seam, without Spark: the in-memory twins are a registered
destination kind (:data:`lakemirror.daemon.destinations.DESTINATIONS`), and the composition root
drives them through exactly the path Delta and PostgreSQL take: the same supervisor factories, the
same runner classes, the same ``source_for`` / ``replica_for`` / ``event_sink_for`` factories.

A change-feed table is prepared (its snapshot bootstrapped into the replica) and takes two
micro-batches, one of them replayed; an event source takes a micro-batch with a poison message, and
the same batch again. Nothing here names a twin to a runner: the runners get them from the registry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from lakemirror.checkpoints.records import InMemoryCheckpointStore
from lakemirror.daemon.context import DaemonContext
from lakemirror.daemon.destinations import DESTINATIONS, MemoryDestination
from lakemirror.daemon.settings import load_settings
from lakemirror.identifiers import TableName
from lakemirror.schema import Column
from lakemirror.sinks.memory import MemoryTableReplica
from lakemirror.sinks.txn import TxnId, txn_app_id
from lakemirror.sources.event_stream import FILE_COLUMN, VALUE_COLUMN
from lakemirror.sources.memory import MemoryChangeSource
from lakemirror.supervisor.change_feed.table_runner import BatchReport, TableRunner
from lakemirror.supervisor.events.stream_runner import EventBatchReport, EventStreamRunner


class NoSpark:
    """The session: the twins never touch it."""

    def newSession(self) -> "NoSpark":
        return self


def context(tmp_path: Path, extra: str = "") -> DaemonContext:
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"source_catalog: src\ndestination_catalog: dst\nschema_name: shop\ntables: [orders]\n"
                    f"checkpoint_volume: {tmp_path / 'ck'}\nruntime: {{mode: local, warehouse: {tmp_path / 'lake'}}}\n"
                    + extra)
    ctx = DaemonContext(load_settings(path)).replace(spark=NoSpark(), checkpoints=InMemoryCheckpointStore())
    return ctx.replace(destination=DESTINATIONS["memory"](ctx))


def test_a_change_feed_table_runs_through_the_registry_with_the_memory_kind(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    memory = ctx.destination
    assert isinstance(memory, MemoryDestination) and memory.kind == "memory" and memory.cycles is None
    columns = (Column("id", "bigint", False), Column("v", "string"))
    source = memory.sources["orders"] = MemoryChangeSource(
        ctx.catalog.locate(TableName("src", "shop", "orders")), columns, ("id",))
    source.commit([{"_change_type": "insert", "id": 1, "v": "a"}, {"_change_type": "insert", "id": 2, "v": "b"}])

    runner = ctx.supervisor._factory("orders")   # the supervisor's factory, as the daemon starts a table
    assert isinstance(runner, TableRunner) and runner.change_source is source
    prepared = runner.prepare()
    replica = memory.replicas["orders"]
    assert runner.replica is replica and isinstance(replica, MemoryTableReplica)
    assert replica.bootstraps == [(1, 1)] and replica.replica is not None and set(replica.replica.rows) == {(1,), (2,)}

    source.commit([{"_change_type": "update_preimage", "id": 1, "v": "a"},
                   {"_change_type": "update_postimage", "id": 1, "v": "A"},
                   {"_change_type": "delete", "id": 2, "v": None}, {"_change_type": "insert", "id": 3, "v": "c"}])
    epoch = prepared.progress.epoch
    sink = runner.replica.batch_sink(prepared.plan, epoch)
    txn = TxnId(txn_app_id(ctx.spec.pipeline_id, runner.slug, epoch), 0)
    batch = source.changes(1)
    runner._apply_batch(sink, txn, batch, epoch, prepared.progress.source_table_id)
    runner._apply_batch(sink, txn, batch, epoch, prepared.progress.source_table_id)  # replayed after a crash
    assert sorted(replica.replica.rows.values(), key=lambda r: r["id"]) == source.snapshot(2)
    reports = [e for e in runner.poll() if isinstance(e, BatchReport)]
    assert [r.outcome.replayed for r in reports] == [False, True] and runner.applied_through == 2
    assert [r.batch_id for r in ctx.checkpoints.rows] == [0]  # type: ignore[attr-defined]


def simple(table: str, op: str, key: int, ts: int, **columns: Any) -> str:
    doc: dict[str, Any] = {"table_name": table, "operation": op, "timestamp": ts, "transaction_id": f"t{ts}",
                           "primary_key": {"id": key}}
    doc["after" if op != "DELETE" else "before"] = {"id": key, **columns}
    return json.dumps(doc)


class Frame:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def collect(self) -> list[dict[str, Any]]:
        return self.rows


def test_an_event_source_runs_through_the_registry_with_the_memory_kind(tmp_path: Path) -> None:
    (tmp_path / "inbox").mkdir()
    ctx = context(tmp_path, f"source: {{kind: files, format: simple, path: {tmp_path / 'inbox'}}}\n")
    memory = ctx.destination
    assert isinstance(memory, MemoryDestination)

    runner = ctx.event_source_supervisor._factory("events:events")   # as the daemon starts the source
    assert isinstance(runner, EventStreamRunner)
    runner._epoch = "e1"
    lines = [simple("orders", "INSERT", 1, 10, amount=5), simple("orders", "INSERT", 2, 11, amount=7),
             simple("orders", "DELETE", 1, 12), "not json"]
    frame = Frame([{FILE_COLUMN: "/inbox/a.jsonl", VALUE_COLUMN: "\n".join(lines)}])
    runner._batch(frame, 0)  # type: ignore[arg-type]
    runner._batch(frame, 0)  # type: ignore[arg-type]  # replayed after a crash
    store = memory.events["events"]
    assert set(store.replicas["orders"].replica.live()) == {(2,)}
    assert [letter.raw.offset for letter in store.dead_letters.letters(None)] == [4]
    first, again = [e for e in runner.poll() if isinstance(e, EventBatchReport)]
    assert (first.outcome.counts.inserted, first.dead_letters) == (1, 1) and not first.outcome.replayed
    assert again.outcome.replayed and again.dead_letters == 0 and runner.dead_letter_count == 1
    assert runner.dead_letters(timeout=5) and runner.keeps_dead_letters_in_delta


POSTGRES = "destination: {kind: postgres, host: h, database: d, schema: r, user: u, max_connections: 5}\n"


def postgres_context(tmp_path: Path, extra: str = "") -> DaemonContext:
    path = tmp_path / "pipeline.yaml"
    path.write_text(f"source_catalog: src\ndestination_catalog: dst\nschema_name: shop\ntables: [orders, archive]\n"
                    f"checkpoint_volume: {tmp_path / 'ck'}\nruntime: {{mode: local, warehouse: {tmp_path / 'lake'}}}\n"
                    + POSTGRES + extra)
    return DaemonContext(load_settings(path)).replace(spark=NoSpark(), checkpoints=InMemoryCheckpointStore())


def test_the_postgres_kind_is_built_by_its_package_through_the_registry(tmp_path: Path) -> None:
    """The registry's one line: the package's factory gives the replicas (on one pool of connections),
    the words and the cycles; the tables' changes are their Delta change feeds, as for Delta."""
    from lakemirror.sinks.postgres.spark_batches import PostgresTable
    from lakemirror.sources.delta_source import DeltaChangeFeed

    ctx = postgres_context(tmp_path)
    pg = ctx.destination
    assert pg.kind == "postgres" and pg.cycles is None and pg.feed_letter_store is None
    assert pg.reason == ("destination kind postgres: postgres://u@h:5432/d (schema r), COPY and a guarded upsert "
                         "per micro-batch")
    assert pg.letters_elsewhere == ("PostgreSQL replicas: their dead letters are rows of lakemirror_dead_letters in "
                                    "PostgreSQL schema r (docs/postgres.md)")
    orders, archive = pg.replica_for("orders", NoSpark()), pg.replica_for("archive", NoSpark())
    assert isinstance(orders, PostgresTable) and isinstance(archive, PostgresTable)
    assert (orders.name, orders.label, orders.pipeline_id) == ("orders", "src.shop.orders", ctx.spec.pipeline_id)
    assert orders.connector is archive.connector and orders.connector.target.pool_connections == 5
    assert isinstance(pg.source_for("orders", NoSpark()), DeltaChangeFeed)
    assert ctx.settings.destination.letters_elsewhere() == pg.letters_elsewhere  # the CLI's words are the same


def test_the_postgres_kind_has_cycles_when_a_table_is_triggered(tmp_path: Path) -> None:
    postgres_context(tmp_path)
    path = tmp_path / "pipeline.yaml"
    path.write_text(path.read_text().replace("max_connections: 5}", "max_connections: 5, table_modes: "
                                             "{archive: triggered}, every_seconds: 60}"))
    ctx = DaemonContext(load_settings(path)).replace(spark=NoSpark(), checkpoints=InMemoryCheckpointStore())
    assert ctx.destination.cycles is not None
    assert list(ctx.subtasks.subtasks) == ["postgres-triggered"]
    assert ctx.tables_of(ctx.subtasks.subtasks["postgres-triggered"])() == ["archive"]
    assert ctx.list_tables() == ["orders"]


def test_an_event_source_s_postgres_replicas_leave_real_time_tasks_their_connections(tmp_path: Path) -> None:
    """Real-Time Mode's tasks hold one connection each: the daemon's pool is what they leave."""
    from lakemirror.sinks.postgres.event_replicas import PostgresEventReplicas
    from lakemirror.supervisor.events.stream_spec import EventStreamSpec

    ctx = postgres_context(tmp_path, "source: {kind: kafka, bootstrap_servers: 'k:9092', topics: [t], "
                                     "real_time: {max_dwell_ms: 50, tasks: 3}}\n")
    sink = ctx.destination.event_sink_for(EventStreamSpec("events", "kafka", tables=("orders",)), lambda raw: raw)
    assert isinstance(sink, PostgresEventReplicas)
    assert sink.real_time is not None and (sink.real_time.max_dwell_ms, sink.real_time.tasks) == (50, 3)
    assert sink.target.pool_connections == 2 and sink.calls.label == "events:events"


def test_neither_the_settings_nor_the_registry_load_the_postgres_package() -> None:
    """A daemon writing Delta replicas never imports PostgreSQL's package nor its client library."""
    code = ("import sys, lakemirror.daemon.settings, lakemirror.daemon.destinations, lakemirror.daemon.context\n"
            "print(sorted(m for m in sys.modules if m == 'psycopg' or m.startswith('lakemirror.sinks.postgres.')"
            " and m != 'lakemirror.sinks.postgres.modes'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
