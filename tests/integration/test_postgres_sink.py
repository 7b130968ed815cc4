"""A Delta change feed streamed into a real PostgreSQL: replica == source, row for row.

The pipeline is the real one (supervisor, runner, Structured Streaming, foreachBatch) with
``destination: {kind: postgres}``; the server is the session's (tests/integration/postgres_server.py).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pytest
from psycopg import sql

from lakemirror import tables
from lakemirror.identifiers import quote
from lakemirror.sinks.postgres.types import json_text

pytestmark = pytest.mark.integration

ALL_TYPES = ("id INT NOT NULL, tiny TINYINT, small SMALLINT, big BIGINT, f FLOAT, d DOUBLE, dec DECIMAL(12,3), "
             "s STRING, b BOOLEAN, dt DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, bin BINARY, arr ARRAY<INT>, "
             "m MAP<STRING,INT>, st STRUCT<a: INT, b: STRING>")
ROW_SQL = ("({id}, {id} % 100, {id} * 2, CAST({id} AS BIGINT) * 1000000000, {id} + 0.5, {id} * 0.25, {id} * 1.125, 'row {id}', "
           "{id} % 2 = 0, DATE'2024-01-01' + {id}, TIMESTAMP'2024-03-01 12:00:00 UTC' + make_interval(0,0,0,0,{id}), "
           "TIMESTAMP_NTZ'2024-03-01 08:30:00' + make_interval(0,0,0,{id}), CAST('bin{id}' AS BINARY), "
           "array({id}, {id} + 1), map('k{id}', {id}), named_struct('a', {id}, 'b', 'x{id}'))")
NULL_ROW = "({id}, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"


def _schema() -> str:
    return f"lm_{uuid.uuid4().hex[:10]}"


def _plain(value: Any) -> Any:
    """A value as Spark's collect gives it, in the form Postgres gives it back."""
    if hasattr(value, "asDict"):
        value = value.asDict(recursive=True)
    if isinstance(value, (dict, list)):
        return json.loads(json_text(value))
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.timestamp()
    return value


def _spark_rows(pipeline: Any, table: str, columns: list[str], types: dict[str, str]) -> list[tuple[Any, ...]]:
    df = tables.read(pipeline.spark, pipeline.source(table)).select(*[quote(c) for c in columns])
    out = []
    for r in df.collect():
        row = []
        for c in columns:
            v = r[c]
            if types[c] == "timestamp" and v is not None:
                v = v.timestamp()  # collect gives local wall-clock time: compare instants
            row.append(_plain(v))
        out.append(tuple(row))
    return sorted(out, key=repr)


def _pg_rows(postgres: Any, schema: str, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    rows = postgres.query(sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns), sql.Identifier(schema, table)))
    return sorted((tuple(_plain(v) for v in r) for r in rows), key=repr)


def assert_replica_equals_source(pipeline: Any, postgres: Any, schema: str, table: str) -> None:
    df = tables.read(pipeline.spark, pipeline.source(table))
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    want = _spark_rows(pipeline, table, df.columns, types)
    got = _pg_rows(postgres, schema, table, df.columns)
    assert got == want, (f"{table}: replica differs from source:\n missing {set(want) - set(got)}\n"
                         f" extra {set(got) - set(want)}")


def _pg_pipeline(make_pipeline: Any, postgres: Any, schema: str, **extra: Any) -> Any:
    return make_pipeline(destination=postgres.destination(schema, **extra.pop("destination", {})), **extra)


