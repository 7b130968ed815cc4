"""Triggered and snapshot PostgreSQL replicas against a real server: the atomic snapshot swap with
readers running, and the cycles of the daemon's sub-task (a Delta source on the session's Spark),
choosing incremental or snapshot by the measured change fraction. Replica == source after each."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest

from lakemirror.daemon.settings.runtime_spec import jobs_for
from lakemirror.schema import Column
from lakemirror.sinks.postgres.executor import Connector, PostgresReplica, PostgresTarget
from lakemirror.sinks.postgres.modes import cycle_batch_id
from lakemirror.sinks.postgres.plan import ReplicaTable
from tests.integration.test_postgres_sink import assert_replica_equals_source

pytestmark = pytest.mark.integration

COLUMNS = (Column("id", "bigint", False), Column("v", "string"))


def _schema() -> str:
    return f"lm_{uuid.uuid4().hex[:10]}"


def _generation(tag: str, rows: int) -> pa.Table:
    return pa.table({"id": pa.array(range(rows), pa.int64()), "v": [tag] * rows})


def test_readers_see_the_old_table_or_the_new_one_never_an_empty_or_half_loaded_one(postgres):
    schema = _schema()
    target = PostgresTarget(postgres.host, postgres.port, postgres.database, schema, postgres.user, postgres.password)
    swapped, release = threading.Event(), threading.Event()

    def hold_the_swap(point: str) -> None:
        if point == "postgres_refresh_swapped" and not release.is_set():
            swapped.set()     # renamed, not committed: the old table's lock is held
            release.wait(10)

    replica = PostgresReplica(Connector(target), "modes-test", ReplicaTable(schema, "t", ("id",), COLUMNS),
                              fault=hold_the_swap)
    sizes = {"g0": 3000, "g1": 2000, "g2": 5000, "g3": 1000, "g4": 4000}
    release.set()
    replica.bootstrap(_generation("g0", sizes["g0"]), version=0, epoch=1)

    seen: list[tuple[int, int, str | None]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            with postgres.connect() as conn:
                while not stop.is_set():
                    seen.append(conn.execute(f'SELECT count(*), count(DISTINCT v), min(v) FROM "{schema}".t').fetchone())
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for r in readers:
        r.start()
    try:
        for version, tag in enumerate(("g1", "g2", "g3", "g4"), start=1):
            replica.refresh(_generation(tag, sizes[tag]), version, 1, cycle_batch_id(version))
            assert postgres.query(f'SELECT count(*) FROM "{schema}".t') == [(sizes[tag],)]
    finally:
        stop.set()
        for r in readers:
            r.join(30)
    assert not errors, errors
    assert len(seen) > 20, "the readers ran during the refreshes"
    for count, distinct, tag in seen:
        assert distinct == 1 and tag in sizes and count == sizes[tag], (count, distinct, tag)
    assert {t for _, _, t in seen} >= {"g1", "g4"}

    # A reader that arrives while the swap holds the lock waits, then reads the new table whole.
    release.clear()
    swapping = threading.Thread(target=replica.refresh, args=(_generation("g5", 2500), 5, 1, cycle_batch_id(5)))
    swapping.start()
    assert swapped.wait(30)
    answer: list[Any] = []
    blocked = threading.Thread(target=lambda: answer.append(postgres.query(
        f'SELECT count(*), count(DISTINCT v), min(v) FROM "{schema}".t')[0]))
    blocked.start()
    time.sleep(0.5)
    assert blocked.is_alive(), "the reader waits for the swap's lock"
    release.set()
    swapping.join(30)
    blocked.join(30)
    assert answer == [(2500, 1, "g5")]

    left = postgres.query("SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                          "WHERE n.nspname = %s AND relkind = 'r' ORDER BY relname", (schema,))
    assert [r[0] for r in left] == ["lakemirror_dead_letters", "lakemirror_progress", "t", "t__lm_tombstones"]
    pk = postgres.query("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
                        (f'"{schema}".t',))
    assert pk == [("t__lm_pk",)]
    # The same refresh again (a crash before its state was saved) is found by its progress row.
    assert replica.refresh(_generation("WRONG", 10), 5, 1, cycle_batch_id(5)) == 0
    assert postgres.query(f'SELECT count(*), min(v) FROM "{schema}".t') == [(2500, "g5")]


def _cycle(pipeline: Any, run: int) -> dict[str, dict[str, Any]]:
    """Run every cycle sub-task once, as the scheduler would; the outcome details by table."""
    app = pipeline.app
    out: dict[str, dict[str, Any]] = {}
    for task in app.subtasks.subtasks.values():
        result = app.run_subtask(f"run-{run}-{task.name}", jobs_for(task, app.spec, app.tables_of(task)))
        for o in result.summary.outcomes:
            assert o.status == "success", o.error
            out[o.job.source.table] = dict(o.details)
    return out


def test_triggered_and_snapshot_cycles_keep_replicas_equal_to_their_sources(make_pipeline, postgres):
    schema = _schema()
    pipeline = make_pipeline(tables=["t", "s", "c"], destination=postgres.destination(
        schema, mode="triggered", table_modes={"s": "snapshot", "c": "continuous"}, every_seconds=3600,
        snapshot_above_fraction=0.2))
    app = pipeline.app
    assert app.list_tables() == ["c"]  # the stream takes the continuous table only
    assert sorted(app.subtasks.subtasks) == ["postgres-snapshot", "postgres-triggered"]
    pipeline.create("t", "id BIGINT NOT NULL, v STRING", key="id")
    pipeline.create("s", "id BIGINT NOT NULL, v STRING", key="id", cdf=False)  # snapshot mode needs no change feed
    pipeline.sql("t", "INSERT INTO {t} SELECT id, concat('v', id) FROM range(0, 100)")
    pipeline.sql("s", "INSERT INTO {t} SELECT id, 'a' FROM range(0, 10)")

    first = _cycle(pipeline, 1)
    assert (first["t"]["action"], first["t"]["rows_loaded"], first["s"]["action"]) == ("snapshot", 100, "snapshot")
    assert_replica_equals_source(pipeline, postgres, schema, "t")
    assert_replica_equals_source(pipeline, postgres, schema, "s")

    pipeline.sql("t", "UPDATE {t} SET v = 'changed' WHERE id IN (1, 2)")
    pipeline.sql("t", "DELETE FROM {t} WHERE id = 3")
    pipeline.sql("t", "INSERT INTO {t} VALUES (500, 'new')")
    second = _cycle(pipeline, 2)
    assert second["t"]["action"] == "incremental", second["t"]
    assert second["t"]["fraction"] == pytest.approx(4 / 100)
    assert (second["t"]["rows_inserted"], second["t"]["rows_updated"], second["t"]["rows_deleted"]) == (1, 2, 1)
    assert second["s"]["action"] == "nothing"
    assert_replica_equals_source(pipeline, postgres, schema, "t")

    pipeline.sql("t", "UPDATE {t} SET v = 'bulk' WHERE id < 60")
    pipeline.sql("s", "DELETE FROM {t} WHERE id < 5")
    pipeline.sql("s", "INSERT INTO {t} VALUES (77, 'b')")
    third = _cycle(pipeline, 3)
    assert third["t"]["action"] == "snapshot" and third["t"]["fraction"] == pytest.approx(59 / 100), third["t"]
    assert third["s"]["action"] == "snapshot"
    assert_replica_equals_source(pipeline, postgres, schema, "t")
    assert_replica_equals_source(pipeline, postgres, schema, "s")

    assert _cycle(pipeline, 4)["t"]["action"] == "nothing"
    head = pipeline.latest_version("t")
    progress = postgres.query(f"SELECT batch_id, last_version FROM {schema}.lakemirror_progress WHERE table_name = 't' "
                              "ORDER BY last_version")
    assert progress[-1] == (cycle_batch_id(head), head) and all(b < -1 for b, _ in progress)
    # A stream switched on for the table starts after the version the cycles reached, in their epoch.
    state = app.states.load(pipeline.source("t").name.slug)
    assert (state.bootstrapped, state.bootstrap_version) == (True, head)


def test_a_triggered_table_without_a_change_feed_fails_its_cycle_with_what_to_run(make_pipeline, postgres):
    pipeline = make_pipeline(tables=["n"], destination=postgres.destination(_schema(), mode="triggered",
                                                                          every_seconds=3600))
    pipeline.create("n", "id BIGINT NOT NULL, v STRING", key="id", cdf=False)
    pipeline.sql("n", "INSERT INTO {t} VALUES (1, 'a')")
    app = pipeline.app
    [task] = app.subtasks.subtasks.values()
    [outcome] = app.run_subtask("run-n", jobs_for(task, app.spec, app.tables_of(task))).summary.outcomes
    assert outcome.status == "failed" and outcome.attempts == 1  # a cause a person must fix: not retried
    assert "delta.enableChangeDataFeed" in (outcome.error or "") and "mode snapshot" in (outcome.error or "")
    assert "Traceback" not in (outcome.error or "")