def test_a_change_feed_streams_into_postgres_row_for_row(make_pipeline, postgres):
    schema = _schema()
    pipeline = _pg_pipeline(make_pipeline, postgres, schema)
    pipeline.create("typed", ALL_TYPES, key="id")
    pipeline.create("items", "order_id BIGINT NOT NULL, line INT NOT NULL, sku STRING, qty INT", key="order_id,line")
    pipeline.sql("typed", "INSERT INTO {t} VALUES " + ", ".join([*(ROW_SQL.format(id=i) for i in range(1, 6)),
                                                               NULL_ROW.format(id=6)]))
    pipeline.sql("items", "INSERT INTO {t} VALUES (1, 1, 'a', 1), (1, 2, NULL, 2), (2, 1, 'c', NULL)")
    pipeline.start()
    pipeline.wait_caught_up("typed", "items")
    assert_replica_equals_source(pipeline, postgres, schema, "typed")
    assert_replica_equals_source(pipeline, postgres, schema, "items")
    # The mapped types, as the server reports them.
    types = dict(postgres.query("SELECT column_name, data_type FROM information_schema.columns WHERE "
                                "table_schema = %s AND table_name = 'typed'", (schema,)))
    assert types == {"id": "integer", "tiny": "smallint", "small": "smallint", "big": "bigint", "f": "real",
                     "d": "double precision", "dec": "numeric", "s": "text", "b": "boolean", "dt": "date",
                     "ts": "timestamp with time zone", "ntz": "timestamp without time zone", "bin": "bytea",
                     "arr": "jsonb", "m": "jsonb", "st": "jsonb", "_lakemirror_position": "bigint"}

    # Inserts, updates (to NULL and back), deletes, a re-insert, while streaming.
    pipeline.sql("typed", "INSERT INTO {t} VALUES " + ", ".join(ROW_SQL.format(id=i) for i in range(7, 10)))
    pipeline.sql("typed", "UPDATE {t} SET s = NULL, arr = array(), dec = -1.5 WHERE id IN (1, 7)")
    pipeline.sql("typed", "UPDATE {t} SET s = 'back', tiny = 7 WHERE id = 6")
    pipeline.sql("typed", "DELETE FROM {t} WHERE id IN (2, 8)")
    pipeline.sql("typed", "INSERT INTO {t} VALUES " + ROW_SQL.format(id=2))
    pipeline.wait_caught_up("typed")
    assert_replica_equals_source(pipeline, postgres, schema, "typed")

    # Several versions of the same keys in one batch: they pile up while the daemon is down.
    pipeline.stop()
    pipeline.sql("items", "DELETE FROM {t} WHERE order_id = 1 AND line = 1")
    pipeline.sql("items", "INSERT INTO {t} VALUES (1, 1, 'a-again', 7)")
    pipeline.sql("items", "UPDATE {t} SET sku = NULL, qty = qty + 1 WHERE order_id = 1 AND line = 2")
    pipeline.sql("items", "INSERT INTO {t} VALUES (2, 2, NULL, NULL)")
    pipeline.sql("items", "DELETE FROM {t} WHERE order_id = 2 AND line = 1")
    pipeline.sql("items", "INSERT INTO {t} VALUES (2, 1, 'c2', 3)")
    pipeline.sql("items", "UPDATE {t} SET qty = 100 WHERE order_id = 2 AND line = 1")
    pipeline.sql("items", "DELETE FROM {t} WHERE order_id = 2 AND line = 2")
    pipeline.restart()
    pipeline.wait_caught_up("typed", "items")
    assert_replica_equals_source(pipeline, postgres, schema, "items")
    batches = postgres.query("SELECT first_version, last_version FROM " + schema + ".lakemirror_progress "
                             "WHERE table_name = 'items' AND batch_id >= 0 ORDER BY batch_id")
    assert any(last - first >= 7 for first, last in batches), f"the pending versions came in one batch: {batches}"

    # An added source column becomes ALTER TABLE … ADD COLUMN on the replica.
    pipeline.sql("items", "ALTER TABLE {t} ADD COLUMNS (note STRING, price DECIMAL(8,2))")
    pipeline.sql("items", "INSERT INTO {t} VALUES (3, 1, 'z', 1, 'new', 9.99)")
    pipeline.sql("items", "UPDATE {t} SET note = 'seen' WHERE order_id = 1")
    pipeline.wait_caught_up("items")
    assert_replica_equals_source(pipeline, postgres, schema, "items")
    columns = [r[0] for r in postgres.query("SELECT column_name FROM information_schema.columns WHERE "
                                            "table_schema = %s AND table_name = 'items' ORDER BY ordinal_position",
                                            (schema,))]
    assert columns == ["order_id", "line", "sku", "qty", "_lakemirror_position", "note", "price"]
    assert pipeline.views()["items"].state == "running"


def test_postgres_restarted_mid_stream_loses_nothing(make_pipeline, postgres):
    if not postgres.restartable:
        pytest.skip("restarting the server needs the script-managed PostgreSQL (no Docker here)")
    schema = _schema()
    pipeline = _pg_pipeline(make_pipeline, postgres, schema, destination={"retry_seconds": 120})
    pipeline.create("r", "id BIGINT NOT NULL, n BIGINT", key="id")
    pipeline.sql("r", "INSERT INTO {t} SELECT id, 0 FROM range(0, 100)")
    pipeline.start()
    pipeline.wait_caught_up("r")
    postgres.stop()
    try:
        for i in range(1, 4):
            pipeline.sql("r", f"UPDATE {{t}} SET n = n + 1 WHERE id % {i + 1} = 0")
            pipeline.sql("r", f"INSERT INTO {{t}} VALUES ({100 + i}, {i})")
        pipeline.sql("r", "DELETE FROM {t} WHERE id < 10")
        # An outage shorter than retry_seconds: the batch retries its connection meanwhile, and the
        # table says so (not `running` with no error), with its lag growing.
        pipeline.tick_until(lambda: pipeline.views()["r"].state == "degraded", 60, "the table to notice")
        view = pipeline.views()["r"]
        assert "waiting for PostgreSQL: cannot reach the server" in (view.last_error or "") and view.retries == 0, view
        pipeline.tick_until(lambda: (pipeline.views()["r"].lag_seconds or 0) > 0, 30, "the lag to grow")
    finally:
        postgres.start()
    pipeline.sql("r", "UPDATE {t} SET n = n + 10 WHERE id = 50")
    pipeline.wait_caught_up("r")
    assert pipeline.views()["r"].retries == 0 and pipeline.views()["r"].last_error is None, "the batch went on by itself"
    assert_replica_equals_source(pipeline, postgres, schema, "r")
    # Every version applied exactly once: the applied batches' version ranges do not overlap.
    ranges = postgres.query(f"SELECT first_version, last_version FROM {schema}.lakemirror_progress "
                            "WHERE table_name = 'r' AND batch_id >= 0 ORDER BY first_version")
    for (_, last), (first, _) in zip(ranges, ranges[1:]):
        assert first > last, ranges


def test_a_row_postgres_refuses_goes_to_the_dead_letters_and_the_stream_goes_on(make_pipeline, postgres):
    schema = _schema()
    pipeline = _pg_pipeline(make_pipeline, postgres, schema)
    pipeline.create("q", "id BIGINT NOT NULL, qty INT, s STRING", key="id")
    pipeline.sql("q", "INSERT INTO {t} VALUES (1, 1, 'a'), (2, 2, 'b')")
    pipeline.start()
    pipeline.wait_caught_up("q")
    postgres.execute(f"ALTER TABLE {schema}.q ADD CONSTRAINT qty_positive CHECK (qty >= 0)")
    pipeline.sql("q", "INSERT INTO {t} VALUES (3, -5, 'refused'), (4, 4, 'fine'), (5, 5, concat('nul', char(0)))")
    pipeline.sql("q", "UPDATE {t} SET qty = 10 WHERE id = 1")
    pipeline.wait_caught_up("q")
    rows = postgres.query(f"SELECT id, qty, s FROM {schema}.q ORDER BY id")
    assert rows == [(1, 10, "a"), (2, 2, "b"), (4, 4, "fine")]
    dead = postgres.query(f"SELECT table_name, op, reason, row FROM {schema}.lakemirror_dead_letters ORDER BY id")
    assert [(d[0], d[1], d[3]["id"]) for d in dead] == [("q", "upsert", 3), ("q", "upsert", 5)]
    assert "qty_positive" in dead[0][2] and "[23514]" in dead[0][2]
    assert dead[0][3] == {"id": 3, "qty": -5, "s": "refused"}
    assert "0x00" in dead[1][2]
    assert pipeline.views()["q"].state == "running"
    pipeline.sql("q", "INSERT INTO {t} VALUES (6, 6, 'after')")
    pipeline.wait_caught_up("q")
    assert (6, 6, "after") in postgres.query(f"SELECT id, qty, s FROM {schema}.q")


def test_an_unreachable_server_degrades_the_table_with_one_clear_message(make_pipeline, postgres):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    pipeline = make_pipeline(destination={**postgres.destination("x"), "port": closed_port, "retry_seconds": 0,
                                          "connect_timeout_seconds": 2})
    pipeline.create("u", "id BIGINT NOT NULL", key="id")
    pipeline.sql("u", "INSERT INTO {t} VALUES (1)")
    pipeline.start()
    pipeline.tick_until(lambda: pipeline.views()["u"].state == "degraded", 60, "the table to degrade")
    error = pipeline.views()["u"].last_error or ""
    assert f"127.0.0.1:{closed_port}" in error and "cannot reach the server" in error, error
    assert "Traceback" not in error and len(error.splitlines()) == 1


def test_a_replayed_batch_is_skipped_and_a_late_older_change_moves_nothing(spark, postgres):
    """The batch sink straight from Spark DataFrames, as foreachBatch calls it."""
    from lakemirror.schema import Column
    from lakemirror.sinks.merge.planner import plan_merge
    from lakemirror.sinks.postgres.executor import Connector, PostgresTarget
    from lakemirror.sinks.postgres.spark_batches import PostgresTable
    from lakemirror.sinks.txn import TxnId

    schema = _schema()
    target = PostgresTarget(postgres.host, postgres.port, postgres.database, schema, postgres.user, postgres.password)
    plan = plan_merge([Column("id", "bigint", False), Column("v", "string")], ["id"])
    table = PostgresTable(Connector(target), "replay-test", "kv", "src.sales.kv")
    table.prepare(plan, True)
    table.bootstrap(plan, spark.sql("SELECT CAST(id AS BIGINT) id, 'v0' v FROM range(1, 4)"), version=2, epoch=1)
    sink = table.batch_sink(plan, epoch=1)

    def batch(rows: str) -> Any:
        return spark.sql("SELECT CAST(id AS BIGINT) id, v, _change_type, CAST(_commit_version AS BIGINT) "
                         "_commit_version, TIMESTAMP'2024-01-01' _commit_timestamp FROM VALUES " + rows +
                         " AS c(id, v, _change_type, _commit_version)")

    def replica() -> list[tuple[Any, ...]]:
        return postgres.query(f"SELECT id, v FROM {schema}.kv ORDER BY id")

    first = sink.apply(batch("(1, 'a5', 'update_postimage', 5), (1, 'a4', 'update_preimage', 5), "
                             "(2, NULL, 'delete', 5), (4, 'd5', 'insert', 5)"), TxnId("a", 0))
    assert not first.replayed and (first.counts.inserted, first.counts.updated, first.counts.deleted) == (1, 1, 1)
    assert replica() == [(1, "a5"), (3, "v0"), (4, "d5")]
    again = sink.apply(batch("(1, 'WRONG', 'update_postimage', 5)"), TxnId("a", 0))
    assert again.replayed and again.counts == first.counts and replica() == [(1, "a5"), (3, "v0"), (4, "d5")]
    late = sink.apply(batch("(1, 'a3', 'update_postimage', 3), (2, 'b4', 'insert', 4), (3, 'c1', 'insert', 1)"),
                      TxnId("a", 1))
    assert not late.replayed and late.counts.total == 0
    assert replica() == [(1, "a5"), (3, "v0"), (4, "d5")], "an older change moved a row or resurrected a key"
    assert table.replica(plan).last_applied(1) == 5


NESTED = ("id INT NOT NULL, m MAP<STRING, INT>, mi MAP<INT, STRING>, am ARRAY<MAP<STRING, INT>>, "
          "st STRUCT<n: INT, m: MAP<STRING, STRING>, a: ARRAY<INT>>, ma MAP<STRING, ARRAY<MAP<STRING, INT>>>")
NESTED_ROWS = {
    1: ("map()", "map()", "array(map(), map('k', 1))", "named_struct('n', 1, 'm', map(), 'a', array())",
        "map('e', array(map()))"),
    2: ("NULL", "NULL", "NULL", "NULL", "NULL"),
    3: ("map('a', 1)", "map(1, 'x')", "array()", "named_struct('n', NULL, 'm', map('a', 'b'), 'a', NULL)",
        "map('n', NULL)"),
}
NESTED_JSON = {
    1: {"m": {}, "mi": [], "am": [{}, {"k": 1}], "st": {"n": 1, "m": {}, "a": []}, "ma": {"e": [{}]}},
    2: {"m": None, "mi": None, "am": None, "st": None, "ma": None},
    3: {"m": {"a": 1}, "mi": [[1, "x"]], "am": [], "st": {"n": None, "m": {"a": "b"}, "a": None}, "ma": {"n": None}},
}


def _nested_insert(ids: Any) -> str:
    return "INSERT INTO {t} VALUES " + ", ".join(f"({i}, {', '.join(NESTED_ROWS[i])})" for i in ids)


def _nested_replica(postgres: Any, schema: str, table: str) -> dict[int, dict[str, Any]]:
    rows = postgres.query(f'SELECT id, m, mi, am, st, ma FROM "{schema}".{table}')
    return {r[0]: dict(zip(("m", "mi", "am", "st", "ma"), r[1:])) for r in rows}


def test_nested_values_keep_their_type_s_json_shape_in_bootstrap_stream_and_cycles(make_pipeline, postgres):
    """An empty map<string,…> is {} (not []) wherever it is, and a map of other keys [key, value]
    pairs: in a bootstrap's snapshot, a stream's batch and a triggered table's cycles."""
    from tests.integration.test_postgres_cycles import _cycle

    schema = _schema()
    pipeline = _pg_pipeline(make_pipeline, postgres, schema, tables=["n", "c"], destination={
        "table_modes": {"c": "triggered"}, "every_seconds": 3600, "snapshot_above_fraction": 100})
    for table in ("n", "c"):
        pipeline.create(table, NESTED, key="id")
        pipeline.sql(table, _nested_insert([1, 2]))
    pipeline.start()
    pipeline.wait_caught_up("n")                     # the bootstrap's snapshot
    assert _nested_replica(postgres, schema, "n") == {i: NESTED_JSON[i] for i in (1, 2)}
    assert _cycle(pipeline, 1)["c"]["action"] == "snapshot"
    assert _nested_replica(postgres, schema, "c") == {i: NESTED_JSON[i] for i in (1, 2)}

    for table in ("n", "c"):                         # a stream's batch, a cycle's incremental batch
        pipeline.sql(table, _nested_insert([3]))
        pipeline.sql(table, "UPDATE {t} SET m = map(), mi = map(), am = array(map()) WHERE id = 2")
    pipeline.wait_caught_up("n")
    assert _cycle(pipeline, 2)["c"]["action"] == "incremental"
    want = {**NESTED_JSON, 2: {**NESTED_JSON[2], "m": {}, "mi": [], "am": [{}]}}
    assert _nested_replica(postgres, schema, "n") == want
    assert _nested_replica(postgres, schema, "c") == want


def test_a_column_postgres_cannot_hold_stops_the_table_at_once_naming_it(make_pipeline, postgres):
    """A variant column: the streamed table goes ``failed`` without retries, and a triggered
    table's cycle fails on its first attempt, each naming the column and how to exclude it."""
    from lakemirror.daemon.settings.runtime_spec import jobs_for

    pipeline = _pg_pipeline(make_pipeline, postgres, _schema(), tables=["va", "vc"], destination={
        "table_modes": {"vc": "triggered"}, "every_seconds": 3600})
    for table in ("va", "vc"):
        pipeline.create(table, "id BIGINT NOT NULL, payload VARIANT", key="id")
        pipeline.sql(table, "INSERT INTO {t} SELECT 1, parse_json('[1, 2]')")
    pipeline.start()
    pipeline.tick_until(lambda: pipeline.views()["va"].state == "failed", 60, "the table to fail")
    view = pipeline.views()["va"]
    assert view.retries == 0 and "'payload' (variant)" in (view.last_error or ""), view
    assert "exclude_columns: [payload]" in (view.last_error or "") and "Traceback" not in (view.last_error or "")
    app = pipeline.app
    [task] = app.subtasks.subtasks.values()
    [outcome] = app.run_subtask("run-vc", jobs_for(task, app.spec, app.tables_of(task))).summary.outcomes
    assert outcome.status == "failed" and outcome.attempts == 1, outcome
    assert "'payload' (variant)" in (outcome.error or "")


def test_a_table_waiting_for_a_lock_shows_it_and_holds_no_other_table_back(make_pipeline, postgres):
    """One apply worker (the default), two tables; a session holds a lock on one replica. That table
    shows ``degraded`` with the lock and its holder, and its lag grows, while the other table's
    changes keep arriving; once the lock is released it catches up and runs again."""
    schema = _schema()
    pipeline = _pg_pipeline(make_pipeline, postgres, schema, tables=["la", "lb"],
                            destination={"statement_timeout_seconds": 600})
    assert pipeline.settings.effective_apply_workers == 1
    for table in ("la", "lb"):
        pipeline.create(table, "id BIGINT NOT NULL, n BIGINT", key="id")
        pipeline.sql(table, "INSERT INTO {t} VALUES (1, 0)")
    pipeline.start()
    pipeline.wait_caught_up("la", "lb")
    with postgres.connect() as holder:
        holder.execute("SET application_name = 'lock-holder'")
        holder.execute("BEGIN")
        holder.execute(f'LOCK TABLE "{schema}".la IN ACCESS EXCLUSIVE MODE')
        pipeline.sql("la", "UPDATE {t} SET n = 1")
        pipeline.tick_until(lambda: pipeline.views()["la"].state == "degraded", 90, "the lock wait to show")
        error = pipeline.views()["la"].last_error or ""
        assert "waiting for a lock" in error and "lock-holder" in error and "statement_timeout_seconds" in error, error
        pipeline.sql("lb", "UPDATE {t} SET n = 1")   # the other table goes on meanwhile, on the one worker
        pipeline.wait_caught_up("lb")
        assert postgres.query(f'SELECT n FROM "{schema}".lb') == [(1,)]
        pipeline.tick_until(lambda: (pipeline.views()["la"].lag_seconds or 0) > 0, 30, "the lag to grow")
        view = pipeline.views()["la"]
        assert view.state == "degraded" and view.versions_behind, view
        assert "waiting for a lock" in (view.last_error or ""), "still the wait, not a failure"
        holder.execute("ROLLBACK")
    pipeline.wait_caught_up("la")
    assert pipeline.views()["la"].last_error is None
    assert postgres.query(f'SELECT n FROM "{schema}".la') == [(1,)]
